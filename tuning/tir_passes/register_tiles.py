"""A TIR pass that keeps register tiles (accumulators) where LLVM can hold them
in registers: on the stack at any size, and one copy per loop partition where
TVM's StorageRewrite made the partitions share one.

On the stack: TVM's LowerTVMBuiltin keeps a "global" tile of constant size
on the stack only under 1 KiB, and turns a larger one into a workspace call.
AVX-512's register tiles reach 1.5 KiB (8 x 48 floats). A workspace pointer
comes from a call, so LLVM must assume that a prefetch of the weight
(prefetch_panel) may read the tile, and it stored all 24 accumulators to
memory every 4 k steps. The cold QKV kernel `m8_n48_k128_t1_ki_p_rall` ran
at 212 / 219 GFLOP/s at M = 62 / 128; with its tile on the stack, 287 / 301
(Emerald Rapids, 2 threads, 48 cycled 7 MB weights). Tiles up to the largest
register file (REGISTER_FILE_BYTES) are taken for register tiles:
accumulate_locally makes its one-register-tile accumulators "global" (a dense
kernel's copied weight panel is "global" too, but larger except at tiny K).

Private copies: LoopPartition copies a kernel's row-tile loop into the full
tiles and the remainders, each with its own accumulator; StorageRewrite then merges
the copies into one stack array (their lifetimes do not overlap). LLVM keeps
a stack array in registers only where every access has a constant index, and
a remainder's write-back indexes the accumulator by a loop of variable trip
count, so the merged array stayed in memory for the full tiles too: their
write-back reloaded each row just stored, partly (a 16-byte piece of a
64-byte store), a store-forwarding stall per row tile. Batch matmul NT's
symbolic kernels spent 19% of their time there and ran 1.2x their static
builds' time (`m4_n16_k32_t1_ko_b`, T = 100-119, one thread; a static build
at those T has no variable trip counts). With its own copy, the full tiles'
accumulator lives in registers; a remainder's copy stays in memory, as it did.

Copies are private only where sharing carries nothing: every partition's
view of the tile is written whole (constant indices, before any read) right
where it is declared, as a register tile's zero-init does, so none reads what
another left. (The partition holding the allocation itself is a copy of the
same loop body.) A tile whose contents could outlive one partition stays
shared.
"""

import functools
import operator

import tvm
import tvm_ffi
from tvm import tirx
from tvm.tirx import stmt as tir_stmt

from tf_dietcode.tuning.tir_passes.ir import reads
from tf_dietcode.tuning.tir_passes.markers import ON_THE_STACK

REGISTER_FILE_BYTES = 32 * 64  # AVX-512's 32 registers of 64 bytes: no register tile is larger
_BUFFER_DATA = tvm.ir.Op.get("tirx.buffer_data")


def _register_tile(buffer: tirx.Buffer) -> bool:
    if buffer.scope() != "global" or not all(isinstance(d, tirx.IntImm) for d in buffer.shape):
        return False
    return _elements(buffer) * tvm.DataType(buffer.dtype).bits // 8 <= REGISTER_FILE_BYTES


def _elements(buffer: tirx.Buffer) -> int:
    return functools.reduce(operator.mul, (int(d) for d in buffer.shape), 1)


def _aliased_tile(statement: tir_stmt.Stmt, tiles: list[tirx.Buffer]) -> bool:
    """Whether the statement declares a view of one of the stack tiles (an alias StorageRewrite made)."""
    if not isinstance(statement, tir_stmt.DeclBuffer):
        return False
    data = statement.data
    return (isinstance(data, tvm.ir.Call) and data.op.same_as(_BUFFER_DATA)
            and any(tile.same_as(data.args[0]) for tile in tiles))


def _written_whole_first(buffer: tirx.Buffer, following: list[tir_stmt.Stmt]) -> bool:
    """Whether the statements after the declaration start by storing every element of `buffer`
    at constant indices (scalars or constant ramps), reading none of it before."""
    missing = set(range(_elements(buffer)))
    for statement in following:
        if not missing:
            return True
        if not isinstance(statement, tir_stmt.BufferStore) or not statement.buffer.same_as(buffer) \
                or len(statement.indices) != 1 or reads(statement.value, buffer):
            return False
        index = statement.indices[0]
        if isinstance(index, tirx.IntImm):
            missing.discard(int(index))
        elif isinstance(index, tirx.Ramp) and all(isinstance(part, tirx.IntImm)
                                                   for part in (index.base, index.stride, index.lanes)):
            missing -= {int(index.base) + lane * int(index.stride) for lane in range(int(index.lanes))}
        else:
            return False
    return not missing


def _owns_its_copies(tile: tirx.Buffer, body: tir_stmt.Stmt) -> bool:
    """Whether every view of `tile` declared in `body` is written whole before it is read, so no
    partition reads what another left: only then may each have its own copy."""
    sequences = []
    tvm_ffi.structural_walk(body, (tir_stmt.SeqStmt, sequences.append))
    return all(_written_whole_first(child.buffer, list(sequence.seq)[position + 1:])
               for sequence in sequences for position, child in enumerate(sequence.seq)
               if _aliased_tile(child, [tile]))


def _private_copies(sequence: tir_stmt.SeqStmt, tiles: list[tirx.Buffer]) -> tir_stmt.SeqStmt:
    """The sequence with each view of the stack tiles `tiles` it declares turned into a tile of its own."""
    children = list(sequence.seq)
    for position, child in enumerate(children):
        if _aliased_tile(child, tiles):
            alias = child.buffer
            own = tirx.decl_buffer(alias.shape, alias.dtype, alias.name, scope="global")
            rename = lambda buffer, alias=alias, own=own: own if buffer.same_as(alias) else buffer  # noqa: E731
            children[position] = tir_stmt.AllocBuffer(own)
            children[position + 1:] = [tvm_ffi.structural_map(later, (tirx.Buffer, rename))
                                       for later in children[position + 1:]]
    return tir_stmt.SeqStmt(children)


def private_register_tiles(body: tir_stmt.Stmt) -> tir_stmt.Stmt:
    allocations = []
    tvm_ffi.structural_walk(body, (tir_stmt.AllocBuffer, allocations.append))
    tiles = [allocation.buffer for allocation in allocations
             if _register_tile(allocation.buffer) and _owns_its_copies(allocation.buffer, body)]
    if not tiles:
        return body
    return tvm_ffi.structural_map(body, (tir_stmt.SeqStmt, lambda sequence: _private_copies(sequence, tiles)))


def register_tiles_on_the_stack(body: tir_stmt.Stmt) -> tir_stmt.Stmt:
    """Every register tile's allocation marked to stay on the stack, whatever its size."""
    return tvm_ffi.structural_map(body, (tir_stmt.AllocBuffer, lambda allocation: tir_stmt.AllocBuffer(
        allocation.buffer, annotations={**allocation.annotations, **ON_THE_STACK})
        if _register_tile(allocation.buffer) else allocation))


@tvm.tirx.transform.prim_func_pass(opt_level=0, name="tf_dietcode.RegisterTiles")
def RegisterTiles(func: tirx.PrimFunc, _mod, _ctx) -> tirx.PrimFunc:  # noqa: N802 (TVM pass naming)
    return func.with_body(register_tiles_on_the_stack(private_register_tiles(func.body)))
