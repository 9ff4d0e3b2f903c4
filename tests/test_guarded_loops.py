"""ShrinkGuardedLoops: guarded loops become loops over the iterations where the
guard holds, computing exactly what they computed before."""

import numpy as np
import tvm
from tvm.script import tirx as T
from tvm.tirx import stmt as tir_stmt

from tf_dietcode.tuning import guarded_loops


@T.prim_func
def guarded(a: T.handle, n: T.int64, c: T.int64):
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
    for i in range(T.int64(32)):  # a guard with an else is left alone
        if i < n:
            A[i] = A[i] + 32
        else:
            A[i] = A[i] + 64


def branches(stmt) -> int:
    """IfThenElse nodes in a statement."""
    children = {tir_stmt.SeqStmt: lambda s: list(s.seq), tir_stmt.For: lambda s: [s.body],
                tir_stmt.AttrStmt: lambda s: [s.body],
                tir_stmt.IfThenElse: lambda s: [s.then_case] + ([s.else_case] if s.else_case is not None else [])}
    nested = children.get(type(stmt), lambda s: [])(stmt)
    return isinstance(stmt, tir_stmt.IfThenElse) + sum(branches(child) for child in nested)


def test_guards_become_loop_bounds():
    shrunk = guarded_loops.shrink_guarded_loops(guarded.body)
    assert branches(guarded.body) == 6
    assert branches(shrunk) == 3  # the hoisted c >= 0, the i % 3 term, the guard with an else


def test_shrunk_loops_compute_what_the_guarded_ones_did():
    target = tvm.target.Target("llvm")
    reference = tvm.compile(guarded, target=target, tir_pipeline="default")
    shrunk = tvm.compile(guarded, target=target, tir_pipeline=guarded_loops.PIPELINE)
    for n in range(-3, 36, 2):
        for c in (-1, 0, 5, 40):
            outputs = []
            for executable in (reference, shrunk):
                out = tvm.runtime.tensor(np.zeros(64, np.int32))
                executable["main"](out, n, c)
                outputs.append(out.numpy())
            np.testing.assert_array_equal(outputs[1], outputs[0], err_msg=f"n={n} c={c}")
            assert outputs[0].any() or n < 0, (n, c)  # the guards let something through
