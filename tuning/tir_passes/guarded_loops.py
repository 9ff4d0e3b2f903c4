"""A TIR pass that turns loops guarding their whole body with a bound check
into loops that stop at the bound: `for i in range(E): if a + i < b: body`
becomes `for i in range(max(min(E, b - a), 0)): body`.

Why: LoopPartition splits a checked loop at its bounds, but it does not split
the loops inside a remainder it cannot prove non-empty (with a symbolic N, the
partial column task of `ceil(N / 32)` may not exist). Those remainders kept a
compare per element in their fetches and write-backs, and a symbolic batch
matmul runs most of its work there at small T (all of it below 32 columns).
A check of this form is monotone in the loop variable, so the iterations that
pass it are a prefix (or, for `b <= i`, a suffix) of the loop, and the loop
can run just those. Checks free of the loop variable move out of the loop;
any other check stays where it was, and so does any check that divides by a
non-constant (moved out, it would be evaluated for a loop that never runs).
With batch matmul's x tile on the stack (templates 13), symbolic kernels ran
1.02-1.32x as fast as before at T = 1..128 (NT [192,T,64]x[192,T,64]^T, NN
[192,T,T]x[192,T,64]; dense within 1%; 2-core Zen 1, interleaved).
"""

import tvm
from tvm import sym, tirx
from tvm.tirx import stmt as tir_stmt

from tf_dietcode.tuning.tir_passes.ir import (always, conjunction_terms, in_scope, integer_valued, rebuild_loops,
                                              safe_anywhere, statements, uses, with_body)


def shrink_guarded_loops(stmt: tir_stmt.Stmt) -> tir_stmt.Stmt:
    """The statement with every guarded serial loop rewritten to iterate only where the guard holds."""
    return rebuild_loops(stmt, lambda loop, enclosing: _shrink(loop, enclosing) if loop.kind == tir_stmt.ForKind.SERIAL
                         else loop)


@tvm.tirx.transform.prim_func_pass(opt_level=0, name="tf_dietcode.ShrinkGuardedLoops")
def ShrinkGuardedLoops(func: tirx.PrimFunc, _mod, _ctx) -> tirx.PrimFunc:  # noqa: N802 (TVM pass naming)
    return func.with_body(shrink_guarded_loops(func.body))


def _guard(body: tir_stmt.Stmt):
    """(bindings, the if) where the body is `Bind*; if cond: ...` with no else, else None."""
    *bindings, last = statements(body)
    if (isinstance(last, tir_stmt.IfThenElse) and last.else_case is None
            and all(isinstance(binding, tir_stmt.Bind) for binding in bindings)):
        return bindings, last
    return None


def _bound(term, var):
    """("upper", u) for a term equivalent to var < u, ("lower", l) for var >= l, else None.
    The term comes simplified, and TVM's simplifier writes every comparison as < or <=."""
    slack = {tirx.LT: 0, tirx.LE: 1}.get(type(term))  # a < b + slack, as integers
    coefficients = sym.detect_linear_equation(term.a - term.b, [var]) if slack is not None else []
    if len(coefficients) != 2 or not isinstance(coefficients[0], tirx.IntImm):
        return None
    scale, rest = int(coefficients[0]), coefficients[1]  # scale * var + rest < slack
    if scale == 1:
        return "upper", slack - rest
    if scale == -1:
        return "lower", rest - slack + 1
    return None


def _shrink(loop: tir_stmt.For, enclosing: tuple) -> tir_stmt.Stmt:
    """The loop with its guard's monotone terms turned into loop bounds and its invariant terms hoisted;
    a bound the enclosing loops already imply (a full tile's fetch inside the loop over full tiles,
    which LoopPartition split off but left checked) is dropped, so the loop keeps its constant extent."""
    guard = _guard(loop.body)
    if guard is None or not isinstance(loop.min, tirx.IntImm) or (loop.step is not None and int(loop.step) != 1):
        return loop
    bindings, branch = guard
    analyzer = sym.Analyzer()  # reads the guard through the loop's bindings, in outer variables and the loop's
    for binding in bindings:
        if integer_valued(binding.value):
            analyzer.bind(binding.var, binding.value)
    scope = in_scope(enclosing)
    var, dtype = loop.loop_var, loop.extent.ty.dtype
    inner = [binding.var for binding in bindings]
    start, end = loop.min, loop.min + loop.extent
    terms, hoisted, kept = conjunction_terms(branch.condition, through_likely=True), [], []
    for term in terms:
        expanded = analyzer.simplify(term)
        if uses(expanded, inner) or not safe_anywhere(expanded):
            bound = None
        else:
            bound = _bound(expanded, var) if uses(expanded, [var]) else ("", expanded)
        if bound is None:
            kept.append(term)
        elif bound[0] == "upper":
            if not always(scope, bound[1] >= end):
                end = tirx.min(end, bound[1].astype(dtype))
        elif bound[0] == "lower":
            if not always(scope, bound[1] <= start):
                start = tirx.max(start, bound[1].astype(dtype))
        else:
            hoisted.append(expanded)
    if len(kept) == len(terms):
        return loop
    simplify = sym.Analyzer().simplify
    guarded = branch.then_case if not kept else tir_stmt.IfThenElse(tvm.tirx.all(*kept), branch.then_case, None)
    body = tir_stmt.SeqStmt([*bindings, guarded]) if bindings else guarded
    start = simplify(start)
    extent = simplify(end - start)
    if not always(scope, extent >= 0):
        extent = simplify(tirx.max(extent, tirx.const(0, dtype)))
    shrunk = with_body(loop, body, start, extent)
    return tir_stmt.IfThenElse(tvm.tirx.all(*hoisted), shrunk, None) if hoisted else shrunk
