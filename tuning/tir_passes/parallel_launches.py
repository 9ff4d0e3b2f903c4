"""A TIR pass that runs the partitions of one parallel loop as one parallel launch.

Why: where a dense kernel's tasks run row tiles (task_m > 0), LoopPartition
splits the parallel loop into one over the tasks of whole row tiles and one over
those of the partial last tile, and TVM's codegen
launches each parallel loop on its own: two launches and two joins per call, the
first with no iteration at all where M is below one row tile. On TVM's spinning
pool a join costs a few microseconds; in the ops, on TF's intra-op pool, each
launch hands its tasks to pool threads and waits for them (tens of microseconds
on the 2-core machines measured, docs/decisions.md "Threads"). The pass puts consecutive
parallel loops over one variable (a loop's partitions: LoopPartition keeps its
variable's name) in one launch point, after the per-task allocations and
bindings each had (task_scratch's launch points): TVM's codegen then runs one
launch whose every task takes its share of each loop in turn, as the separate
launches shared them. (One loop over both parts' iterations instead gave the
whole tiles to one task and the partial tile's to the other: dense batch 1's
`m4_n24_k768_t1_ko_p` ran 1.14x as long at M = 5 on TVM's pool.)
"""

import tvm
import tvm_ffi
from tvm import tirx
from tvm.tirx import stmt as tir_stmt

from tf_dietcode.tuning.tir_passes.ir import sequence, statements
from tf_dietcode.tuning.tir_passes.markers import LAUNCH_POINT

PER_TASK = (tir_stmt.AllocBuffer, tir_stmt.Bind)  # what a launch point runs once per task before its loop


def _launch(statement: tir_stmt.Stmt) -> tuple[list, list] | None:
    """(the per-task statements, [the parallel loop]) of one launch: a parallel loop, alone or in a
    launch point after its per-task statements; else None."""
    head, loop = [], statement
    if isinstance(statement, tir_stmt.AttrStmt) and statement.attr_key == LAUNCH_POINT:
        *head, loop = statements(statement.body)
    if not (isinstance(loop, tir_stmt.For) and loop.kind == tir_stmt.ForKind.PARALLEL
            and all(isinstance(part, PER_TASK) for part in head)):
        return None
    return head, [loop]


def _statement(launch: tuple[list, list]) -> tir_stmt.Stmt:
    """The launch as a statement: its loop alone, or a launch point over its per-task statements and loops."""
    head, loops = launch
    if not head and len(loops) == 1:
        return loops[0]
    return tir_stmt.AttrStmt(loops[0].loop_var, LAUNCH_POINT, tirx.const(1, "int32"), sequence([*head, *loops]))


def merge_launches(block: tir_stmt.SeqStmt) -> tir_stmt.Stmt:
    """The sequence with each run of consecutive launches of one loop variable made one launch."""
    parts, pending = [], None
    for statement in block.seq:
        launch = _launch(statement)
        if pending is not None and launch is not None and launch[1][0].loop_var.name == pending[1][0].loop_var.name:
            pending = ([*pending[0], *launch[0]], [*pending[1], *launch[1]])
            continue
        if pending is not None:
            parts.append(_statement(pending))
        pending = launch
        if launch is None:
            parts.append(statement)
    if pending is not None:
        parts.append(_statement(pending))
    return block if len(parts) == len(block.seq) else sequence(parts)


@tvm.tirx.transform.prim_func_pass(opt_level=0, name="tf_dietcode.MergeParallelLaunches")
def MergeParallelLaunches(func: tirx.PrimFunc, _mod, _ctx) -> tirx.PrimFunc:  # noqa: N802 (TVM pass naming)
    return func.with_body(tvm_ffi.structural_map(func.body, [(tir_stmt.SeqStmt, merge_launches)]))
