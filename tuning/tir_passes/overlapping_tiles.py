"""A TIR pass that runs a symbolic kernel's last, partial column tile as a whole
tile shifted back to end at the bound, and drops the row clamps that whole
tiles provably never need. LoopPartition and ShrinkGuardedLoops split a loop
over output tiles into

    for a in range(E // W): <whole tile at a * W>
    for b in range((E % W + W - 1) // W): <partial tile: bound checks, masks>

and the pass makes that

    if W <= E:
        for a in range(ceil(E / W)): <whole tile at min(a * W, E - W)>
    else:
        <partial tile, as before>

The last tile then overlaps the one before it and writes the same values there
again (an output element is computed the same way whichever tile holds it),
with none of the partial tile's zero fill, clamped copy and masked stores;
those stay for extents below one tile. One loop, not a shifted copy of the
tile: the copy ran as fast and took a third longer to compile.

A partial tile that is a register tile's last rows (its write-back runs
`min(C, E)` rows) is left to SpecializeRemainderRows: in its copy per row
count LLVM drops the accumulators of the rows past M, as a static build does,
where a shifted tile would compute up to C - 1 rows again. Dense batch 1 at
M = 5 (tiles of 4 rows) ran 1.32x its static build with shifted row tiles,
1.02x without. There the pass only drops the clamps.

The clamps: inside a loop of whole tiles, `min(c + i, M - 1)` on x's rows
(templates.read_in_place_clamped) is provably `c + i`, and every such `min`
goes. LLVM then computes a tile's row addresses once, not a compare, a
select and a multiply per row at each tile.

Why: NT `m6_n16_k64_t1_ki_b` (one batch per task, its column tasks in turn)
ran 1.07-1.24x its static build at T = 17-119 on a 2-core Zen 3 (1.0-1.04 where
16 divides T). At T = 42 the symbolic build took 0.98x its time at T = 48 and
the static build 0.88x, as its 21 tiles against 24 predict: the partial column
task cost more than a whole one (masked stores whose accumulator halves LLVM
moved through general registers as `<2 x i256>`, a clamped transposing copy,
each row tile dispatched by its row count). docs/decisions.md has the
measurements.

Only output tiles: the loop variable must index a store to memory the kernel
did not allocate (a parameter's), and the loop must not read that memory, so
running a tile twice writes the same values; the kernel's parameters do not
alias (`tirx.noalias`). A reduction split the same way (a dynamic K's whole
blocks and its last one) accumulates into an allocated tile and is left alone.
Serial loops only: in a parallel loop two threads would write the overlap.
"""

import tvm
import tvm_ffi
from tvm import tirx
from tvm.tirx import stmt as tir_stmt

from tf_dietcode.tuning.tir_passes.ir import (always, in_scope, rebuild_loops, row_count, sequence, statements, uses,
                                              with_body)


def _is(operand, var: tirx.Var) -> bool:
    """Whether the operand is var, or var cast."""
    return operand.same_as(var) or (isinstance(operand, tirx.Cast) and operand.value.same_as(var))


def _at_tile_start(body: tir_stmt.Stmt, var: tirx.Var, width: int, start) -> tir_stmt.Stmt | None:
    """The loop body for the tile starting at `start` instead of at var * width: each product
    var * k becomes start * (k / width); None where var is read otherwise or k is not a multiple
    of width."""
    def rescaled(mul):
        scale, operand = (mul.b, mul.a) if isinstance(mul.b, tirx.IntImm) else (mul.a, mul.b)
        if not (isinstance(scale, tirx.IntImm) and _is(operand, var) and int(scale) % width == 0):
            return mul
        moved = start if operand.same_as(var) else tirx.Cast(operand.ty.dtype, start)
        return moved * tirx.const(int(scale) // width, scale.ty.dtype)
    moved = tvm_ffi.structural_map(body, (tirx.Mul, rescaled))
    return None if uses(moved, [var]) else moved


def _derived(body: tir_stmt.Stmt, var: tirx.Var) -> list:
    """var and every variable bound, anywhere in body, to a value that reads one of them."""
    bindings = []
    tvm_ffi.structural_walk(body, (tir_stmt.Bind, bindings.append))
    derived, grown = [var], True
    while grown:
        grown = False
        for binding in bindings:
            if not any(binding.var.same_as(known) for known in derived) and uses(binding.value, derived):
                derived.append(binding.var)
                grown = True
    return derived


class _Memory:
    """Which memory each buffer names: decl_buffer declares views (a parameter's, an allocated
    tile's) whose data is another buffer's; allocated memory is the kernel's own."""

    def __init__(self, body: tir_stmt.Stmt):
        self.allocated = []
        tvm_ffi.structural_walk(body, (tir_stmt.AllocBuffer, lambda node: self.allocated.append(node.buffer)))
        self.roots = []  # (declared buffer, the buffer whose memory it names)
        declared = []
        tvm_ffi.structural_walk(body, (tir_stmt.DeclBuffer, declared.append))
        for declaration in declared:  # in order: a view's source is declared (or allocated) before it
            named = []
            tvm_ffi.structural_walk(declaration.data, (tvm.ir.Var, named.append))
            known = [buffer for buffer, _ in self.roots] + self.allocated
            source = next((buffer for var in named for buffer in known if var.same_as(buffer)), None)
            self.roots.append((declaration.buffer, declaration.buffer if source is None else self.root(source)))

    def root(self, buffer):
        return next((root for declared, root in self.roots if declared.same_as(buffer)), buffer)

    def is_parameter(self, buffer) -> bool:
        root = self.root(buffer)
        return not any(root.same_as(tile) for tile in self.allocated)


def _writes_an_output_tile(loop: tir_stmt.For, memory: _Memory) -> bool:
    """Whether the loop's variable indexes a store to a parameter's memory, and the body reads no
    parameter memory it stores to (running it twice writes the same values)."""
    stores, loads = [], []
    tvm_ffi.structural_walk(loop.body, (tir_stmt.BufferStore, stores.append))
    tvm_ffi.structural_walk(loop.body, (tvm.ir.TensorLoad, loads.append))
    outputs = [store for store in stores if memory.is_parameter(store.buffer)]
    derived = _derived(loop.body, loop.loop_var)
    written = [memory.root(store.buffer) for store in outputs]
    return (any(uses(index, derived) for store in outputs for index in store.indices)
            and not any(memory.root(load.source).same_as(root) for load in loads for root in written))


def _overlapping(whole: tir_stmt.For, partial: tir_stmt.For, enclosing: tuple, memory: _Memory) -> tir_stmt.Stmt | None:
    """If the two loops split an extent E into whole tiles of W and a partial one: the two as one
    loop over tiles that end at the bound, or for a register tile's last rows the whole tiles
    without their clamps and the partial tile as it was (the module docstring); else None."""
    if not all(loop.kind == tir_stmt.ForKind.SERIAL and isinstance(loop.min, tirx.IntImm) and int(loop.min) == 0
               for loop in (whole, partial)):
        return None
    scope = in_scope(enclosing)
    extent = scope.simplify(whole.extent)
    if not (isinstance(extent, tirx.FloorDiv) and isinstance(extent.b, tirx.IntImm) and int(extent.b) > 1):
        return None
    bound, width = extent.a, int(extent.b)
    remainder = tirx.floordiv(tirx.floormod(bound, width) + (width - 1), width)
    if not (scope.can_prove_equal(partial.extent, remainder) and _writes_an_output_tile(whole, memory)):
        return None
    if row_count(statements(partial.body)[-1]) is not None:  # a register tile's last rows: kept (docstring)
        return tir_stmt.SeqStmt([with_body(whole, _without_proven_clamps(whole.body, (*enclosing, whole))), partial])
    var = whole.loop_var
    start = tirx.Var("tile_start", var.ty.dtype)
    body = _at_tile_start(whole.body, var, width, start)
    if body is None:
        return None
    first = tir_stmt.Bind(start, tirx.min(var * width, (bound - width).astype(var.ty.dtype)))
    tiles = with_body(whole, body, extent=tirx.floordiv(bound + (width - 1), width).astype(whole.extent.ty.dtype))
    body = _without_proven_clamps(tir_stmt.SeqStmt([first, body]), (*enclosing, tiles))
    return tir_stmt.IfThenElse(width <= bound, with_body(tiles, body), partial)


def _without_proven_clamps(body: tir_stmt.Stmt, enclosing: tuple) -> tir_stmt.Stmt:
    """The body with each `min(x, y)` that its loops and bindings prove equal to x (or y) replaced
    by it: in a loop of whole tiles, the clamps of rows to the last row (the module docstring).
    With the clamps kept, NT `m3_n24_k64_t1_ki_b` and `m6_n8_k64_t1_ki_b` ran 1.06-1.18x their
    static builds at T = 81-119; without them 0.98-1.03, but for one cell of 1.11 (Zen 3,
    interleaved)."""
    inner = []
    tvm_ffi.structural_walk(body, ((tir_stmt.For, tir_stmt.Bind), inner.append))
    scope = in_scope((*enclosing, *inner))  # variables are bound once (fresh_vars), so facts hold wherever they are read

    def drop(clamp):
        if always(scope, clamp.a <= clamp.b):
            return clamp.a
        return clamp.b if always(scope, clamp.b <= clamp.a) else clamp
    return tvm_ffi.structural_map(body, (tirx.Min, drop))


def overlap_partial_tiles(stmt: tir_stmt.Stmt) -> tir_stmt.Stmt:
    """The statement with every (whole tiles, partial tile) pair of sibling loops in a loop body
    rewritten by _overlapping."""
    memory = _Memory(stmt)

    def rewrite(loop: tir_stmt.For, enclosing: tuple) -> tir_stmt.For:
        body, rewritten = statements(loop.body), []
        for statement in body:
            scope = (*enclosing, loop, *(s for s in rewritten if isinstance(s, tir_stmt.Bind)))
            merged = (_overlapping(rewritten[-1], statement, scope, memory)
                      if rewritten and isinstance(rewritten[-1], tir_stmt.For) and isinstance(statement, tir_stmt.For)
                      else None)
            if merged is None:
                rewritten.append(statement)
            else:
                rewritten[-1:] = statements(merged)
        return with_body(loop, sequence(rewritten))
    return rebuild_loops(stmt, rewrite)


@tvm.tirx.transform.prim_func_pass(opt_level=0, name="tf_dietcode.OverlapPartialTiles")
def OverlapPartialTiles(func: tirx.PrimFunc, _mod, _ctx) -> tirx.PrimFunc:  # noqa: N802 (TVM pass naming)
    return func.with_body(overlap_partial_tiles(func.body))
