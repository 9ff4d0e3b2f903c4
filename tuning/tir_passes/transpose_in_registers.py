"""A TIR pass that copies a transposing fetch in square blocks: a vector load of
each of `lanes` source rows, a transpose in registers, a vector store of each
of `lanes` tile rows.

The copy it rewrites is `for c: for k: tile[k * w + c] = source[s * c + k]`
(contiguous along k in the source and along c in the tile), as batch matmul
NT fetches its y panel into a [K, columns] tile. Element by element, LLVM
vectorized it along k into a scatter per vector (AVX-512 `vscatterdps`).
In registers, a block of `lanes` rows is transposed in log2(lanes) stages,
each exchanging the off-diagonal halves of ever smaller square blocks between
pairs of rows: lanes * log2(lanes) two-vector shuffles per block. Columns past
the last whole block, and k past the last whole block, keep the element copy.

Where the blocks write every element of the tile (no element copy left), a
zero fill of the tile's padding right before the copy only writes what the
copy overwrites, and the pass drops it: a whole_batch kernel's last column
task copies all its columns, those past N repeating column N - 1.
"""

import tvm
import tvm_ffi
from tvm import sym, tirx
from tvm.tirx import stmt as tir_stmt

from tf_dietcode.tuning import hardware
from tf_dietcode.tuning.tir_passes.ir import (fresh_vars, integer_valued, loops, rebuild_loops, sequence,
                                              statements, whole_vectors_up_to_a_bound, with_body)


def _transposing_copy(loop: tir_stmt.For):
    """(inner loop, store, tile index terms, source index terms) for `for c: Bind*; for k: tile[..] =
    source[..]` whose tile index has c's coefficient 1 and source index k's coefficient 1, else None.
    Index terms: [coefficient of c, coefficient of k, the rest], bindings substituted."""
    *bindings, inner = statements(loop.body)
    if not (isinstance(inner, tir_stmt.For) and all(isinstance(b, tir_stmt.Bind) for b in bindings)
            and loop.kind == inner.kind == tir_stmt.ForKind.SERIAL
            and all(isinstance(outer.min, tirx.IntImm) and int(outer.min) == 0 for outer in (loop, inner))):
        return None
    store = inner.body
    if not (isinstance(store, tir_stmt.BufferStore) and isinstance(store.value, tvm.ir.TensorLoad)
            and len(store.indices) == len(store.value.indices) == 1
            and str(store.value.ty.dtype) == str(store.buffer.dtype) == "float32"
            and not store.buffer.same_as(store.value.source)):
        return None
    analyzer = sym.Analyzer()  # reads the indices through the bindings
    for binding in bindings:
        if integer_valued(binding.value):
            analyzer.bind(binding.var, binding.value)
    variables = [loop.loop_var, inner.loop_var]
    tile, source = (sym.detect_linear_equation(analyzer.simplify(index), variables)
                    for index in (store.indices[0], store.value.indices[0]))
    if len(tile) != 3 or len(source) != 3:
        return None
    if not (analyzer.can_prove_equal(tile[0], 1) and analyzer.can_prove_equal(source[1], 1)):
        return None
    return inner, store, tile, source


def _swap_off_diagonal(rows: list, half: int, lanes: int) -> list:
    """One stage: within every 2*half square block, rows i and i + half exchange the off-diagonal
    half-blocks (i's columns [half, 2*half) with i + half's columns [0, half))."""
    exchanged = list(rows)
    for i in range(lanes):
        if i & half:
            continue
        pair = [rows[i], rows[i + half]]
        exchanged[i] = tirx.Shuffle(pair, [j if not j & half else lanes + j - half for j in range(lanes)])
        exchanged[i + half] = tirx.Shuffle(pair, [j + half if not j & half else lanes + j for j in range(lanes)])
    return exchanged


def _block(store: tir_stmt.BufferStore, tile: list, source: list, c, k, lanes: int, last=None) -> list[tir_stmt.Stmt]:
    """Statements copying the lanes x lanes block whose first column is c and first k row is k
    (columns past `last`, where given, read column `last` again)."""
    dtype = f"{store.buffer.dtype}x{lanes}"
    index = c.ty.dtype
    source_start, tile_start = tirx.Var("source_start", index), tirx.Var("tile_start", index)
    body, rows = [tir_stmt.Bind(source_start, k + source[2]),
                  tir_stmt.Bind(tile_start, tile[1] * k + c + tile[2])], []
    for i in range(lanes):
        row = tirx.Var(f"row{i}", dtype)
        column = c + i if last is None else tirx.Min(c + i, last)
        body.append(tir_stmt.Bind(row, tirx.BufferLoad(store.value.source, [tirx.Ramp(
            source_start + source[0] * column, 1, lanes)])))
        rows.append(row)
    half = lanes // 2
    while half:
        exchanged = []
        for i, value in enumerate(_swap_off_diagonal(rows, half, lanes)):
            var = tirx.Var(f"t{half}_{i}", dtype)
            body.append(tir_stmt.Bind(var, value))
            exchanged.append(var)
        rows, half = exchanged, half // 2
    for j, row in enumerate(rows):  # row j now holds column j of the block: the tile's k row k + j
        body.append(tir_stmt.BufferStore(store.buffer, row, [tirx.Ramp(tile_start + tile[1] * j, 1, lanes)]))
    return body


def transpose_in_blocks(loop: tir_stmt.For, lanes: int,
                        enclosing: tuple = ()) -> tuple[tir_stmt.Stmt, tirx.Buffer | None]:
    """(The loop as whole blocks transposed in registers plus the element copy of what is left, the
    tile if the blocks write every element of it, else None) if the loop is a transposing copy of
    constant extents, or one whose columns stop at a symbolic bound E (`min(W, E)`, W whole blocks)
    inside a serial loop; else (the loop unchanged, None).

    A copy that stops at E inside a serial loop is the last column task's of a kernel whose tasks
    run a batch's column tasks in turn (whole_batch), where N is symbolic. It copies all W
    columns, those past E reading column E - 1 again: finite values that only reach output
    columns the write-back leaves out (VectorWriteBacks). Element by element, its copy ran as
    scatters: NT `m4_n48_k64_t1_ki_b` took 290 us at T = 43 against 236 for its static build, 214
    with the blocks (Emerald Rapids, 2 threads), and compiles in 1.3 s against 0.9.

    Why not where the copy sits right in the parallel loop (a kernel whose tasks are column tasks,
    each copy stopping at a bound that depends on the task): there LLVM took 10 s to compile the
    blocks, against 0.4 s, clamped or not, and with the compute removed too (NT
    `m3_n64_k64_t1_ki`). The cause is unknown; a tuning run cannot
    afford it, so those copies stay element by element."""
    copy = _transposing_copy(loop)
    if copy is None:
        return loop, None
    inner, store, tile, source = copy
    stopping = whole_vectors_up_to_a_bound(loop.extent, lanes) if _once_per_column_task(enclosing) else None
    columns, bound = (loop.extent, None) if stopping is None else stopping
    if not (isinstance(columns, (int, tirx.IntImm)) and isinstance(inner.extent, tirx.IntImm)):
        return loop, None
    columns, rows = int(columns), int(inner.extent)
    whole_columns, whole_rows = columns // lanes * lanes, rows // lanes * lanes
    if not (whole_columns and whole_rows):
        return loop, None
    last = None if bound is None else tirx.Var("last_column", bound.ty.dtype)
    column_block, k_block = (tirx.Var(name, outer.loop_var.ty.dtype) for name, outer in (("cb", loop), ("kb", inner)))
    blocks = _loop(column_block, 0, columns // lanes, _loop(k_block, 0, rows // lanes, tir_stmt.SeqStmt(
        _block(store, tile, source, column_block * lanes, k_block * lanes, lanes, last))))
    parts = [blocks]
    if whole_rows < rows:  # k past the whole blocks, in the whole columns (up to the bound)
        rest = _loop(inner.loop_var, whole_rows, rows - whole_rows, inner.body)
        extent = tirx.const(whole_columns, loop.extent.ty.dtype) if bound is None else loop.extent
        parts.append(fresh_vars(with_body(loop, _replaced(loop.body, inner, rest), extent=extent)))
    if whole_columns < columns:  # columns past the whole blocks
        parts.append(_loop(loop.loop_var, whole_columns, columns - whole_columns, loop.body))
    if bound is not None:
        parts = [tir_stmt.Bind(last, bound - 1), *parts]
    copied = sequence(parts)
    if bound is not None:
        copied = tir_stmt.IfThenElse(bound > 0, copied, None)
    whole = whole_rows == rows and whole_columns == columns and _covers(store.buffer, tile, columns, rows)
    return copied, store.buffer if whole else None


def _covers(buffer: tirx.Buffer, tile: list, columns: int, rows: int) -> bool:
    """Whether a copy of `rows` k rows of `columns` columns at tile index c + k * tile[1] + tile[2]
    covers the whole (flat) buffer."""
    analyzer = sym.Analyzer()
    return (len(buffer.shape) == 1 and analyzer.can_prove_equal(buffer.shape[0], columns * rows)
            and analyzer.can_prove_equal(tile[1], columns) and analyzer.can_prove_equal(tile[2], 0))


def _zero_fill(stmt: tir_stmt.Stmt, buffer: tirx.Buffer) -> bool:
    """Whether the statement only stores zeros into `buffer` (loops and bindings around the stores)."""
    stores, others = [], []
    tvm_ffi.structural_walk(stmt, (tir_stmt.BufferStore, stores.append))
    tvm_ffi.structural_walk(stmt, ((tir_stmt.Evaluate, tir_stmt.IfThenElse, tir_stmt.While), others.append))
    return bool(stores) and not others and all(
        store.buffer.same_as(buffer) and isinstance(store.value, tirx.FloatImm)
        and float(store.value.value) == 0.0 for store in stores)


def _without_overwritten_fills(loop: tir_stmt.For, whole_copies: list) -> tir_stmt.For:
    """The loop without the zero fills in its body that a copy of the whole tile right after
    overwrites. (A copy stopping at E runs where E > 0, as every column task of a whole_batch
    loop has columns; were E <= 0, the tile would only reach output columns the write-back
    leaves out.)"""
    parts = statements(loop.body)
    kept = [part for part, after in zip(parts, parts[1:] + [None])
            if not any(after is not None and after.same_as(copy) and _zero_fill(part, tile)
                       for copy, tile in whole_copies)]
    return loop if len(kept) == len(parts) else with_body(loop, sequence(kept))


def _once_per_column_task(enclosing: tuple) -> bool:
    """Whether a copy's innermost enclosing loop is serial (see transpose_in_blocks for why)."""
    around = loops(enclosing)
    return bool(around) and around[-1].kind == tir_stmt.ForKind.SERIAL


def _loop(var, start: int, extent: int, body: tir_stmt.Stmt) -> tir_stmt.For:
    """A serial loop of var over [start, start + extent)."""
    dtype = var.ty.dtype
    return tir_stmt.For(var, tirx.const(start, dtype), tirx.const(extent, dtype), tir_stmt.ForKind.SERIAL, body)


def _replaced(body: tir_stmt.Stmt, old: tir_stmt.For, new: tir_stmt.For) -> tir_stmt.Stmt:
    *bindings, last = statements(body)
    assert last.same_as(old)
    return tir_stmt.SeqStmt([*bindings, new]) if bindings else new


@tvm.tirx.transform.prim_func_pass(opt_level=0, name="tf_dietcode.TransposeInRegisters")
def TransposeInRegisters(func: tirx.PrimFunc, _mod, _ctx) -> tirx.PrimFunc:  # noqa: N802 (TVM pass naming)
    lanes = hardware.llvm_float32_lanes(func)
    if lanes is None:
        return func
    whole_copies = []  # (copy, tile) for the copies that write every element of their tile

    def rewrite(loop: tir_stmt.For, enclosing: tuple) -> tir_stmt.Stmt:
        copied, tile = transpose_in_blocks(loop, lanes, enclosing)
        if tile is not None:
            whole_copies.append((copied, tile))
        return _without_overwritten_fills(loop, whole_copies) if copied.same_as(loop) else copied
    return func.with_body(rebuild_loops(func.body, rewrite))
