"""SpecializeRemainderRows: a symbolic kernel's last, partial row tile gets one copy per
row count (and a row loop that also runs whole tiles, one for those), each writing back a
constant number of rows, and the kernels so built compute the product at every remainder."""

import pytest
from tvm import tirx
from tvm.tirx import stmt as tir_stmt

from lowered_kernels import assert_computes_the_product, build_seen_after, nodes, small_reduction_copies
from tf_dietcode.tuning.micro_kernel import MicroKernel
from tf_dietcode.tuning.workload import Workload

DENSE = Workload("dense", (1, 40), 96, 64, bias=True, activation="relu", weight_layout="packed")
NT = Workload("batch_matmul", (1, 40), (1, 40), 64, b=3, ties=("m", "n"))
NN = Workload("batch_matmul", (1, 40), 64, (1, 40), b=3, transpose_b=False, ties=("m", "k"))


def _row_count_branches(body, rows: int) -> list[int]:
    """The fixed counts of the branches `min(rows, E) == count`, sorted."""
    counts = []
    for branch in nodes(body, tir_stmt.IfThenElse):
        condition = branch.condition
        if (isinstance(condition, tirx.EQ) and isinstance(condition.a, tirx.Min)
                and isinstance(condition.b, tirx.IntImm)
                and rows in [int(t) for t in (condition.a.a, condition.a.b) if isinstance(t, tirx.IntImm)]):
            counts.append(int(condition.b))
    return sorted(counts)


def test_the_dense_remainder_is_copied_once_per_row_count():
    kernel = MicroKernel(6, 16, 32, 1, False, packed=True, task_m=0)
    executable, main = build_seen_after("tf_dietcode.SpecializeRemainderRows", DENSE, kernel)
    assert _row_count_branches(main.body, kernel.tile_m) == [1, 2, 3, 4, 5]
    # each copy writes back a constant number of rows; the general write-back stays for the rest
    extents = [loop.extent for loop in nodes(main.body, tir_stmt.For)]
    for rows in range(1, kernel.tile_m):
        assert any(isinstance(e, tirx.IntImm) and int(e) == rows for e in extents), rows
    assert any(isinstance(e, tirx.Min) for e in extents)
    # every loop variable is defined once (the copies' renamed): LLVM's code generation requires it
    loop_vars = [loop.loop_var for loop in nodes(main.body, tir_stmt.For)]
    assert not any(a.same_as(b) for i, a in enumerate(loop_vars) for b in loop_vars[i + 1:])
    assert_computes_the_product(executable, DENSE, kernel, range(1, 41))


@pytest.mark.parametrize("workload, kernel", [(NT, MicroKernel(4, 16, 32, 1, True, whole_batch=True)),
                                              (NT, MicroKernel(3, 32, 64, 1, False)),
                                              (NN, MicroKernel(5, 16, 16, 1, True))],
                         ids=lambda value: getattr(value, "name", None))
def test_batch_matmul_kernels_compute_the_product_at_every_remainder(workload, kernel):
    executable, main = build_seen_after("tf_dietcode.SpecializeRemainderRows", workload, kernel)
    # a copy per count in each remainder; the row loop of a whole batch's last column task (N
    # symbolic: NT), which runs whole row tiles too, has a copy for them as well
    counts = _row_count_branches(main.body, kernel.tile_m)
    assert set(counts) - {kernel.tile_m} == set(range(1, kernel.tile_m))
    assert counts.count(kernel.tile_m) == (1 if kernel.whole_batch and not workload.n.static else 0)
    assert_computes_the_product(executable, workload, kernel, range(1, 41))


def test_a_count_known_where_the_rows_are_copied_gets_that_copy_alone():
    """In small_reductions' copy for M = K = 3 the remainder has 3 rows: one copy, no branches to the
    counts it cannot have (LLVM dropped them, but compiled them first)."""
    kernel = MicroKernel(5, 16, 16, 1, True)
    executable, main = build_seen_after("tf_dietcode.SpecializeRemainderRows", NN, kernel)
    copy = small_reduction_copies(main.body)[("K", "M"), 3]
    assert not _row_count_branches(copy, kernel.tile_m)
    assert_computes_the_product(executable, NN, kernel, [1, 3, 5, 7])


def test_static_builds_are_left_alone():
    """A static build's remainder writes back a constant count already."""
    kernel = MicroKernel(6, 16, 32, 1, False, packed=True, task_m=0)
    _, main = build_seen_after("tf_dietcode.SpecializeRemainderRows", DENSE, kernel, DENSE.dims_at((37,)))
    assert not _row_count_branches(main.body, kernel.tile_m)
