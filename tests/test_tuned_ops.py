"""The fused ops running a bundle's tuned micro-kernels: every shape of the
tuned ranges and outside them matches the reference, each shape runs the
kernel the bundle's tree picks (seen through the bundle's call counters), and
calls a tuned kernel cannot serve fall back to the generic kernel."""

import concurrent.futures

import numpy as np
import pytest
import tensorflow as tf

from conftest import assert_matches_reference, random_tensor
from tf_dietcode import ops, reference
from tuned_calls import expected_kernel, kernel_used, weight_operand


@pytest.mark.parametrize("index,n,bias,activation", [(0, 40, True, "relu"), (4, 48, False, "gelu")],
                         ids=["packed", "in_place"])
def test_dense_every_m_in_and_outside_the_range(tuned_bundle, rng, index, n, bias, activation):
    path, report = tuned_bundle
    w, b = random_tensor(rng, (n, 24)), random_tensor(rng, (n,)) if bias else None
    weight, packed_n = weight_operand(report, w, index)
    assert packed_n == (n if index == 0 else 0)
    for m in range(1, 46):
        x = random_tensor(rng, (m, 24))
        out, used = kernel_used(path, lambda: ops.fused_matmul(x, weight, b, activation=activation,
                                                               packed_n=packed_n, bundle=str(path)).numpy())
        assert used == expected_kernel(report, index, {"m": m, "n": n, "k": 24}), m
        assert_matches_reference(out, reference.fused_matmul, [x, w.T, b], activation=activation)


def test_grouped_dense_every_m_in_and_outside_the_range(tuned_bundle, rng):
    """Three layers side by side (horizontal fusion) run their own workload's kernels, never the
    one-layer workload's, and write each layer's output as one block: [3, M, 16]."""
    path, report = tuned_bundle
    w, b = random_tensor(rng, (48, 24)), random_tensor(rng, (48,))
    weight, packed_n = weight_operand(report, w, 5)
    for m in range(1, 46):
        x = random_tensor(rng, (m, 24))
        out, used = kernel_used(path, lambda: ops.fused_matmul(x, weight, b, activation="relu", packed_n=packed_n,
                                                               groups=3, bundle=str(path)).numpy())
        assert used == expected_kernel(report, 5, {"m": m, "n": 48, "k": 24}), m
        assert_matches_reference(out, reference.fused_matmul, [x, w.T, b], activation="relu", groups=3)


def test_batch_matmul_nt_and_nn_every_shape_in_and_outside_the_range(tuned_bundle, rng):
    path, report = tuned_bundle
    for t in range(1, 24):
        q, k = random_tensor(rng, (3, t, 8)), random_tensor(rng, (3, t, 8))
        out, used = kernel_used(path, lambda: ops.fused_batch_matmul_transpose(
            q, k, [0, 1, 2], adj_y=True, bundle=str(path)).numpy())
        assert used == expected_kernel(report, 1, {"b": 3, "m": t, "n": t, "k": 8}), t
        assert_matches_reference(out, reference.fused_batch_matmul_transpose, [q, k], perm=[0, 1, 2], adj_y=True)

        s, v = random_tensor(rng, (2, t, t)), random_tensor(rng, (2, t, 12))
        out, used = kernel_used(path, lambda: ops.fused_batch_matmul_transpose(
            s, v, [0, 1, 2], bundle=str(path)).numpy())
        assert used == expected_kernel(report, 2, {"b": 2, "m": t, "n": 12, "k": t}), t
        assert_matches_reference(out, reference.fused_batch_matmul_transpose, [s, v], perm=[0, 1, 2])


def test_tuned_kernels_inside_a_graph_with_unknown_dims(tuned_bundle, rng):
    path, report = tuned_bundle
    w, bias = random_tensor(rng, (40, 24)), random_tensor(rng, (40,))
    wp = tf.constant(weight_operand(report, w)[0])

    @tf.function(input_signature=[tf.TensorSpec([None, 24], tf.float32), tf.TensorSpec([], tf.string)])
    def layer(x, bundle):
        return ops.fused_matmul(x, wp, bias, activation="relu", packed_n=40, bundle=bundle)

    for m in (1, 7, 40, 41):
        x = random_tensor(rng, (m, 24))
        out, used = kernel_used(path, lambda: layer(x, str(path)).numpy())
        assert used == expected_kernel(report, 0, {"m": m, "n": 40, "k": 24})
        assert_matches_reference(out, reference.fused_matmul, [x, w.T, bias], activation="relu")


def test_attention_layouts_scale_and_mask_run_tuned(tuned_bundle, rng):
    """Keras' attention: [B, T, heads, depth] projections read in place, the query's scale, a
    broadcast mask, the context written straight into [B, T, heads, depth]."""
    path, report = tuned_bundle
    layout = [0, 2, 1, 3]
    for t in (1, 2, 7, 13, 20, 21):
        q, k = random_tensor(rng, (2, t, 3, 8)), random_tensor(rng, (2, t, 3, 8))
        mask = random_tensor(rng, (2, 1, 1, t))
        out, used = kernel_used(path, lambda: ops.fused_batch_matmul_add(
            q, k, mask, x_perm=layout, y_perm=layout, adj_y=True, alpha=0.35, bundle=str(path)).numpy())
        assert used == expected_kernel(report, 3, {"b": 6, "m": t, "n": t, "k": 8}), t
        assert_matches_reference(out, reference.fused_batch_matmul_add, [q, k, mask], x_perm=layout,
                                 y_perm=layout, adj_y=True, alpha=0.35)
        if t > 16:
            continue
        probs, v = random_tensor(rng, (2, 3, t, t)), random_tensor(rng, (2, t, 3, 12))
        out, used = kernel_used(path, lambda: ops.fused_batch_matmul_transpose(
            probs, v, layout, y_perm=layout, bundle=str(path)).numpy())
        assert used == expected_kernel(report, 2, {"b": 6, "m": t, "n": 12, "k": t}), t
        assert_matches_reference(out, reference.fused_batch_matmul_transpose, [probs, v], perm=layout,
                                 y_perm=layout)


def test_scaled_permuted_and_broadcast_products_run_tuned(tuned_bundle, rng):
    path, report = tuned_bundle
    q, k = random_tensor(rng, (3, 6, 8)), random_tensor(rng, (3, 6, 8))
    cases = [  # (the call, its reference)
        (lambda: ops.fused_batch_matmul_transpose(q, k, [0, 1, 2], adj_y=True, alpha=0.5, bundle=str(path)),
         lambda: reference.fused_batch_matmul_transpose(q, k, perm=[0, 1, 2], adj_y=True, alpha=0.5)),
        (lambda: ops.fused_batch_matmul_transpose(q, k, [1, 0, 2], adj_y=True, bundle=str(path)),
         lambda: reference.fused_batch_matmul_transpose(q, k, perm=[1, 0, 2], adj_y=True)),
        (lambda: ops.fused_batch_matmul_transpose(q[:1], k, [0, 1, 2], adj_y=True, bundle=str(path)),
         lambda: reference.fused_batch_matmul_transpose(q[:1], k, perm=[0, 1, 2], adj_y=True)),  # broadcast
    ]
    for call, expected in cases:
        out, used = kernel_used(path, lambda: call().numpy())
        assert used == expected_kernel(report, 1, {"b": 3, "m": 6, "n": 6, "k": 8})
        np.testing.assert_allclose(out, expected().numpy(), rtol=1e-4, atol=1e-4)


def test_calls_no_tuned_kernel_computes_take_the_generic_kernel(tuned_bundle, rng):
    path, report = tuned_bundle
    w, bias = random_tensor(rng, (40, 24)), random_tensor(rng, (40,))
    w48 = random_tensor(rng, (48, 24))
    x = random_tensor(rng, (5, 24))
    q, k = random_tensor(rng, (3, 6, 8)), random_tensor(rng, (3, 6, 8))
    s, v = random_tensor(rng, (2, 6, 6)), random_tensor(rng, (2, 6, 12))
    qt = np.ascontiguousarray(np.swapaxes(q, 1, 2))
    mask = random_tensor(rng, (2, 1, 12))
    p3, v3 = random_tensor(rng, (2, 2, 2, 5, 5)), random_tensor(rng, (2, 1, 2, 5, 12))  # 8 batches, NN's range
    cases = [  # (the call, its reference)
        (lambda: ops.fused_matmul(x, weight_operand(report, w)[0], bias, activation="tanh", packed_n=40,
                                  bundle=str(path)),
         lambda: reference.fused_matmul(x, w.T, bias, activation="tanh")),            # another activation
        (lambda: ops.fused_matmul(x, w, bias, transpose_b=True, activation="relu", bundle=str(path)),
         lambda: reference.fused_matmul(x, w.T, bias, activation="relu")),            # weight not packed
        (lambda: ops.fused_matmul(x, w48.T, None, activation="relu", bundle=str(path)),
         lambda: reference.fused_matmul(x, w48.T, activation="relu")),                # in place, another activation
        (lambda: ops.fused_matmul(x, w48, None, transpose_b=True, activation="gelu", bundle=str(path)),
         lambda: reference.fused_matmul(x, w48.T, activation="gelu")),                # in place, not [K, N]
        (lambda: ops.fused_batch_matmul_add(s, v, mask, bundle=str(path)),
         lambda: reference.fused_batch_matmul_add(s, v, mask)),                       # no NN workload adds
        (lambda: ops.fused_batch_matmul_transpose(q, k, [0, 2, 1], adj_y=True, bundle=str(path)),
         lambda: reference.fused_batch_matmul_transpose(q, k, perm=[0, 2, 1], adj_y=True)),  # columns strided
        (lambda: ops.fused_batch_matmul_transpose(qt, k, [0, 1, 2], adj_x=True, adj_y=True, bundle=str(path)),
         lambda: reference.fused_batch_matmul_transpose(qt, k, perm=[0, 1, 2], adj_x=True, adj_y=True)),
        (lambda: ops.fused_batch_matmul_transpose(p3, v3, [0, 1, 2, 3, 4], bundle=str(path)),
         lambda: reference.fused_batch_matmul_transpose(p3, v3, perm=[0, 1, 2, 3, 4])),  # batch not two strides
    ]
    for call, expected in cases:
        out, used = kernel_used(path, lambda: call().numpy())
        assert used == "generic"
        np.testing.assert_allclose(out, expected().numpy(), rtol=1e-4, atol=1e-4)


def test_same_shape_always_takes_the_same_kernel(tuned_bundle, rng):
    path, report = tuned_bundle
    q, k = random_tensor(rng, (3, 11, 8)), random_tensor(rng, (3, 11, 8))
    used = {kernel_used(path, lambda: ops.fused_batch_matmul_transpose(
        q, k, [0, 1, 2], adj_y=True, bundle=str(path)).numpy())[1] for _ in range(5)}
    assert len(used) == 1


def test_many_threads_on_different_shapes_all_correct(tuned_bundle, rng):
    path, report = tuned_bundle
    w, bias = random_tensor(rng, (40, 24)), random_tensor(rng, (40,))
    wp = weight_operand(report, w)[0]
    jobs = [(random_tensor(rng, (int(rng.integers(1, 45)), 24)),
             random_tensor(rng, (3, t, 8)), random_tensor(rng, (3, t, 8)))
            for t in rng.integers(1, 24, size=32)]

    def run(job):
        x, q, k = job
        return (ops.fused_matmul(x, wp, bias, activation="relu", packed_n=40, bundle=str(path)).numpy(),
                ops.fused_batch_matmul_transpose(q, k, [0, 1, 2], adj_y=True, bundle=str(path)).numpy())

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        results = list(pool.map(run, jobs * 3))
    for (x, q, k), (layer, scores) in zip(jobs * 3, results):
        np.testing.assert_allclose(layer, np.maximum(x @ w.T + bias, 0), rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(scores, q @ np.swapaxes(k, 1, 2), rtol=1e-4, atol=1e-4)


def test_tuned_kernels_leave_thread_affinity_alone(tuned_bundle, rng):
    import os

    path, _ = tuned_bundle
    before = os.sched_getaffinity(0)
    for t in (1, 9, 20):
        q = random_tensor(rng, (3, t, 8))
        ops.fused_batch_matmul_transpose(q, q, [0, 1, 2], adj_y=True, bundle=str(path)).numpy()
    assert os.sched_getaffinity(0) == before


def test_workspace_larger_than_the_arena_start_stays_right(tmp_path, rng):
    """Tuned kernels take their local tiles from a per-thread arena that starts at
    256 KiB. An NN product with K up to 20000 fetches [K, columns] panels of 640 KiB or
    more: the first such call gets them from TVM's pool, later ones from the grown
    arenas (the caller's and the pool threads'), between calls at small K. All right."""
    from conftest import SEED, TINY_TUNING_OPTIONS, shared_database
    from tf_dietcode.tuning import search
    from tf_dietcode.tuning.tune import tune
    from tf_dietcode.tuning.workload import Workload

    path = tmp_path / "bundle"
    tune([Workload("batch_matmul", (1, 4), 16, (1, 20000), b=2, transpose_b=False)], path,
         options=search.SearchOptions(**TINY_TUNING_OPTIONS, seed=SEED % 1000), database=shared_database(),
         progress=False)
    for k in (20000, 17, 9000, 20000, 1):
        x, y = random_tensor(rng, (2, 3, k)), random_tensor(rng, (2, k, 16))
        out, used = kernel_used(path, lambda: ops.fused_batch_matmul_transpose(
            x, y, [0, 1, 2], bundle=str(path)).numpy())
        assert used != "generic", k
        assert_matches_reference(out, reference.fused_batch_matmul_transpose, [x, y], perm=[0, 1, 2])


def test_calls_use_the_pool_by_their_size_and_the_recent_calls(tmp_path, rng):
    """A call whose kernel would take one core under ~20 us runs as one task on
    the op's thread; up to ~1.6 ms, the op's thread runs tasks beside one pool
    thread; above, every task runs on TF's intra-op pool. The largest recent
    call decides the last two (a mode switch costs a wake-up), so a mid-size
    call right after a large one stays on the pool. Every call gives the
    reference."""
    from conftest import SEED, TINY_TUNING_OPTIONS, shared_database
    from tf_dietcode.tuning import search
    from tf_dietcode.tuning.tune import tune
    from tf_dietcode.tuning.workload import Workload

    path = tmp_path / "bundle"
    report = tune([Workload("dense", (1, 2048), 256, 256, bias=True)], path,
                  options=search.SearchOptions(**TINY_TUNING_OPTIONS, seed=SEED % 1000), database=shared_database(),
                  progress=False)
    w, b = random_tensor(rng, (256, 256)), random_tensor(rng, (256,))
    weight, packed_n = weight_operand(report, w)
    uses = ("calling_thread_calls", "launcher_joined_calls", "pool_calls")

    def pool_use(m: int) -> str:
        x = random_tensor(rng, (m, 256))
        before = ops.bundle_stats(str(path))
        out, used = kernel_used(path, lambda: ops.fused_matmul(x, weight, b, packed_n=packed_n,
                                                               bundle=str(path)).numpy())
        assert used != "generic", m
        assert_matches_reference(out, reference.fused_matmul, [x, w.T, b])
        after = ops.bundle_stats(str(path))
        [use] = [key for key in uses if after[key] != before[key]]
        return use

    for _ in range(200):  # tiny calls let any large call of an earlier test decay
        assert pool_use(1) == "calling_thread_calls"
    assert [pool_use(m) for m in (64, 512, 2048, 64, 1)] == [
        "launcher_joined_calls", "launcher_joined_calls", "pool_calls", "pool_calls", "calling_thread_calls"]


def test_a_call_runs_the_workload_tuned_for_the_narrowest_range_that_holds_it(tmp_path, rng):
    """A decoder's loop tunes its layers for M = 4..32 beside the encoder's M = 1..512
    of the same layer shape: a call inside both ranges runs the narrower one's kernels,
    whatever the manifest's order; outside it, the wider one's."""
    from conftest import SEED, shared_database
    from tf_dietcode.tuning import search
    from tf_dietcode.tuning.tune import tune
    from tf_dietcode.tuning.workload import Workload

    path = tmp_path / "bundle"
    layer = dict(bias=True, activation="relu", weight_layout="in_place")
    report = tune([Workload("dense", (1, 40), 48, 24, **layer), Workload("dense", (4, 12), 48, 24, **layer)], path,
                  options=search.SearchOptions(trials=4, batch=4, samples=3, seed=SEED % 1000),
                  database=shared_database(),
                  progress=False)
    w, b = random_tensor(rng, (48, 24)), random_tensor(rng, (48,))
    weight, packed_n = weight_operand(report, w)
    assert packed_n == 0
    for m in range(1, 46):
        x = random_tensor(rng, (m, 24))
        out, used = kernel_used(path, lambda: ops.fused_matmul(x, weight, b, activation="relu",
                                                               bundle=str(path)).numpy())
        workload = 1 if 4 <= m <= 12 else 0
        assert used == expected_kernel(report, workload, {"m": m, "n": 48, "k": 24}), m
        assert_matches_reference(out, reference.fused_matmul, [x, w.T, b], activation="relu")
