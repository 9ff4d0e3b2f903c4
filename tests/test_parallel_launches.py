"""MergeParallelLaunches: the partitions LoopPartition makes of a dense kernel's parallel loop run
as one launch, each task taking its share of every partition, and the kernels compute the product
at every row count (no whole row tile, whole tiles only, whole tiles and a partial one)."""

import pytest
from tvm import tirx
from tvm.tirx import stmt as tir_stmt

from lowered_kernels import assert_computes_the_product, build_seen_after, nodes, parallel_loops
from tf_dietcode.tuning.micro_kernel import MicroKernel
from tf_dietcode.tuning.tir_passes import parallel_launches
from tf_dietcode.tuning.tir_passes.markers import LAUNCH_POINT
from tf_dietcode.tuning.workload import Workload

IN_PLACE = Workload("dense", (1, 40), 96, 64, bias=True, weight_layout="in_place")
PACKED = Workload("dense", (1, 40), 96, 64, activation="relu", weight_layout="packed")
CASES = [
    (IN_PLACE, MicroKernel(2, 16, 32, 2, False)),                 # row and column tasks, weight in place
    (IN_PLACE, MicroKernel(3, 16, 64, 1, True, task_m=4)),        # row tasks of 4 tiles sharing a copied panel
    (PACKED, MicroKernel(4, 16, 32, 1, True, packed=True)),       # packed weight
]


def _launches(body) -> int:
    """How many statements launch tasks: launch points, and parallel loops outside any."""
    points = [n for n in nodes(body, tir_stmt.AttrStmt) if n.attr_key == LAUNCH_POINT]
    inside = sum(len(parallel_loops(point.body)) for point in points)
    return len(points) + len(parallel_loops(body)) - inside


@pytest.mark.parametrize("workload,kernel", CASES, ids=lambda c: getattr(c, "name", None))
def test_the_partitions_of_a_parallel_loop_run_in_one_launch(workload, kernel):
    _, before = build_seen_after("tf_dietcode.OwnRowPointers", workload, kernel)
    assert len(parallel_loops(before.body)) == 2 and _launches(before.body) == 2  # the premise
    executable, after = build_seen_after("tf_dietcode.MergeParallelLaunches", workload, kernel)
    assert _launches(after.body) == 1
    assert len(parallel_loops(after.body)) == 2  # each task still takes its share of each partition
    assert_computes_the_product(executable, workload, kernel, [1, 2, 3, 4, 5, 7, 11, 12, 13, 24, 37, 40])


def _store_loop(name: str) -> tir_stmt.For:
    """for <name> in parallel(8): out[<name>] = 1"""
    var = tirx.Var(name, "int64")
    out = tirx.decl_buffer([8], "float32", "out")
    return tir_stmt.For(var, tirx.const(0, "int64"), tirx.const(8, "int64"), tir_stmt.ForKind.PARALLEL,
                        tir_stmt.BufferStore(out, tirx.const(1.0, "float32"), [var]))


def test_only_loops_over_one_variable_share_a_launch():
    """Parallel loops over different variables may depend on each other and keep their launches;
    partitions (distinct variables of one name, as LoopPartition leaves them) share one."""
    apart = tir_stmt.SeqStmt([_store_loop("i"), _store_loop("j")])
    assert parallel_launches.merge_launches(apart).same_as(apart)
    merged = parallel_launches.merge_launches(tir_stmt.SeqStmt([_store_loop("i"), _store_loop("i")]))
    assert isinstance(merged, tir_stmt.AttrStmt) and merged.attr_key == LAUNCH_POINT
    assert len(parallel_loops(merged)) == 2
