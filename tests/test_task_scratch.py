"""AllocatePerTask: a parallel loop's scratch tiles are allocated once per task,
with what depends on the iteration left inside the loop, and kernels built so
compute what they computed before."""

import pytest
import tvm_ffi
from tvm import tirx
from tvm.tirx import stmt as tir_stmt

from lowered_kernels import assert_computes_the_product, build_seen_after
from tf_dietcode.tuning.micro_kernel import MicroKernel
from tf_dietcode.tuning.tir_passes import task_scratch
from tf_dietcode.tuning.tir_passes.markers import LAUNCH_POINT
from tf_dietcode.tuning.workload import Workload


def _sequence(statement) -> list:
    return list(statement.seq) if isinstance(statement, tir_stmt.SeqStmt) else [statement]


def _parallel_loop(kind=tir_stmt.ForKind.PARALLEL):
    """for i in parallel(8): a tile sized by n (invariant), one sized by i, a binding that reads memory."""
    n, i = tirx.Var("n", "int64"), tirx.Var("i", "int64")
    size, row, first = tirx.Var("size", "int64"), tirx.Var("row", "int64"), tirx.Var("first", "float32")
    source = tirx.decl_buffer([n], "float32", "source")
    tile = tirx.decl_buffer([size], "float32", "tile")
    per_row = tirx.decl_buffer([row + 1], "float32", "per_row")
    body = tir_stmt.SeqStmt([
        tir_stmt.Bind(size, n + 7),
        tir_stmt.AllocBuffer(tile),
        tir_stmt.Bind(row, i * n),
        tir_stmt.AllocBuffer(per_row),
        tir_stmt.Bind(first, source[0]),
        tir_stmt.BufferStore(tile, first, [i]),
        tir_stmt.BufferStore(per_row, first, [row]),
    ])
    return tir_stmt.For(i, tirx.const(0, "int64"), tirx.const(8, "int64"), kind, body)


def test_invariant_allocations_move_to_the_launch_point():
    loop = _parallel_loop()
    hoisted = task_scratch.allocate_per_task(loop)
    assert isinstance(hoisted, tir_stmt.AttrStmt) and hoisted.attr_key == LAUNCH_POINT
    *per_task, parallel = _sequence(hoisted.body)
    assert [type(s) for s in per_task] == [tir_stmt.Bind, tir_stmt.AllocBuffer]
    assert per_task[1].buffer.name == "tile"
    assert isinstance(parallel, tir_stmt.For) and parallel.kind == tir_stmt.ForKind.PARALLEL
    inside = _sequence(parallel.body)
    assert [s.buffer.name for s in inside if isinstance(s, tir_stmt.AllocBuffer)] == ["per_row"]  # sized by i
    assert len(inside) == 5  # the binding that reads memory stays too


def test_loops_with_nothing_to_hoist_are_left_alone():
    serial = _parallel_loop(tir_stmt.ForKind.SERIAL)
    assert task_scratch.allocate_per_task(serial).same_as(serial)
    parallel = _parallel_loop()
    binding_only = tir_stmt.SeqStmt([parallel.body.seq[0], tir_stmt.Evaluate(tirx.const(0, "int32"))])
    without_tiles = tir_stmt.For(parallel.loop_var, parallel.min, parallel.extent, parallel.kind, binding_only)
    assert task_scratch.allocate_per_task(without_tiles).same_as(without_tiles)


# Batch matmul NT fetches a y tile per column task; b=5 splits unevenly between tasks.
NT = Workload("batch_matmul", (1, 40), (1, 40), 64, b=5, ties=("m", "n"))


@pytest.mark.parametrize("kernel", [MicroKernel(2, 32, 8, 1, False, whole_batch=True),
                                    MicroKernel(4, 16, 32, 2, True)], ids=lambda kernel: kernel.name)
def test_kernels_allocating_per_task_compute_the_product(kernel):
    executable, main = build_seen_after("tf_dietcode.AllocatePerTask", NT, kernel)
    launch_points = []
    tvm_ffi.structural_walk(main.body, (tir_stmt.AttrStmt, lambda node: launch_points.append(node)
                                        if node.attr_key == LAUNCH_POINT else None))
    assert launch_points, "the kernel's tiles are still allocated in every iteration"
    assert_computes_the_product(executable, NT, kernel, (1, 2, 7, 8, 9, 31, 40))
