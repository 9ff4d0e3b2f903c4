"""What our TIR passes share: helpers that read lowered TIR (scopes, facts an analyzer proves, the
terms of a condition, the shapes of a register tile's write-back) and rebuild it (loops, bodies,
copies with variables of their own). Each pass module holds its pass alone and imports these."""

import tvm
import tvm_ffi
from tvm import sym, tirx
from tvm.sym.analyzer import ProofStrength
from tvm.tirx import stmt as tir_stmt

from tf_dietcode.tuning.micro_kernel import MAX_TILE_ROWS

_LIKELY = tvm.ir.Op.get("prim.likely")
_DIVISIONS = (tirx.FloorDiv, tirx.FloorMod, tirx.Div, tirx.Mod)


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


def whole_vectors_up_to_a_bound(extent, lanes: int) -> tuple[int, tvm.ir.Expr] | None:
    """(W, E) for a trip count `min(W, E)` (or `max(min(W, E), 0)`, as ShrinkGuardedLoops leaves it
    where E may be negative), W a constant multiple of `lanes` and E symbolic (a partial tile's
    columns where N is symbolic); else None."""
    if isinstance(extent, tirx.Max) and isinstance(extent.b, tirx.IntImm) and int(extent.b) == 0:
        extent = extent.a
    if not isinstance(extent, tirx.Min):
        return None
    width, bound = (extent.a, extent.b) if isinstance(extent.a, tirx.IntImm) else (extent.b, extent.a)
    if not isinstance(width, tirx.IntImm) or int(width) % lanes or isinstance(bound, tirx.IntImm):
        return None
    return int(width), bound


def conjunction_terms(condition, through_likely: bool = False) -> list:
    """The terms of a chain of `and`s, in order; through_likely: a `likely(...)` stripped and its own
    terms taken (a schedule's predicates keep their `likely`, which tells LoopPartition where to split)."""
    if isinstance(condition, tirx.And):
        return conjunction_terms(condition.a, through_likely) + conjunction_terms(condition.b, through_likely)
    if through_likely and isinstance(condition, tvm.ir.Call) and condition.op.same_as(_LIKELY):
        return conjunction_terms(condition.args[0], through_likely)
    return [condition]


def safe_anywhere(expr) -> bool:
    """Whether expr can be evaluated whatever its variables hold: no division by a non-constant
    (unknown kinds of node count as unsafe)."""
    if isinstance(expr, (tirx.Var, tirx.IntImm, tirx.FloatImm)):
        return True
    if isinstance(expr, _DIVISIONS) and not isinstance(expr.b, tirx.IntImm):
        return False
    if hasattr(expr, "a") and hasattr(expr, "b"):  # binary operators and comparisons
        return safe_anywhere(expr.a) and safe_anywhere(expr.b)
    if isinstance(expr, tirx.Not):
        return safe_anywhere(expr.a)
    if isinstance(expr, tirx.Cast):
        return safe_anywhere(expr.value)
    if isinstance(expr, tvm.ir.Call) and expr.op.same_as(_LIKELY):
        return safe_anywhere(expr.args[0])
    return False


def uses(expr, variables) -> bool:
    """Whether expr reads any of `variables`."""
    return any(used.same_as(var) for used in tvm.tirx.analysis.undefined_vars(expr, []) for var in variables)


def integer_valued(expr) -> bool:
    """Whether expr is an integer (an index, an extent): what an analyzer may be told about."""
    return str(getattr(expr.ty, "dtype", "")).startswith("int")


def in_scope(enclosing: tuple) -> sym.Analyzer:
    """An analyzer that knows the enclosing loops' ranges and the bindings in scope."""
    analyzer = sym.Analyzer()
    for outer in enclosing:
        if isinstance(outer, tir_stmt.For):
            analyzer.bind(outer.loop_var, tvm.ir.Range.from_min_extent(outer.min, outer.extent))
        elif integer_valued(outer.value) and safe_anywhere(outer.value):  # arithmetic, not the argument unpacking
            analyzer.bind(outer.var, outer.value)
    return analyzer


def always(analyzer: sym.Analyzer, fact) -> bool:
    return analyzer.can_prove(fact, ProofStrength.SYMBOLIC_BOUND)


def reads(node, buffer: tirx.Buffer) -> bool:
    """Whether the node loads from `buffer`."""
    loads = []
    tvm_ffi.structural_walk(node, (tvm.ir.TensorLoad, loads.append))
    return any(load.source.same_as(buffer) for load in loads)


def row_count(write_back: tir_stmt.Stmt, scope=None):
    """(C, the count) for a loop over `min(C, E)` rows with 2 <= C <= MAX_TILE_ROWS (a larger count
    is not a register tile's write-back), or, given the `scope`, over E rows that it bounds by such
    a C (the smallest); else None."""
    if not isinstance(write_back, tir_stmt.For) or isinstance(write_back.extent, tirx.IntImm):
        return None
    if not isinstance(write_back.extent, tirx.Min):
        bound = next((rows for rows in range(2, MAX_TILE_ROWS + 1)
                      if scope is not None and always(scope, write_back.extent <= rows)), None)
        return None if bound is None else (bound, write_back.extent)
    constant = [term for term in (write_back.extent.a, write_back.extent.b) if isinstance(term, tirx.IntImm)]
    if len(constant) != 1 or not 2 <= int(constant[0]) <= MAX_TILE_ROWS:
        return None
    return int(constant[0]), write_back.extent
