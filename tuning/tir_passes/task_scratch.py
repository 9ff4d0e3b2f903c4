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
"""

import tvm
import tvm_ffi
from tvm import tirx
from tvm.tirx import stmt as tir_stmt

from tf_dietcode.tuning.tir_passes.ir import sequence, statements, uses, with_body
from tf_dietcode.tuning.tir_passes.markers import LAUNCH_POINT


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
    parallel = with_body(loop, sequence(kept))
    return tir_stmt.AttrStmt(loop.loop_var, LAUNCH_POINT, tirx.const(1, "int32"), tir_stmt.SeqStmt([*hoisted, parallel]))


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
    return func.with_body(tvm_ffi.structural_map(func.body, [(tir_stmt.For, allocate_per_task)]))
