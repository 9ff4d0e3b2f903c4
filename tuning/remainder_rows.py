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
"""

import tvm
from tvm import tirx
from tvm.tirx import stmt as tir_stmt

from tf_dietcode.tuning.guarded_loops import (always, fresh_vars, in_scope, rebuild_loops, sequence, statements,
                                              with_body)
from tf_dietcode.tuning.micro_kernel import MAX_TILE_ROWS


def row_count(write_back: tir_stmt.Stmt):
    """(C, the count) for a loop over `min(C, E)` rows with 2 <= C <= MAX_TILE_ROWS (a larger count
    is not a register tile's write-back), else None."""
    if not isinstance(write_back, tir_stmt.For) or not isinstance(write_back.extent, tirx.Min):
        return None
    constant = [term for term in (write_back.extent.a, write_back.extent.b) if isinstance(term, tirx.IntImm)]
    if len(constant) != 1 or not 2 <= int(constant[0]) <= MAX_TILE_ROWS:
        return None
    return int(constant[0]), write_back.extent


def _one_copy_per_count(loop: tir_stmt.For, enclosing: tuple) -> tir_stmt.For:
    """The loop, with what follows its body's last binding copied once per row count if its body ends
    in a write-back of `min(C, E)` rows: counts 1 to C - 1 in a remainder (the count provably below
    C), 1 to C in a loop that also runs whole tiles (a partial column task's rows); of those, only the
    counts its scope allows, and that copy alone where the scope fixes the count (a small_reductions
    copy, M constant)."""
    body = statements(loop.body)
    found = row_count(body[-1])
    bindings = [i for i, statement in enumerate(body) if isinstance(statement, tir_stmt.Bind)]
    if found is None or not bindings:
        return loop
    rows, count = found
    head, tail = body[:bindings[-1] + 1], body[bindings[-1] + 1:]
    write_back = tail[-1]
    specialized = sequence(tail)
    scope = in_scope((*enclosing, loop, *(head[i] for i in bindings)))
    whole_tiles = not always(scope, count < rows)
    for fixed in range(rows if whole_tiles else rows - 1, 0, -1):
        constant = tirx.const(fixed, count.ty.dtype)
        if always(scope, count != constant):
            continue
        copy = fresh_vars(sequence([*tail[:-1], with_body(write_back, write_back.body, extent=constant)]))
        if always(scope, count == constant):
            specialized = copy
            break
        specialized = tir_stmt.IfThenElse(count == constant, copy, specialized)
    return with_body(loop, sequence([*head, specialized]))


@tvm.tirx.transform.prim_func_pass(opt_level=0, name="tf_dietcode.SpecializeRemainderRows")
def SpecializeRemainderRows(func: tirx.PrimFunc, _mod, _ctx) -> tirx.PrimFunc:  # noqa: N802 (TVM pass naming)
    return func.with_body(rebuild_loops(func.body, _one_copy_per_count))
