"""A TIR pass that gives a symbolic kernel's last, partial row tile one copy per
row count: `for ax0 in range(min(C, E)): write back row ax0` at the end of a
tile becomes `if min(C, E) == 1: <compute; write back 1 row> elif ... == 2:
... else: <as before>`, for every count below C.

Why: LoopPartition splits a row-tile loop into the whole tiles and a remainder,
and in a symbolic kernel the remainder's write-back runs a variable number of
rows. LLVM keeps an accumulator in registers only where every access has a
constant index, so the remainder's stayed in memory: a load and a store around
each of its FMAs. A static build writes back a constant count, so LLVM kept
its remainder in registers and dropped the rows past M as dead. The dense
kernel `m6_n48_k768_t1_ki_p_rall` at M = 37 (six whole tiles and one row)
ran 461 us symbolic against 423 static, and 393 at M = 36 (Emerald Rapids, 2
threads). With one copy per count, each copy's write-back has a constant trip
count, as in the static build.

The copies follow the remainder's last binding, so the count's variables are
in scope; each copy defines variables of its own (fresh_vars).

No general write-back stays behind where the copies cover every count the
loop can have from 1 up and the tile the copies compute is the iteration's own
(a count below 1 then writes nothing from a tile nothing else reads). Left in
as the last `else`, never taken, it indexed the tile by its row loop, and as the
tile is allocated before the branches, LLVM kept it in memory in every copy:
stored after each copy's compute loop, loaded again by its write-back. NT
`m6_n64_k64_t1_ki_b` (a 64-step K, so a tile's compute is short) ran 1.07-1.09x
its static build's time at T = 62, 0.92-0.95x without it (the 2-vCPU Xeon, 2
threads, interleaved). A remainder loop whose count LoopPartition simplified to
an expression the scope bounds (`M - 6 * (M // 6)`, no `min`) gets its copies
too, where its tile is its own.
"""

import tvm
import tvm_ffi
from tvm import sym, tirx
from tvm.tirx import stmt as tir_stmt

from tf_dietcode.tuning.tir_passes.ir import (always, fresh_vars, in_scope, rebuild_loops, row_count, sequence,
                                              statements, substituted, with_body)


def _writes_only_its_own(statements_: list[tir_stmt.Stmt]) -> bool:
    """Whether every store in the statements goes to a buffer allocated among them."""
    own, stores = [], []
    for statement in statements_:
        tvm_ffi.structural_walk(statement, (tir_stmt.AllocBuffer, lambda node: own.append(node.buffer)))
        tvm_ffi.structural_walk(statement, (tir_stmt.BufferStore, stores.append))
    return all(any(store.buffer.same_as(buffer) for buffer in own) for store in stores)


def _tile_rows(write_back: tir_stmt.For) -> tuple[tirx.Buffer, int] | None:
    """(the tile, its row stride) that the write-back reads row by row, else None."""
    loads, bindings = [], []
    tvm_ffi.structural_walk(write_back.body, (tvm.ir.TensorLoad, loads.append))
    tvm_ffi.structural_walk(write_back.body, (tir_stmt.Bind, bindings.append))
    for load in (load for load in loads if len(load.indices) == 1):
        index = load.indices[0]
        for binding in reversed(bindings):  # indices through the write-back's bindings, in terms of its loops
            index = substituted(index, binding.var, binding.value)
        steps = sym.detect_linear_equation(index, [write_back.loop_var])
        if len(steps) == 2 and isinstance(steps[0], tirx.IntImm) and int(steps[0]) > 0:
            return load.source, int(steps[0])
    return None


def _without_rows_from(compute: list[tir_stmt.Stmt], tile_rows: tuple | None, rows: int) -> list[tir_stmt.Stmt]:
    """The compute without its stores to the tile's rows from `rows` on, which the copy's write-back
    of `rows` rows never reads. LLVM kept them: the 5-row copy of dense `m6_n48_k384_t1_ki_p_rall`
    ran 6 rows of FMAs, where a static build of M = 17 ran 5 (its symbolic build 1.05-1.08x the
    static one's time at M = 17, a third of its work in that tile)."""
    if tile_rows is None:
        return compute
    tile, stride = tile_rows

    def first_element(store: tir_stmt.BufferStore):
        index = store.indices[0] if len(store.indices) == 1 else None
        index = index.base if isinstance(index, tirx.Ramp) else index
        return int(index) if isinstance(index, tirx.IntImm) else None

    def kept(store: tir_stmt.BufferStore) -> tir_stmt.Stmt:
        element = first_element(store) if store.buffer.same_as(tile) else None
        return store if element is None or element < rows * stride else tir_stmt.Evaluate(tirx.const(0, "int32"))
    return [tvm_ffi.structural_map(statement, (tir_stmt.BufferStore, kept)) for statement in compute]


def _without_clamps(copy: tir_stmt.Stmt, scope, count, fixed: int) -> tir_stmt.Stmt:
    """The copy with each `min(a, b)` that the copy's count settles replaced by the smaller side.

    A tile clamps its rows to the last row, min(first + i, M - 1), so that its fetch never reads
    past M; a copy of `fixed` rows reads only rows first + i, i < fixed, which lie below M there. Where
    the count is min(C, E) or E, the copy runs only where E >= fixed, so a <= b holds in it wherever
    b - a - (E - fixed) >= 0 holds in scope. Clamped, each row's address cost a compare, a `cmov` and an
    `imul` per tile, and rows no longer a fixed distance apart kept OwnRowPointers from hoisting
    their strides: NN `m6_n16_k128_t1_ki_b` at T = 17 set up its 5-row tile in 50 instructions, 72
    before (callgrind's counts per call; 8.4 thousand fewer of 1.11 million per call).
    """
    bound = count  # E: the count, or its term that is not row_count's constant C
    if isinstance(count, tirx.Min):
        bound = count.b if isinstance(count.a, tirx.IntImm) else count.a
    slack = bound - tirx.const(fixed, bound.ty.dtype)

    def settled(node):
        if always(scope, node.b - node.a - slack >= 0):
            return node.a
        return node.b if always(scope, node.a - node.b - slack >= 0) else node
    return tvm_ffi.structural_map(copy, (tirx.Min, settled))


def _one_copy_per_count(loop: tir_stmt.For, enclosing: tuple) -> tir_stmt.For:
    """The loop, with what follows its body's last binding copied once per row count if its body ends
    in a write-back of `min(C, E)` rows (or of E rows, E bounded by C, where the tile is the loop's
    own): counts 1 to C - 1 in a remainder (the count provably below C), 1 to C in a loop that also
    runs whole tiles (a partial column task's rows); of those, only the counts its scope allows, and
    that copy alone where the scope fixes the count (a small_reductions copy, M constant). The
    general write-back stays as the last branch unless the tile is the loop's own (see above)."""
    body = statements(loop.body)
    bindings = [i for i, statement in enumerate(body) if isinstance(statement, tir_stmt.Bind)]
    if not bindings:
        return loop
    head, tail = body[:bindings[-1] + 1], body[bindings[-1] + 1:]
    scope = in_scope((*enclosing, loop, *(head[i] for i in bindings)))
    found = row_count(body[-1], scope)
    if found is None:
        return loop
    rows, count = found
    write_back = tail[-1]
    own_tile = _writes_only_its_own([*head, *tail[:-1]])
    if not own_tile and not isinstance(count, tirx.Min):
        return loop
    whole_tiles = not always(scope, count < rows)
    tile_rows = _tile_rows(write_back) if own_tile else None  # rows past a copy's count are dropped from own tiles only
    specialized = None if own_tile else sequence(tail)
    for fixed in range(rows if whole_tiles else rows - 1, 0, -1):
        constant = tirx.const(fixed, count.ty.dtype)
        if always(scope, count != constant):
            continue
        copy = fresh_vars(_without_clamps(sequence([*_without_rows_from(tail[:-1], tile_rows, fixed),
                                                    with_body(write_back, write_back.body, extent=constant)]),
                                          scope, count, fixed))
        if always(scope, count == constant):
            specialized = copy
            break
        specialized = tir_stmt.IfThenElse(count == constant, copy, specialized)
    return _once(with_body(loop, sequence([*head, *([] if specialized is None else [specialized])])), enclosing)


def _once(loop: tir_stmt.For, enclosing: tuple) -> tir_stmt.Stmt:
    """A remainder loop that runs at most once (LoopPartition's `(M % C + C - 1) // C`) as an `if`:
    as a loop, LLVM kept its counter and each row's next address in registers and on the stack
    around a tile it never repeats: the same kernel ran 22 thousand fewer instructions per call as an
    `if` (1.084 million; 2.7% fewer with _without_clamps). A loop a later pass looks for by its
    mark (PrefetchNextPanel's row tiles) stays a loop."""
    if (loop.kind != tir_stmt.ForKind.SERIAL or loop.annotations
            or not always(in_scope(enclosing), loop.extent <= 1)):
        return loop
    return tir_stmt.IfThenElse(1 <= loop.extent, substituted(loop.body, loop.loop_var, loop.min), None)


@tvm.tirx.transform.prim_func_pass(opt_level=0, name="tf_dietcode.SpecializeRemainderRows")
def SpecializeRemainderRows(func: tirx.PrimFunc, _mod, _ctx) -> tirx.PrimFunc:  # noqa: N802 (TVM pass naming)
    return func.with_body(rebuild_loops(func.body, _one_copy_per_count))
