"""A TIR pass that splits a register tile's reduction over several partial accumulators where the
tile has too few accumulator vectors to keep the FMA pipes busy.

Each update `acc[i] = acc[i] + e` in a loop over K is a chain of dependent FMAs per accumulator
vector: an FMA waits for the one before it (4 cycles on Zen 3, and on Intel cores since Skylake),
and two FMA pipes want CHAINS_IN_FLIGHT independent chains. A tile of one or two vectors, or a
remainder version of few rows (LLVM drops the chains of the rows it never writes back), waits on
its chains: batch matmul NT at T = 1 ran one chain of 64 dependent FMAs per batch. Here iteration
k of a loop with few live chains adds into partial accumulator k mod R (the first is the tile
itself), and the partials are summed into the tile after the loop. The sums round differently
from one chain (LLVM never reassociates them itself: TVM emits no fast-math flags).

Only loops of constant trip count divisible by R are split, whose body is bindings and such
updates of one stack tile at distinct constant indices. Live chains are those the statements
after the loop read; where a read's range is not constant, all are.
"""

import tvm
import tvm_ffi
from tvm import sym, tirx
from tvm.tirx import stmt as tir_stmt

from tf_dietcode.tuning import hardware
from tf_dietcode.tuning.tir_passes.ir import (fresh_vars, integer_valued, reads, sequence, statements, substituted,
                                              with_body)
from tf_dietcode.tuning.tir_passes.markers import ON_THE_STACK

CHAINS_IN_FLIGHT = 8  # FMA latency 4 x 2 FMA pipes (Zen 3; Intel since Skylake)


def _update(statement, acc=None):
    """(acc, its first element, lanes) for `acc[c:c + lanes] = acc[c:c + lanes] + e` (c constant, e
    reading no acc; acc the given buffer where one is), else None."""
    if not (isinstance(statement, tir_stmt.BufferStore) and len(statement.indices) == 1
            and isinstance(statement.value, tirx.Add) and isinstance(statement.value.a, tvm.ir.TensorLoad)):
        return None
    buffer, index, load = statement.buffer, statement.indices[0], statement.value.a
    if (acc is not None and not buffer.same_as(acc)) or not load.source.same_as(buffer) \
            or not tvm_ffi.structural_equal(load.indices[0], index) or reads(statement.value.b, buffer):
        return None
    if isinstance(index, tirx.IntImm):
        return buffer, int(index), 1
    if isinstance(index, tirx.Ramp) and all(isinstance(part, tirx.IntImm) for part in (index.base, index.stride)) \
            and int(index.stride) == 1:
        return buffer, int(index.base), int(index.lanes)
    return None


def _chains(loop: tir_stmt.For):
    """(acc, [(first element, lanes)] per update) for a serial loop of constant trip count whose body is
    bindings and updates of one stack tile at distinct constant indices, else None."""
    if loop.kind != tir_stmt.ForKind.SERIAL or not isinstance(loop.extent, tirx.IntImm):
        return None
    acc, chains = None, []
    for statement in statements(loop.body):
        if isinstance(statement, tir_stmt.Bind):
            continue
        update = _update(statement, acc)
        if update is None:
            return None
        acc = update[0]
        chains.append(update[1:])
    starts = [start for start, _ in chains]
    if not chains or len(set(starts)) != len(starts) or acc.scope() != "global" \
            or len(acc.shape) != 1 or not isinstance(acc.shape[0], tirx.IntImm):
        return None
    return acc, chains


def _read_elements(following: list[tir_stmt.Stmt], acc: tirx.Buffer) -> set[int] | None:
    """The elements of acc the statements may read, or None where a read's range is not constant."""
    analyzer = sym.Analyzer()
    scopes, loads = [], []
    for statement in following:
        tvm_ffi.structural_walk(statement, ((tir_stmt.For, tir_stmt.Bind), scopes.append))
        tvm_ffi.structural_walk(statement, (tvm.ir.TensorLoad, loads.append))
    # the walk meets a loop after its body, bindings in program order: every loop's range first
    for loop in (scope for scope in scopes if isinstance(scope, tir_stmt.For)):
        analyzer.bind(loop.loop_var, tvm.ir.Range.from_min_extent(loop.min, loop.extent))
    for binding in (scope for scope in scopes if isinstance(scope, tir_stmt.Bind) and integer_valued(scope.value)):
        analyzer.bind(binding.var, binding.value)
    read = set()
    for load in (load for load in loads if load.source.same_as(acc)):
        index = load.indices[0]
        base, lanes = (index.base, int(index.lanes)) if isinstance(index, tirx.Ramp) else (index, 1)
        if isinstance(index, tirx.Ramp) and not (isinstance(index.stride, tirx.IntImm) and int(index.stride) == 1):
            return None
        bound = analyzer.const_int_bound(base)
        if bound.min_value < 0 or bound.max_value >= int(acc.shape[0]):  # a symbolic range's bound is infinite
            return None
        read |= set(range(bound.min_value, bound.max_value + lanes))
    return read


def ways(live: int) -> int:
    """Partial accumulators per chain: the most, a power of two, with at most CHAINS_IN_FLIGHT chains
    in all. (Allowed up to 12, NT `m5_n8_k64_t1_ki_b`'s whole tiles of 5 chains split in 2 and ran
    1.2x as long at T = 5 and 9: Zen 3, AVX2's 16 registers.)"""
    split = 1
    while live * split * 2 <= CHAINS_IN_FLIGHT:
        split *= 2
    return split


def split_chains(nest: tir_stmt.For, following: list[tir_stmt.Stmt], machine_lanes: int) -> tir_stmt.Stmt:
    """The loop nest with its innermost loop over partial accumulators where that is a reduction loop
    with few live chains (see the module's docstring), else the nest unchanged. A nest: loops each
    the whole body of the one around it (a dense kernel's K blocks around K within a block). A
    chain is a machine vector of `machine_lanes` floats: an update of 32 lanes is 4 AVX2 chains."""
    loops = [nest]
    while isinstance(loops[-1].body, tir_stmt.For):
        loops.append(loops[-1].body)
    loop = loops[-1]
    found = _chains(loop)
    if found is None or any(around.kind != tir_stmt.ForKind.SERIAL for around in loops):
        return nest
    acc, chains = found
    read = _read_elements(following, acc)  # none read after the loop: the tile may be read later, all live
    live = [chain for chain in chains if not read or read & set(range(chain[0], chain[0] + chain[1]))]
    split = ways(sum(-(-width // machine_lanes) for _, width in live))
    trips = int(loop.extent)
    if split == 1 or trips % split or trips < 2 * split:
        return nest
    size = int(acc.shape[0])
    partials = tirx.decl_buffer((size * (split - 1),), acc.dtype, f"{acc.name}_partial", scope="global")

    def at(part, start, lanes):  # the index of a chain's partial `part` (0: the tile itself)
        offset = start + (part - 1) * size if part else start
        return [tirx.Ramp(tirx.const(offset, "int32"), 1, lanes) if lanes > 1 else tirx.const(offset, "int32")]

    def into(part, statement):
        update = _update(statement, acc)
        if update is None or part == 0:
            return statement
        index = at(part, *update[1:])
        return tir_stmt.BufferStore(partials, tirx.BufferLoad(partials, index) + statement.value.b, index)

    outer = tirx.Var(f"{loop.loop_var.name}_outer", loop.loop_var.ty.dtype)
    copies = [fresh_vars(substituted(sequence([into(part, s) for s in statements(loop.body)]), loop.loop_var,
                                     outer * split + part)) for part in range(split)]
    zero = [tir_stmt.BufferStore(partials, tirx.Broadcast(tirx.const(0, acc.dtype), lanes) if lanes > 1
                                 else tirx.const(0, acc.dtype), at(part, start, lanes))
            for part in range(1, split) for start, lanes in chains]
    sums = []
    for start, lanes in chains:
        terms = [tirx.BufferLoad(buffer, at(part, start, lanes))
                 for part, buffer in enumerate([acc] + [partials] * (split - 1))]
        while len(terms) > 1:  # pairwise: log2(split) dependent adds
            terms = [terms[i] + terms[i + 1] for i in range(0, len(terms), 2)]
        sums.append(tir_stmt.BufferStore(acc, terms[0], at(0, start, lanes)))
    split_nest = tir_stmt.For(outer, tirx.const(0, outer.ty.dtype), tirx.const(trips // split, outer.ty.dtype),
                              tir_stmt.ForKind.SERIAL, tir_stmt.SeqStmt(copies))
    for around in reversed(loops[:-1]):
        split_nest = with_body(around, split_nest)
    return tir_stmt.SeqStmt([tir_stmt.AllocBuffer(partials, annotations=ON_THE_STACK), *zero, split_nest, *sums])


@tvm.tirx.transform.prim_func_pass(opt_level=0, name="tf_dietcode.SplitReductionChains")
def SplitReductionChains(func: tirx.PrimFunc, _mod, _ctx) -> tirx.PrimFunc:  # noqa: N802 (TVM pass naming)
    lanes = hardware.llvm_float32_lanes(func)
    if lanes is None:
        return func

    def split_in(sequence_: tir_stmt.SeqStmt) -> tir_stmt.SeqStmt:
        children = list(sequence_.seq)
        return tir_stmt.SeqStmt([split_chains(child, children[position + 1:], lanes)
                                 if isinstance(child, tir_stmt.For) else child
                                 for position, child in enumerate(children)])
    return func.with_body(tvm_ffi.structural_map(func.body, (tir_stmt.SeqStmt, split_in)))
