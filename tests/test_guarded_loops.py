"""ShrinkGuardedLoops: guarded loops become loops over the iterations where the
guard holds, computing exactly what they computed before, and the kernels'
lowered code keeps no loop that checks its own variable per iteration."""

import numpy as np
import pytest
import tvm
from tvm.script import tirx as T
from tvm.tirx import stmt as tir_stmt

from tf_dietcode.tuning import hardware, templates
from tf_dietcode.tuning.micro_kernel import MicroKernel
from tf_dietcode.tuning.tir_passes import guarded_loops
from tf_dietcode.tuning.tir_passes.pipeline import PASS_CONFIG, register
from tf_dietcode.tuning.workload import Workload


@T.prim_func
def guarded(a: T.handle, n: T.int64, c: T.int64, d: T.int64):
    A = T.match_buffer(a, (T.int64(64),), "int32")
    for i in range(T.int64(32)):  # upper bound (c + i < n) and a term free of i, hoisted
        if T.likely(c + i < n) and c >= T.int64(0):
            A[i] = A[i] + 1
    for i in range(T.int64(32)):  # lower bound
        if i >= n - c:
            A[i + T.int64(32)] = A[i + T.int64(32)] + 2
    for i in range(T.int64(32)):  # upper bound written the other way round
        if n > i:
            A[i] = A[i] + 4
    for i in range(T.int64(32)):  # through a binding, inclusive
        j: T.let[T.int64] = c + i
        if j <= n:
            A[i] = A[i] + 8
    for i in range(T.int64(32)):  # a term not monotone in i stays, inside the shortened loop
        if i % T.int64(3) == T.int64(0) and i < n:
            A[i] = A[i] + 16
    for i in range(T.int64(32)):  # a bound that divides by a variable is left alone (d may be 0 where no loop runs)
        if i < n // d:
            A[i] = A[i] + 128
    for i in range(T.int64(32)):  # a guard with an else is left alone
        if i < n:
            A[i] = A[i] + 32
        else:
            A[i] = A[i] + 64


def statements(stmt):
    """Every statement nested in stmt, stmt first."""
    children = {tir_stmt.SeqStmt: lambda s: list(s.seq), tir_stmt.For: lambda s: [s.body],
                tir_stmt.AttrStmt: lambda s: [s.body],
                tir_stmt.IfThenElse: lambda s: [s.then_case] + ([s.else_case] if s.else_case is not None else [])}
    yield stmt
    for child in children.get(type(stmt), lambda s: [])(stmt):
        yield from statements(child)


def branches(stmt) -> int:
    """IfThenElse nodes in a statement."""
    return sum(isinstance(s, tir_stmt.IfThenElse) for s in statements(stmt))


def loops_checking_their_variable(stmt) -> list:
    """Serial loops whose whole body is an `if` on the loop variable (directly or through the
    body's bindings): a check per iteration."""
    found = []
    for loop in statements(stmt):
        if isinstance(loop, tir_stmt.For) and loop.kind == tir_stmt.ForKind.SERIAL:
            *bindings, last = list(loop.body.seq) if isinstance(loop.body, tir_stmt.SeqStmt) else [loop.body]
            if isinstance(last, tir_stmt.IfThenElse) and all(isinstance(b, tir_stmt.Bind) for b in bindings):
                own = [loop.loop_var, *(b.var for b in bindings)]
                used = tvm.tirx.analysis.undefined_vars(last.condition, [])
                found += [loop] if any(u.same_as(v) for u in used for v in own) else []
    return found


def test_guards_become_loop_bounds():
    shrunk = guarded_loops.shrink_guarded_loops(guarded.body)
    assert branches(guarded.body) == 7
    assert branches(shrunk) == 4  # the hoisted c >= 0, the i % 3 term, the division, the guard with an else


@T.prim_func
def tiled(a: T.handle, n: T.int64):
    A = T.match_buffer(a, (T.int64(256),), "int32")
    for v in range(n // T.int64(16)):  # whole tiles only, as LoopPartition splits them off
        for i in range(T.int64(16)):
            if v * T.int64(16) + i < n:
                A[v * T.int64(16) + i] = A[v * T.int64(16) + i] + 1


def test_a_bound_the_enclosing_loops_imply_is_dropped():
    """In the loop over whole tiles the guard always holds: the tile's loop keeps its constant
    trip count (a fetch LLVM can unroll and vectorize) and loses its check."""
    shrunk = guarded_loops.shrink_guarded_loops(tiled.body)
    assert branches(shrunk) == 0
    inner = [s for s in statements(shrunk) if isinstance(s, tir_stmt.For)][1]
    assert isinstance(inner.extent, tvm.tirx.IntImm) and int(inner.extent) == 16


def test_shrunk_loops_compute_what_the_guarded_ones_did():
    target = tvm.target.Target("llvm")
    reference = tvm.compile(guarded, target=target, tir_pipeline="default")
    shrunk = tvm.compile(guarded, target=target, tir_pipeline=register())
    for n in range(-3, 36, 2):
        for c in (-1, 0, 5, 40):
            outputs = []
            for executable in (reference, shrunk):
                out = tvm.runtime.tensor(np.zeros(64, np.int32))
                executable["main"](out, n, c, 3)
                outputs.append(out.numpy())
            np.testing.assert_array_equal(outputs[1], outputs[0], err_msg=f"n={n} c={c}")
            assert outputs[0].any() or n < 0, (n, c)  # the guards let something through


CASES = [  # symbolic kernels whose remainders LoopPartition leaves checked (3-7 loops each)
    (Workload("batch_matmul", (1, 128), (1, 128), 64, b=192, ties=("m", "n")),
     MicroKernel(2, 32, 32, 1, True, whole_batch=True)),
    (Workload("batch_matmul", (1, 128), 64, (1, 128), b=192, transpose_b=False, ties=("m", "k")),
     MicroKernel(2, 16, 8, 2, True)),  # K blocks enclosing two column blocks: a dynamic K's last is shorter
    (Workload("dense", (1, 128), 2304, 768, bias=True), MicroKernel(2, 32, 768, 4, True, True, 0)),
    # every dim dynamic: the copies for small K (small_reductions) keep their partial column tiles' write-backs
    # unchecked too (84 checked loops while that pass simplified the kernel)
    (Workload("batch_matmul", (1, 8), (1, 8), (1, 8), b=(1, 8), transpose_b=False), MicroKernel(6, 16, 8, 1, True)),
]


@pytest.mark.parametrize("workload,kernel", CASES, ids=lambda case: getattr(case, "name", getattr(case, "kind", "")))
def test_symbolic_kernels_keep_no_check_per_iteration(workload, kernel):
    """Lowered by TVM's default pipeline, the kernel's fetches and write-backs still check every
    element somewhere; lowered by the one kernels are built with, nowhere."""
    hw = hardware.detect()
    target = tvm.target.Target(hw.target(), host=hw.target())
    scheduled = tvm.tirx.transform.BindTarget(target)(templates.for_workload(workload).schedule(workload, kernel))
    checked = {}
    for pipeline in ("default", register()):
        lower = tvm.tirx.get_tir_pipeline(pipeline)[0]
        with tvm.transform.PassContext(config=PASS_CONFIG):
            checked[pipeline] = loops_checking_their_variable(lower(scheduled)["main"].body)
    assert checked["default"], "LoopPartition left no checked loop: is ShrinkGuardedLoops still needed?"
    assert checked[register()] == []
