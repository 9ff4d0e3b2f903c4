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
[192,T,T]x[192,T,64]; dense within 1%; Zen 1 VM, interleaved).
"""

import tvm
import tvm_ffi
from tvm import sym, tirx
from tvm.sym.analyzer import ProofStrength
from tvm.tirx import stmt as tir_stmt

_LIKELY = tvm.ir.Op.get("prim.likely")


def rebuild_loops(stmt: tir_stmt.Stmt, rewrite, enclosing: tuple = ()) -> tir_stmt.Stmt:
    """The statement with every loop rebuilt bottom-up: `rewrite(loop, enclosing)` gets the loop with
    its body already rebuilt, and what is in scope around it, outermost first: the enclosing loops
    and the bindings (`Bind`) before it (`loops` picks the loops)."""
    if isinstance(stmt, tir_stmt.SeqStmt):
        children, scope = [], enclosing
        for child in stmt.seq:
            children.append(rebuild_loops(child, rewrite, scope))
            if isinstance(child, tir_stmt.Bind):
                scope = (*scope, child)
        return tir_stmt.SeqStmt(children)
    if isinstance(stmt, tir_stmt.IfThenElse):
        return tir_stmt.IfThenElse(stmt.condition, rebuild_loops(stmt.then_case, rewrite, enclosing),
                                   None if stmt.else_case is None
                                   else rebuild_loops(stmt.else_case, rewrite, enclosing))
    if isinstance(stmt, tir_stmt.AttrStmt):
        return tir_stmt.AttrStmt(stmt.node, stmt.attr_key, stmt.value, rebuild_loops(stmt.body, rewrite, enclosing))
    if isinstance(stmt, tir_stmt.While):
        return tir_stmt.While(stmt.condition, rebuild_loops(stmt.body, rewrite, enclosing))
    if isinstance(stmt, tir_stmt.For):
        return rewrite(with_body(stmt, rebuild_loops(stmt.body, rewrite, (*enclosing, stmt))), enclosing)
    return stmt


def loops(enclosing: tuple) -> list[tir_stmt.For]:
    """The loops among what rebuild_loops finds in scope."""
    return [outer for outer in enclosing if isinstance(outer, tir_stmt.For)]


def shrink_guarded_loops(stmt: tir_stmt.Stmt) -> tir_stmt.Stmt:
    """The statement with every guarded serial loop rewritten to iterate only where the guard holds."""
    return rebuild_loops(stmt, lambda loop, enclosing: _shrink(loop, enclosing) if loop.kind == tir_stmt.ForKind.SERIAL
                         else loop)


@tvm.tirx.transform.prim_func_pass(opt_level=0, name="tf_dietcode.ShrinkGuardedLoops")
def ShrinkGuardedLoops(func: tirx.PrimFunc, _mod, _ctx) -> tirx.PrimFunc:  # noqa: N802 (TVM pass naming)
    return func.with_body(shrink_guarded_loops(func.body))


def with_body(loop: tir_stmt.For, body: tir_stmt.Stmt, min_=None, extent=None, annotations=None) -> tir_stmt.For:
    """The loop with a new body (and, if given, a new start, trip count or annotations), all else kept."""
    return tir_stmt.For(loop.loop_var, loop.min if min_ is None else min_, loop.extent if extent is None else extent,
                        loop.kind, body, loop.thread_binding, loop.annotations if annotations is None else annotations,
                        loop.step)


def statements(body: tir_stmt.Stmt) -> list[tir_stmt.Stmt]:
    """A lowered body as a list of statements (a SeqStmt's children, or the body alone)."""
    return list(body.seq) if isinstance(body, tir_stmt.SeqStmt) else [body]


def sequence(parts: list[tir_stmt.Stmt]) -> tir_stmt.Stmt:
    """The statements as one: a SeqStmt, the single one (TVM forbids a SeqStmt of one), or a no-op
    where none is left."""
    if not parts:
        return tir_stmt.Evaluate(tirx.const(0, "int32"))
    return parts[0] if len(parts) == 1 else tir_stmt.SeqStmt(parts)


def whole_vectors_up_to_a_bound(extent, lanes: int) -> tuple[int, tvm.ir.Expr] | None:
    """(W, E) for a trip count `min(W, E)` (or `max(min(W, E), 0)`, as _shrink leaves it where E
    may be negative), W a constant multiple of `lanes` and E symbolic (a partial tile's columns
    where N is symbolic); else None."""
    if isinstance(extent, tirx.Max) and isinstance(extent.b, tirx.IntImm) and int(extent.b) == 0:
        extent = extent.a
    if not isinstance(extent, tirx.Min):
        return None
    width, bound = (extent.a, extent.b) if isinstance(extent.a, tirx.IntImm) else (extent.b, extent.a)
    if not isinstance(width, tirx.IntImm) or int(width) % lanes or isinstance(bound, tirx.IntImm):
        return None
    return int(width), bound


def substituted(node, var: tirx.Var, value):
    """The statement or expression with `value` in place of each use of `var`."""
    return tvm_ffi.structural_map(node, (tirx.Var, lambda used: value if used.same_as(var) else used))


def defined_vars(nest: tir_stmt.Stmt) -> list[tirx.Var]:
    """The variables a loop nest defines: its loops' variables and its bindings'."""
    found = []
    tvm_ffi.structural_walk(nest, ((tir_stmt.For, tir_stmt.Bind), found.append))
    return [node.loop_var if isinstance(node, tir_stmt.For) else node.var for node in found]


def fresh_vars(nest: tir_stmt.Stmt) -> tir_stmt.Stmt:
    """A copy of a loop nest with loop variables and bindings of its own: TVM's passes refuse one
    variable bound twice (by two loops over different ranges)."""
    fresh = {var: tirx.Var(var.name, var.ty.dtype) for var in defined_vars(nest)}
    return tvm_ffi.structural_map(nest, (tirx.Var, lambda var: next(
        (new for old, new in fresh.items() if old.same_as(var)), var)))


def _guard(body: tir_stmt.Stmt):
    """(bindings, the if) where the body is `Bind*; if cond: ...` with no else, else None."""
    *bindings, last = statements(body)
    if (isinstance(last, tir_stmt.IfThenElse) and last.else_case is None
            and all(isinstance(binding, tir_stmt.Bind) for binding in bindings)):
        return bindings, last
    return None


def _terms(condition) -> list:
    """The terms of a chain of `and`s, `likely` stripped."""
    if isinstance(condition, tirx.And):
        return _terms(condition.a) + _terms(condition.b)
    if isinstance(condition, tvm.ir.Call) and condition.op.same_as(_LIKELY):
        return _terms(condition.args[0])
    return [condition]


_DIVISIONS = (tirx.FloorDiv, tirx.FloorMod, tirx.Div, tirx.Mod)


def _safe_anywhere(expr) -> bool:
    """Whether expr can be evaluated whatever its variables hold: no division by a non-constant
    (unknown kinds of node count as unsafe)."""
    if isinstance(expr, (tirx.Var, tirx.IntImm, tirx.FloatImm)):
        return True
    if isinstance(expr, _DIVISIONS) and not isinstance(expr.b, tirx.IntImm):
        return False
    if hasattr(expr, "a") and hasattr(expr, "b"):  # binary operators and comparisons
        return _safe_anywhere(expr.a) and _safe_anywhere(expr.b)
    if isinstance(expr, tirx.Not):
        return _safe_anywhere(expr.a)
    if isinstance(expr, tirx.Cast):
        return _safe_anywhere(expr.value)
    if isinstance(expr, tvm.ir.Call) and expr.op.same_as(_LIKELY):
        return _safe_anywhere(expr.args[0])
    return False


def uses(expr, variables) -> bool:
    """Whether expr reads any of `variables`."""
    return any(used.same_as(var) for used in tvm.tirx.analysis.undefined_vars(expr, []) for var in variables)


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


def integer_valued(expr) -> bool:
    """Whether expr is an integer (an index, an extent): what an analyzer may be told about."""
    return str(getattr(expr.ty, "dtype", "")).startswith("int")


def in_scope(enclosing: tuple) -> sym.Analyzer:
    """An analyzer that knows the enclosing loops' ranges and the bindings in scope."""
    analyzer = sym.Analyzer()
    for outer in enclosing:
        if isinstance(outer, tir_stmt.For):
            analyzer.bind(outer.loop_var, tvm.ir.Range.from_min_extent(outer.min, outer.extent))
        elif integer_valued(outer.value) and _safe_anywhere(outer.value):  # arithmetic, not the argument unpacking
            analyzer.bind(outer.var, outer.value)
    return analyzer


def always(analyzer: sym.Analyzer, fact) -> bool:
    return analyzer.can_prove(fact, ProofStrength.SYMBOLIC_BOUND)


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
    terms, hoisted, kept = _terms(branch.condition), [], []
    for term in terms:
        expanded = analyzer.simplify(term)
        if uses(expanded, inner) or not _safe_anywhere(expanded):
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
