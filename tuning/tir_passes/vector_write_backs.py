"""A TIR pass that writes a register tile back in vector stores whose indices into the
tile are constants, where LLVM would index it by a loop variable:

- a write-back over `min(W, E)` columns (the last column task where N is
  symbolic), W a whole number of vectors, becomes W / lanes vector stores, each
  whole where its columns are all below E and else masked to them (_below), its
  loads of consecutive elements from the kernel's parameters masked alike;
- a write-back that reads a strided addend (batch matmul's addend has a symbolic
  column stride: 1 in the usual layout, 0 for a mask broadcast along the
  columns) becomes vector stores in two versions, vector loads where the stride
  is 1 at run time and gathers (columns clamped to the last) where it is not;
- the constant loop over the tile's rows around such a write-back is unrolled.

Why: LLVM gives a tile's elements registers only where every index into it is a
constant. A write-back over a variable number of columns, or one LLVM versions
on a stride at run time (its fallback loops over the columns) or leaves rolled,
indexes the tile by a loop variable, and the whole tile then lived in memory,
compute loops included: NT `m4_n48_k64_t1_ki_b` ran 344 us at T = 47 against
228 at T = 48 and 260 for its static build; with an addend, 21-26 stack
accesses per 30 FMAs at every T (Emerald Rapids). SpecializeRemainderRows runs
first and makes the row counts constant.
"""

import tvm
import tvm_ffi
from tvm import sym, tirx
from tvm.tirx import stmt as tir_stmt

from tf_dietcode.tuning import hardware
from tf_dietcode.tuning.tir_passes.ir import (fresh_vars, rebuild_loops, sequence, statements, substituted, uses,
                                              whole_vectors_up_to_a_bound)
from tf_dietcode.tuning.micro_kernel import MAX_TILE_ROWS


def _inlined_store(loop: tir_stmt.For) -> tir_stmt.BufferStore | None:
    """A serial loop from 0 whose body is bindings and one store: the store alone, the bindings'
    values in place, so that every load's index shows how it depends on the column; else None."""
    *bindings, store = statements(loop.body)
    if not (loop.kind == tir_stmt.ForKind.SERIAL and isinstance(loop.min, tirx.IntImm) and int(loop.min) == 0
            and isinstance(store, tir_stmt.BufferStore)
            and all(isinstance(binding, tir_stmt.Bind) for binding in bindings)):
        return None
    for binding in reversed(bindings):
        store = substituted(store, binding.var, binding.value)
    return store


def _column_steps(index, column: tirx.Var) -> list | None:
    """[step per column, the rest] for an index linear in the column, else None."""
    steps = sym.detect_linear_equation(index, [column])
    return list(steps) if len(steps) == 2 else None


def _steps_by_one(steps: list | None) -> bool:
    return steps is not None and isinstance(steps[0], tirx.IntImm) and int(steps[0]) == 1


def _own_tile(load, local: list) -> bool:
    return any(load.source.same_as(tile) for tile in local)


def _strided_loads(store: tir_stmt.BufferStore, column: tirx.Var, local: list) -> list:
    """(load, its index's column steps or None) for the loads from the kernel's parameters whose
    index steps by other than one element per column: an addend's symbolic column stride (1 in the
    usual layout, 0 for a mask broadcast along the columns)."""
    loads = []
    tvm_ffi.structural_walk(store.value, (tvm.ir.TensorLoad, loads.append))
    strided = []
    for load in loads:
        if not _own_tile(load, local) and uses(load.indices[-1], [column]):
            steps = _column_steps(load.indices[-1], column)
            if not _steps_by_one(steps):
                strided.append((load, steps))
    return strided


def _rewrite_loads(store: tir_stmt.BufferStore, rewrite: list) -> tir_stmt.BufferStore:
    return tvm_ffi.structural_map(store, (tvm.ir.TensorLoad, lambda load: next(
        (new for old, new in rewrite if old.same_as(load)), load)))


def _versions(store: tir_stmt.BufferStore, column: tirx.Var, strided: list, last) -> list:
    """[(condition, store)]: one store per case of the strided loads' steps at run time, the last one
    with condition None. Where every such load's step is 1 at run time (the usual layout), they are
    indexed `rest + c` (vector loads); otherwise they read column `min(c, last)` (gathers that stop
    at the last column; `last` None: every column is inside)."""
    if not strided:
        return [(None, store)]
    clamped = [(load, load if last is None else substituted(load, column, tirx.Min(column, last)))
               for load, _ in strided]
    gathered = (None, _rewrite_loads(store, clamped))
    if any(steps is None for _, steps in strided):  # an index not linear in the column: gathered always
        return [gathered]
    unit = [(load, tirx.BufferLoad(load.source, [*load.indices[:-1], steps[1] + column])) for load, steps in strided]
    return [(tvm.tirx.all(*[steps[0] == 1 for _, steps in strided]), _rewrite_loads(store, unit)), gathered]


def _vectorized(store: tir_stmt.BufferStore, column: tirx.Var, start: int, lanes: int) -> tir_stmt.BufferStore | None:
    """The store for columns [start, start + lanes) as one vector store (TVM's vectorizer), or None
    where it is not one vector store of consecutive elements."""
    lane = tirx.Var("lane", column.ty.dtype)
    vectorize = tir_stmt.For(lane, tirx.const(0, lane.ty.dtype), tirx.const(lanes, lane.ty.dtype),
                             tir_stmt.ForKind.VECTORIZED,
                             substituted(store, column, tirx.const(start, lane.ty.dtype) + lane))
    vector = tvm.tirx.transform.VectorizeLoop()(tvm.IRModule({"main": tirx.PrimFunc([], vectorize)}))["main"].body
    if not (isinstance(vector, tir_stmt.BufferStore) and _consecutive(vector.indices[-1])
            and str(vector.value.ty.dtype) == f"float32x{lanes}"):
        return None
    return vector


def _consecutive(index) -> bool:
    return isinstance(index, tirx.Ramp) and isinstance(index.stride, tirx.IntImm) and int(index.stride) == 1


def _masked(store: tir_stmt.BufferStore, mask, local: list) -> tir_stmt.Stmt:
    """The vector store, and its loads of consecutive elements from the kernel's parameters, masked
    (the others are the same for every lane, or gathered inside the columns: _versions)."""
    value = tvm_ffi.structural_map(store.value, (tvm.ir.TensorLoad, lambda load: tirx.op.masked_load(
        load.ty.dtype, load.source, *load.indices, mask) if _consecutive(load.indices[-1]) and not _own_tile(
        load, local) else load))
    return tir_stmt.Evaluate(tirx.op.masked_store(store.buffer, value, *store.indices, mask))


def _below(vector: tir_stmt.BufferStore, start: int, lanes: int, bound, local: list) -> tir_stmt.Stmt:
    """The vector store of columns [start, start + lanes) limited to the columns below `bound`: whole
    where they all are, masked where some are, none where none is.

    Why not always masked: on AMD Zen a masked store (vmaskmovps to memory) is microcoded, and its
    mask came from 64-bit compares. NT `m4_n24_k64_t1_ko_b` at T = 17 (every column task partial)
    spent a fifth of its time in its masked stores and ran 1.11-1.15x its static build, which
    stores the 17 columns plainly (2-core Zen 3). The mask compares 32-bit lanes: a bound is a count
    of columns."""
    columns = tirx.Ramp(tirx.const(start, "int32"), tirx.const(1, "int32"), lanes)
    masked = _masked(vector, columns < tirx.Broadcast(tirx.Cast("int32", bound), lanes), local)
    partial = masked if start == 0 else tir_stmt.IfThenElse(bound > start, masked, None)  # bound > 0 is checked
    return tir_stmt.IfThenElse(bound >= start + lanes, vector, partial)


def _vector_stores(store: tir_stmt.BufferStore, column: tirx.Var, width: int, bound, lanes: int, local: list):
    """The vector stores of `store` over columns [0, width), limited to the columns below `bound`
    (None: all of them), or None if one is not a vector store of consecutive elements."""
    vectors = []
    for start in range(0, width, lanes):
        vector = _vectorized(store, column, start, lanes)
        if vector is None:
            return None
        vectors.append(vector if bound is None else _below(vector, start, lanes, bound, local))
    return sequence(vectors)


def vector_write_back(loop: tir_stmt.For, lanes: int, local: list) -> tir_stmt.Stmt:
    """The loop as vector stores, if it writes back one element per column of consecutive columns:
    `min(W, E)` columns (masked to E), or W columns reading a strided addend (LLVM versions such a
    loop on the stride, and its fallback indexes the tile), W a constant multiple of `lanes`; else
    the loop unchanged."""
    store = _inlined_store(loop)
    if store is None or not (str(store.value.ty.dtype) == str(store.buffer.dtype) == "float32"
                             and _steps_by_one(_column_steps(store.indices[-1], loop.loop_var))):
        return loop  # not one element per column of consecutive columns (a vector already, or rows)
    strided = _strided_loads(store, loop.loop_var, local)
    if strided and isinstance(loop.extent, tirx.IntImm) and int(loop.extent) % lanes == 0:
        width, bound = int(loop.extent), None
    else:
        found = whole_vectors_up_to_a_bound(loop.extent, lanes)
        if found is None:
            return loop
        width, bound = found
    stores = None
    for condition, version in reversed(_versions(store, loop.loop_var, strided, None if bound is None else bound - 1)):
        vectors = _vector_stores(version, loop.loop_var, width, bound, lanes, local)
        if vectors is None:
            return loop
        stores = vectors if condition is None else tir_stmt.IfThenElse(condition, vectors, stores)
    # the loop ran no column where E <= 0: neither do the loads its columns do not index
    stores = stores if bound is None else tir_stmt.IfThenElse(bound > 0, stores, None)
    return tir_stmt.AttrStmt(loop.loop_var, _WRITE_BACK, tirx.const(1, "int32"), stores)


_WRITE_BACK = "tf_dietcode.vector_write_back"  # marks a rewritten write-back until its row loop is unrolled


def _unrolled_rows(loop: tir_stmt.For) -> tir_stmt.Stmt:
    """A constant loop over a register tile's rows whose body holds a rewritten write-back, one copy
    per row: each row's stores then index the tile with constants (LLVM left a loop of rows with
    gathers in it rolled, and so indexed the tile by the row)."""
    if not (loop.kind == tir_stmt.ForKind.SERIAL and isinstance(loop.extent, tirx.IntImm)
            and int(loop.extent) <= MAX_TILE_ROWS and isinstance(loop.min, tirx.IntImm)
            and any(isinstance(s, tir_stmt.AttrStmt) and s.attr_key == _WRITE_BACK for s in statements(loop.body))):
        return loop
    return sequence([fresh_vars(substituted(loop.body, loop.loop_var, tirx.const(row, loop.loop_var.ty.dtype)))
                     for row in range(int(loop.min), int(loop.min) + int(loop.extent))])


def _unmarked(stmt: tir_stmt.Stmt) -> tir_stmt.Stmt:
    return tvm_ffi.structural_map(stmt, (tir_stmt.AttrStmt, lambda node: node.body if node.attr_key == _WRITE_BACK
                                         else node))


@tvm.tirx.transform.prim_func_pass(opt_level=0, name="tf_dietcode.VectorWriteBacks")
def VectorWriteBacks(func: tirx.PrimFunc, _mod, _ctx) -> tirx.PrimFunc:  # noqa: N802 (TVM pass naming)
    lanes = hardware.llvm_float32_lanes(func)
    if lanes is None:
        return func
    local = []  # the tiles the kernel allocates: read whole, never past their end
    tvm_ffi.structural_walk(func.body, (tir_stmt.AllocBuffer, lambda node: local.append(node.buffer)))

    def rewrite(loop, _enclosing):
        rewritten = vector_write_back(loop, lanes, local)
        return _unrolled_rows(rewritten) if rewritten.same_as(loop) else rewritten
    return func.with_body(_unmarked(rebuild_loops(func.body, rewrite)))
