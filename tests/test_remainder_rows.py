"""SpecializeRemainderRows: a symbolic kernel's last, partial row tile gets one copy per
row count (and a row loop that also runs whole tiles, one for those), each writing back a
constant number of rows, with no write-back of a variable count left behind, and the kernels
so built compute the product at every remainder."""

import pytest
import tvm
from tvm import tirx
from tvm.tirx import stmt as tir_stmt

from lowered_kernels import assert_computes_the_product, build_seen_after, nodes, small_reduction_copies
from tf_dietcode.tuning.micro_kernel import MicroKernel
from tf_dietcode.tuning.workload import Workload

DENSE = Workload("dense", (1, 40), 96, 64, bias=True, activation="relu", weight_layout="packed")
NT = Workload("batch_matmul", (1, 40), (1, 40), 64, b=3, ties=("m", "n"))
NN = Workload("batch_matmul", (1, 40), 64, (1, 40), b=3, transpose_b=False, ties=("m", "k"))


def _row_count_copies(body, rows: int) -> list[tuple[int, tir_stmt.Stmt]]:
    """(count, its copy) of each branch `min(rows, E) == count`."""
    copies = []
    for branch in nodes(body, tir_stmt.IfThenElse):
        condition = branch.condition
        if (isinstance(condition, tirx.EQ) and isinstance(condition.a, tirx.Min)
                and isinstance(condition.b, tirx.IntImm)
                and rows in [int(t) for t in (condition.a.a, condition.a.b) if isinstance(t, tirx.IntImm)]):
            copies.append((int(condition.b), branch.then_case))
    return copies


def _row_count_branches(body, rows: int) -> list[int]:
    """The fixed counts of the branches `min(rows, E) == count`, sorted."""
    return sorted(count for count, _ in _row_count_copies(body, rows))


def test_the_dense_remainder_is_copied_once_per_row_count():
    kernel = MicroKernel(6, 16, 32, 1, False, packed=True, task_m=0)
    executable, main = build_seen_after("tf_dietcode.SpecializeRemainderRows", DENSE, kernel)
    assert _row_count_branches(main.body, kernel.tile_m) == [1, 2, 3, 4, 5]
    # each copy writes back a constant number of rows, and no general write-back stays behind (the
    # copies cover every count from 1 up, and a loop over a variable count kept the tile in memory)
    extents = [loop.extent for loop in nodes(main.body, tir_stmt.For)]
    for rows in range(1, kernel.tile_m):
        assert any(isinstance(e, tirx.IntImm) and int(e) == rows for e in extents), rows
    assert not any(isinstance(e, tirx.Min) for e in extents)
    # each copy of c rows computes those rows alone (LLVM kept the FMAs of rows no write-back reads)
    for rows, copy in _row_count_copies(main.body, kernel.tile_m):
        firsts = [store.indices[0].base if isinstance(store.indices[0], tirx.Ramp) else store.indices[0]
                  for store in nodes(copy, tir_stmt.BufferStore) if store.buffer.name.startswith("acc")]
        constant = [int(first) for first in firsts if isinstance(first, tirx.IntImm)]
        assert constant and max(constant) < rows * kernel.tile_n, (rows, sorted(set(constant)))
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


def _row_write_backs(body) -> list:
    """The loops over a tile's rows that write `out`: each row (after its bindings) one innermost
    loop over the columns, storing to out."""
    def over_columns(row) -> bool:
        *bindings, columns = row.body.seq if isinstance(row.body, tir_stmt.SeqStmt) else [row.body]
        return (all(isinstance(binding, tir_stmt.Bind) for binding in bindings) and isinstance(columns, tir_stmt.For)
                and not nodes(columns.body, tir_stmt.For)
                and any(store.buffer.name.startswith("out") for store in nodes(columns.body, tir_stmt.BufferStore)))
    return [loop for loop in nodes(body, tir_stmt.For) if over_columns(loop)]


@pytest.mark.parametrize("workload, kernel", [(NT, MicroKernel(3, 32, 64, 1, False)),
                                              (DENSE, MicroKernel(6, 16, 32, 1, False, packed=True, task_m=0))],
                         ids=lambda value: getattr(value, "name", None))
def test_no_tile_is_written_back_over_a_variable_count_of_rows(workload, kernel):
    """Also where LoopPartition left a remainder's count without its `min` (`M - 3 * (M // 3)`, NT's
    whole column tasks): a loop over a variable count indexes the tile by a variable, and LLVM then
    kept the tile in memory (remainder_rows says what that cost)."""
    executable, main = build_seen_after("tf_dietcode.SpecializeRemainderRows", workload, kernel)
    write_backs = _row_write_backs(main.body)
    assert write_backs and all(isinstance(loop.extent, tirx.IntImm) for loop in write_backs), \
        [loop.extent for loop in write_backs]
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


def test_a_copy_reads_its_rows_unclamped_and_the_remainder_runs_as_an_if():
    """In the copy of c rows, rows first + i (i < c) lie below M, so the clamp min(first + i, M - 1)
    that kept the fetch inside x goes; and the remainder loop, which runs at most once
    (`(M % 6 + 5) // 6` times), is an `if`."""
    kernel = MicroKernel(6, 16, 128, 1, False, whole_batch=True)
    executable, main = build_seen_after("tf_dietcode.SpecializeRemainderRows", NN, kernel)
    copies = _row_count_copies(main.body, kernel.tile_m)
    assert sorted({count for count, _ in copies}) == [1, 2, 3, 4, 5]
    for count, copy in copies:
        x_indices = [load.indices[0] for load in nodes(copy, tvm.ir.TensorLoad) if load.source.name == "x"]
        assert x_indices and not any(nodes(index, tirx.Min) for index in x_indices), count
    extents = [loop.extent for loop in nodes(main.body, tir_stmt.For)]
    assert not any(isinstance(extent, tirx.FloorDiv) and nodes(extent, tirx.FloorMod) for extent in extents), extents
    assert_computes_the_product(executable, NN, kernel, range(1, 41))
