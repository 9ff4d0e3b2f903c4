"""The fused ops run on TF's intra-op pool: correct under concurrent callers,
and they never pin the process's threads to cores."""

import concurrent.futures
import os

import numpy as np

from conftest import random_tensor
from tf_dietcode import ops


def test_concurrent_callers_on_different_shapes_all_get_correct_results(rng):
    jobs = []
    for index in range(24):
        m = int(rng.integers(1, 200))
        a, b, bias = random_tensor(rng, (m, 96)), random_tensor(rng, (128, 96)), random_tensor(rng, (128,))
        t = int(rng.integers(1, 40))
        q, k = random_tensor(rng, (3, 4, t, 16)), random_tensor(rng, (3, 4, t, 16))
        mask = random_tensor(rng, (3, 1, 1, t))
        jobs.append((a, b, bias, q, k, mask))

    def run(job):
        a, b, bias, q, k, mask = job
        dense = ops.fused_matmul(a, b, bias, transpose_b=True, activation="relu").numpy()
        scores = ops.fused_batch_matmul_add(q, k, mask, adj_y=True).numpy()
        context = ops.fused_batch_matmul_transpose(q, k, [0, 2, 1, 3], adj_y=True).numpy()
        return dense, scores, context

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        results = list(pool.map(run, jobs * 2))
    for (a, b, bias, q, k, mask), (dense, scores, context) in zip(jobs * 2, results):
        np.testing.assert_allclose(dense, np.maximum(a @ b.T + bias, 0), rtol=1e-4, atol=1e-4)
        product = q @ np.swapaxes(k, -1, -2)
        np.testing.assert_allclose(scores, product + mask, rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(context, product.transpose(0, 2, 1, 3), rtol=1e-4, atol=1e-4)


def test_ops_leave_thread_affinity_alone(rng):
    before = os.sched_getaffinity(0)
    for m in (1, 64, 500):
        ops.fused_matmul(random_tensor(rng, (m, 256)), random_tensor(rng, (256, 256))).numpy()
    assert os.sched_getaffinity(0) == before
