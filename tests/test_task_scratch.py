"""AllocatePerTask: a parallel loop's scratch tiles are allocated once per task,
with what depends on the iteration left inside the loop, and kernels built so
compute what they computed before."""

import pytest
import tvm
import tvm_ffi
from tvm import tirx
from tvm.tirx import stmt as tir_stmt

from lowered_kernels import assert_computes_the_product, build_seen_after
from tf_dietcode.tuning import task_scratch
from tf_dietcode.tuning.micro_kernel import MicroKernel
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
    assert isinstance(hoisted, tir_stmt.AttrStmt) and hoisted.attr_key == task_scratch.LAUNCH_POINT
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


# Batch matmul NN allocates tiles spanning its dynamic K in every iteration; b=5 splits unevenly between tasks.
NN = Workload("batch_matmul", (1, 40), 64, (1, 40), b=5, transpose_b=False, ties=("m", "k"))


@pytest.mark.parametrize("kernel", [MicroKernel(2, 32, 8, 1, False, whole_batch=True),
                                    MicroKernel(4, 16, 32, 2, True)], ids=lambda kernel: kernel.name)
def test_kernels_allocating_per_task_compute_the_product(kernel):
    executable, main = build_seen_after("tf_dietcode.AllocatePerTask", NN, kernel)
    launch_points = []
    tvm_ffi.structural_walk(main.body, (tir_stmt.AttrStmt, lambda node: launch_points.append(node)
                                        if node.attr_key == task_scratch.LAUNCH_POINT else None))
    assert launch_points, "the kernel's tiles are still allocated in every iteration"
    assert_computes_the_product(executable, NN, kernel, (1, 2, 7, 8, 9, 31, 40))


def _loop_with_marked_fill(fill_follows_row: bool, guard=None):
    """for i in parallel(8): a tile of n + 7 elements; for r in range(4): pad = 7 - n % 8 (the same
    in every iteration); a marked zero fill of tile[n + j] for j < pad, or of tile[r + j] (moving
    with the row), under `if guard(n, r)` where a guard is given; then a copy into tile[r]."""
    n, i, r, j = (tirx.Var(name, "int64") for name in ("n", "i", "r", "j"))
    pad = tirx.Var("pad", "int64")
    source = tirx.decl_buffer([n], "float32", "source")
    tile = tirx.decl_buffer([n + 7], "float32", "tile")
    fill = tir_stmt.For(j, tirx.const(0, "int64"), pad, tir_stmt.ForKind.SERIAL,
                        tir_stmt.BufferStore(tile, tirx.const(0.0, "float32"), [(r if fill_follows_row else n) + j]))
    marked = tir_stmt.AttrStmt(j, task_scratch.PADDING_FILL, tirx.const(1, "int32"), fill)
    row = tir_stmt.SeqStmt([
        tir_stmt.Bind(pad, 7 - tirx.floormod(n, 8)),
        marked if guard is None else tir_stmt.IfThenElse(guard(n, r), marked, None),
        tir_stmt.BufferStore(tile, source[r], [r]),
    ])
    rows = tir_stmt.For(r, tirx.const(0, "int64"), tirx.const(4, "int64"), tir_stmt.ForKind.SERIAL, row)
    body = tir_stmt.SeqStmt([tir_stmt.AllocBuffer(tile), rows])
    parallel = tir_stmt.For(i, tirx.const(0, "int64"), tirx.const(8, "int64"), tir_stmt.ForKind.PARALLEL, body)
    return tirx.PrimFunc([n, source], parallel)


def _after_pass(func: tirx.PrimFunc) -> tir_stmt.Stmt:
    return task_scratch.AllocatePerTask(tvm.IRModule({"main": func}))["main"].body


def _attr_keys(stmt) -> list:
    keys = []
    tvm_ffi.structural_walk(stmt, (tir_stmt.AttrStmt, lambda attr: keys.append(attr.attr_key)))
    return keys


def test_a_padding_fill_the_same_in_every_iteration_runs_once_per_task():
    launch = _after_pass(_loop_with_marked_fill(fill_follows_row=False))
    assert isinstance(launch, tir_stmt.AttrStmt) and launch.attr_key == task_scratch.LAUNCH_POINT
    allocation, fill, parallel = _sequence(launch.body)
    assert isinstance(allocation, tir_stmt.AllocBuffer) and isinstance(parallel, tir_stmt.For)
    assert isinstance(fill, tir_stmt.For) and not task_scratch.uses(fill.extent, [parallel.loop_var])
    assert "pad" not in str(fill.extent)  # the binding, set inside the loop, replaced by its value
    stores = []
    tvm_ffi.structural_walk(parallel, (tir_stmt.BufferStore, stores.append))
    assert len(stores) == 1 and isinstance(stores[0].value, tvm.ir.TensorLoad)  # only the copy is left
    assert task_scratch.PADDING_FILL not in _attr_keys(launch)


def test_a_padding_fill_that_moves_with_the_iteration_stays_and_loses_its_mark():
    launch = _after_pass(_loop_with_marked_fill(fill_follows_row=True))
    allocation, parallel = _sequence(launch.body)
    stores = []
    tvm_ffi.structural_walk(parallel, (tir_stmt.BufferStore, stores.append))
    assert len(stores) == 2
    assert _attr_keys(launch) == [task_scratch.LAUNCH_POINT]


def test_a_guarded_fill_runs_once_per_task_under_its_guard():
    launch = _after_pass(_loop_with_marked_fill(fill_follows_row=False, guard=lambda n, r: tirx.floormod(n, 8) != 0))
    allocation, guarded, parallel = _sequence(launch.body)
    assert isinstance(guarded, tir_stmt.IfThenElse) and "n % T.int64(8) != T.int64(0)" in str(guarded.condition)
    assert isinstance(guarded.then_case, tir_stmt.For) and guarded.else_case is None


def test_a_fill_guarded_by_the_iteration_stays():
    launch = _after_pass(_loop_with_marked_fill(fill_follows_row=False, guard=lambda n, r: r < n))
    allocation, parallel = _sequence(launch.body)
    stores = []
    tvm_ffi.structural_walk(parallel, (tir_stmt.BufferStore, stores.append))
    assert len(stores) == 2
