"""A TIR pass that allocates a parallel loop's scratch tiles once per task
instead of once per iteration.

Why: the schedule places each local tile (the fetched x and y blocks) inside
the parallel loop, and TVM's LLVM backend runs a parallel loop as a few tasks
(one per thread), each iterating over its chunk. A tile of symbolic size, or of
1 KiB or more, becomes a TVMBackendAllocWorkspace / TVMBackendFreeWorkspace
pair, so every iteration paid for both: batch matmul NN's symbolic kernels,
whose tiles span the dynamic K, took up to 1.76x the time of the same
micro-kernel compiled for a static shape at T = 1. Every iteration writes a
tile before it reads it, so one allocation can serve all the iterations of a
task. The pass moves the allocations at the head of the loop body (with the
loop-invariant bindings their sizes use) in front of the loop and marks that
point as the parallel launch (`pragma_parallel_launch_point`): TVM's codegen
then runs the allocations once in each task and splits the loop's iterations
among the tasks as it does for any parallel loop.

A tile's zero padding along the reduction (past a dynamic K) moves there too,
written once per task instead of once per fetch: templates.copy_inside_bounds
marks those fills (PADDING_FILL), and by construction nothing else writes
their elements (the fetch copies only inside the bounds, the compute only
reads), so the zeros stay for the task's whole life. A fill moves where its
region is the same in every iteration: its bindings substituted, neither it
nor a condition it runs under uses a loop variable of the parallel loop's
body; it keeps those conditions. Batch matmul NN's kernels zeroed their x
tile's padding at every row tile, in the symbolic build a libc memset or a
short loop of unknown length: with the fill once per task, four NN kernels
of BERT's [192,T,T]x[192,T,64] ran 0.68-0.90x of their time at T = 1-5,
0.83-0.94x at T = 17 and within noise at T = 62-128 (symbolic builds, AVX-512
VM, interleaved); static builds gained 0.68-0.93x at T = 1-5.
"""

import tvm
import tvm_ffi
from tvm import tirx
from tvm.tirx import stmt as tir_stmt

from tf_dietcode.tuning.guarded_loops import statements, uses, with_body

LAUNCH_POINT = "pragma_parallel_launch_point"  # codegen_cpu.cc: the parallel tasks start here
PADDING_FILL = "pragma_tf_dietcode_padding_fill"  # marks a zero fill of a tile's reduction padding
_BUFFER_DATA = tvm.ir.Op.get("tirx.buffer_data")


def allocate_per_task(loop: tir_stmt.For) -> tir_stmt.Stmt:
    """The parallel loop with its leading tile allocations hoisted into a per-task launch point,
    or the loop unchanged when it allocates nothing at its head."""
    if loop.kind != tir_stmt.ForKind.PARALLEL:
        return loop
    per_iteration = [loop.loop_var]  # vars whose value may change from one iteration to the next
    hoisted, kept = [], []
    for statement in statements(loop.body):
        if _invariant(statement, per_iteration):
            hoisted.append(statement)
        else:
            kept.append(statement)
            if isinstance(statement, tir_stmt.Bind):
                per_iteration.append(statement.var)
    tiles = [statement.buffer for statement in hoisted if isinstance(statement, tir_stmt.AllocBuffer)]
    if not tiles:
        return loop
    fills = []
    body = _take_fills(_sequence(kept), _Scope(tiles, per_iteration), fills) or _sequence([])
    parallel = with_body(loop, body)
    return tir_stmt.AttrStmt(loop.loop_var, LAUNCH_POINT, tirx.const(1, "int32"),
                             tir_stmt.SeqStmt([*hoisted, *fills, parallel]))


def _sequence(parts: list[tir_stmt.Stmt]) -> tir_stmt.Stmt:
    """The statements as one: a SeqStmt, the single one, or a no-op where none is left."""
    if not parts:
        return tir_stmt.Evaluate(tirx.const(0, "int32"))
    return parts[0] if len(parts) == 1 else tir_stmt.SeqStmt(parts)


class _Scope:
    """What a walk of the parallel loop's body knows: the per-task tiles, the values of the
    bindings seen so far (in terms of outer variables), the variables set per iteration and
    the conditions the current statement runs under."""

    def __init__(self, tiles: list[tir_stmt.Buffer], per_iteration: list[tirx.Var]):
        self.tiles, self.per_iteration, self.values, self.conditions = tiles, list(per_iteration), [], []
        self.aliases = [(tile, tile) for tile in tiles]  # (buffer, the tile whose storage it names)

    def declare(self, declaration: tir_stmt.DeclBuffer) -> None:
        """Note a buffer declared over a tile's storage as it is (LoopPartition's copies declare such aliases)."""
        data = declaration.data
        if isinstance(data, tvm.ir.Call) and data.op.same_as(_BUFFER_DATA):
            tile = next((tile for tile in self.tiles if tile.same_as(data.args[0])), None)
            if tile is not None and tvm_ffi.structural_equal(tile.ty, declaration.buffer.ty):
                self.aliases.append((declaration.buffer, tile))

    def substitute(self, node):
        """The node with every binding seen so far replaced by its value."""
        def value_of(var):
            return next((value for bound, value in reversed(self.values) if bound.same_as(var)), var)
        return tvm_ffi.structural_map(node, (tirx.Var, value_of))

    def tile(self, buffer: tir_stmt.Buffer):
        """The per-task tile that `buffer` is or aliases, or None."""
        return next((tile for alias, tile in self.aliases if alias.same_as(buffer)), None)


def _take_fills(stmt: tir_stmt.Stmt, scope: _Scope, fills: list) -> tir_stmt.Stmt | None:
    """The statement without the marked fills that can run once per task (appended to `fills`,
    rewritten to store into the tiles as allocated); None where nothing is left of it."""
    if isinstance(stmt, tir_stmt.SeqStmt):
        parts = [part for part in (_take_fills(child, scope, fills) for child in stmt.seq) if part is not None]
        return _sequence(parts) if parts else None
    if isinstance(stmt, tir_stmt.Bind):
        scope.values.append((stmt.var, scope.substitute(stmt.value)))
        scope.per_iteration.append(stmt.var)
        return stmt
    if isinstance(stmt, tir_stmt.DeclBuffer):
        scope.declare(stmt)
        return stmt
    if isinstance(stmt, tir_stmt.For):
        scope.per_iteration.append(stmt.loop_var)
        return with_body(stmt, _take_fills(stmt.body, scope, fills) or _sequence([]))
    if isinstance(stmt, tir_stmt.IfThenElse):
        then_case = _under(stmt.condition, stmt.then_case, scope, fills) or _sequence([])
        else_case = None if stmt.else_case is None else _under(tirx.Not(stmt.condition), stmt.else_case, scope, fills)
        return tir_stmt.IfThenElse(stmt.condition, then_case, else_case)
    if isinstance(stmt, tir_stmt.AttrStmt) and stmt.attr_key == PADDING_FILL:
        fill = _once_per_task(scope.substitute(stmt.body), scope)
        if fill is None:
            return stmt
        fills.append(fill)
        return None
    if isinstance(stmt, tir_stmt.AttrStmt):
        return tir_stmt.AttrStmt(stmt.node, stmt.attr_key, stmt.value,
                                 _take_fills(stmt.body, scope, fills) or _sequence([]))
    return stmt


def _under(condition, stmt: tir_stmt.Stmt, scope: _Scope, fills: list) -> tir_stmt.Stmt | None:
    """_take_fills of a branch, with the branch's condition in scope."""
    scope.conditions.append(condition)
    try:
        return _take_fills(stmt, scope, fills)
    finally:
        scope.conditions.pop()


def _once_per_task(fill: tir_stmt.Stmt, scope: _Scope) -> tir_stmt.Stmt | None:
    """The fill storing into the tiles as allocated, under the conditions it ran under, or None
    where it cannot move out of the loop: it or a condition depends on the iteration or reads
    memory, or it stores into anything but a per-task tile."""
    stores = []
    tvm_ffi.structural_walk(fill, (tir_stmt.BufferStore, stores.append))
    conditions = [scope.substitute(condition) for condition in scope.conditions]
    if any(uses(part, scope.per_iteration) or not _arithmetic(part) for part in (fill, *conditions)) \
            or any(scope.tile(s.buffer) is None for s in stores):
        return None
    fill = tvm_ffi.structural_map(
        fill, (tir_stmt.BufferStore, lambda store: tir_stmt.BufferStore(scope.tile(store.buffer), store.value,
                                                                        store.indices)))
    for condition in reversed(conditions):
        fill = tir_stmt.IfThenElse(condition, fill, None)
    return fill


def _strip_marks(func_body: tir_stmt.Stmt) -> tir_stmt.Stmt:
    """The body without the fills' marks (codegen warns of unknown pragmas)."""
    return tvm_ffi.structural_map(func_body, (tir_stmt.AttrStmt, lambda attr: attr.body
                                              if attr.attr_key == PADDING_FILL else attr))


def _invariant(statement: tir_stmt.Stmt, per_iteration: list[tirx.Var]) -> bool:
    """Whether a binding's value, or an allocation's shape, is the same in every iteration: it uses
    none of the per-iteration vars and reads no memory (a load may see what an iteration wrote)."""
    if isinstance(statement, tir_stmt.Bind):
        expressions = [statement.value]
    elif isinstance(statement, tir_stmt.AllocBuffer):
        expressions = list(statement.buffer.shape)
    else:
        return False
    return all(_arithmetic(expression) and not uses(expression, per_iteration) for expression in expressions)


def _arithmetic(expression: tvm.ir.Expr) -> bool:
    """Whether the expression is arithmetic on vars and constants only: no load, no call."""
    impure = []
    tvm_ffi.structural_walk(expression, ((tvm.ir.TensorLoad, tvm.ir.Call), impure.append))
    return not impure


@tvm.tirx.transform.prim_func_pass(opt_level=0, name="tf_dietcode.AllocatePerTask")
def AllocatePerTask(func: tirx.PrimFunc, _mod, _ctx) -> tirx.PrimFunc:  # noqa: N802 (TVM pass naming)
    return func.with_body(_strip_marks(tvm_ffi.structural_map(func.body, [(tir_stmt.For, allocate_per_task)])))
