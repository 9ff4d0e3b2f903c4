"""A TIR pass that writes a tile's partial columns back with masked vector stores:
`for c in range(min(W, E)): out[a + c] = f(acc[b + c], ...)`, W a whole number
of vectors, becomes one vector store per W / lanes columns, each masked to the
lanes below E, its loads from the kernel's parameters masked the same way.

Why: where N is symbolic (batch matmul NT's columns are T), the last column
task's write-back runs a variable number of columns, so LLVM cannot give the
accumulator's elements registers (it does that only where every index is a
constant) and keeps the whole tile in memory, its compute loop included: NT
`m4_n48_k64_t1_ki_b` at T = 47 ran 344 us against 228 at T = 48, its static
build at T = 47 260 us (Emerald Rapids, 2 threads). With masks every index into
the tile is a constant again; the rows are made constant by
SpecializeRemainderRows, which runs first.
"""

import tvm
import tvm_ffi
from tvm import tirx
from tvm.tirx import stmt as tir_stmt

from tf_dietcode.tuning import hardware
from tf_dietcode.tuning.guarded_loops import (fresh_vars, rebuild_loops, sequence, statements,
                                              whole_vectors_up_to_a_bound)


def _masked_width(loop: tir_stmt.For, lanes: int):
    """(W, E) for a serial loop from 0 over `min(W, E)` columns, W a constant multiple of `lanes`,
    whose body is one store after bindings, else None."""
    *bindings, store = statements(loop.body)
    if not (loop.kind == tir_stmt.ForKind.SERIAL and isinstance(loop.min, tirx.IntImm) and int(loop.min) == 0
            and isinstance(store, tir_stmt.BufferStore)
            and all(isinstance(binding, tir_stmt.Bind) for binding in bindings)):
        return None
    return whole_vectors_up_to_a_bound(loop.extent, lanes)


def _vectorized(loop: tir_stmt.For, start: int, lanes: int) -> list[tir_stmt.Stmt] | None:
    """The loop's body for columns [start, start + lanes) as bindings and one vector store (TVM's
    vectorizer), or None where the store is not one contiguous vector store."""
    lane = tirx.Var("lane", loop.loop_var.ty.dtype)
    column = tirx.const(start, lane.ty.dtype) + lane
    body = tvm_ffi.structural_map(loop.body, (tirx.Var, lambda var: column if var.same_as(loop.loop_var) else var))
    vectorize = tir_stmt.For(lane, tirx.const(0, lane.ty.dtype), tirx.const(lanes, lane.ty.dtype),
                             tir_stmt.ForKind.VECTORIZED, body)
    vector = tvm.tirx.transform.VectorizeLoop()(tvm.IRModule({"main": tirx.PrimFunc([], vectorize)}))["main"].body
    *bindings, store = statements(vector)
    if not (isinstance(store, tir_stmt.BufferStore) and isinstance(store.indices[-1], tirx.Ramp)
            and str(store.value.ty.dtype) == f"float32x{lanes}"):
        return None
    return [*bindings, store]


def _contiguous(index) -> bool:
    """Whether a vector index is consecutive elements (a masked access loads or stores those)."""
    return isinstance(index, tirx.Ramp) and isinstance(index.stride, tirx.IntImm) and int(index.stride) == 1


def _masked(store: tir_stmt.BufferStore, mask, local: list) -> tir_stmt.Stmt | None:
    """The vector store and its vector loads from anything but the tiles in `local`, masked; None if
    one of them is not of consecutive elements (a strided addend: left element by element)."""
    loads = []
    tvm_ffi.structural_walk(store.value, (tvm.ir.TensorLoad, loads.append))
    vector_loads = [node for node in loads if node.ty.dtype != store.buffer.dtype
                    and not any(node.source.same_as(tile) for tile in local)]
    if not all(_contiguous(node.indices[-1]) for node in [store, *vector_loads]):
        return None
    value = tvm_ffi.structural_map(store.value, (tvm.ir.TensorLoad, lambda node: tirx.op.masked_load(
        node.ty.dtype, node.source, *node.indices, mask) if any(node.same_as(v) for v in vector_loads) else node))
    return tir_stmt.Evaluate(tirx.op.masked_store(store.buffer, value, *store.indices, mask))


def mask_partial_columns(loop: tir_stmt.For, lanes: int, local: list) -> tir_stmt.Stmt:
    """The loop as masked vector stores, if it writes back `min(W, E)` columns; else unchanged."""
    found = _masked_width(loop, lanes)
    if found is None:
        return loop
    width, bound = found
    vectors = []
    for start in range(0, width, lanes):
        vector = _vectorized(loop, start, lanes)
        if vector is None:
            return loop
        *bindings, store = vector
        index = loop.loop_var.ty.dtype
        columns = tirx.Ramp(tirx.const(start, index), tirx.const(1, index), lanes)
        masked = _masked(store, columns < tirx.Broadcast(bound, lanes), local)
        if masked is None:
            return loop
        vectors += statements(fresh_vars(sequence([*bindings, masked])))
    # the loop ran no column where E <= 0: neither do the loads its columns do not index
    return tir_stmt.IfThenElse(bound > 0, sequence(vectors), None)


@tvm.tirx.transform.prim_func_pass(opt_level=0, name="tf_dietcode.MaskPartialColumns")
def MaskPartialColumns(func: tirx.PrimFunc, _mod, _ctx) -> tirx.PrimFunc:  # noqa: N802 (TVM pass naming)
    lanes = hardware.llvm_float32_lanes(func)
    if lanes is None:
        return func
    local = []  # the tiles the kernel allocates: read whole, never past their end
    tvm_ffi.structural_walk(func.body, (tir_stmt.AllocBuffer, lambda node: local.append(node.buffer)))
    return func.with_body(rebuild_loops(func.body, lambda loop, _enclosing: mask_partial_columns(loop, lanes, local)))
