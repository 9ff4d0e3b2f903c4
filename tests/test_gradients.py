"""Registered gradients: numerical Jacobians, and agreement with TF's own ops."""

import numpy as np
import pytest
import tensorflow as tf

from conftest import random_tensor
from tf_dietcode import ops, reference

CASES = {
    "matmul": (lambda a, b, bias: ops.fused_matmul(a, b, bias, transpose_b=True, activation="gelu"),
               lambda a, b, bias: reference.fused_matmul(a, b, bias, transpose_b=True, activation="gelu"),
               [(3, 4), (5, 4), (5,)]),
    "matmul_tanh_transpose_a": (
        lambda a, b, bias: ops.fused_matmul(a, b, bias, transpose_a=True, activation="tanh"),
        lambda a, b, bias: reference.fused_matmul(a, b, bias, transpose_a=True, activation="tanh"),
        [(4, 3), (4, 5), (5,)]),
    "matmul_no_bias_sigmoid": (lambda a, b: ops.fused_matmul(a, b, activation="sigmoid"),
                               lambda a, b: reference.fused_matmul(a, b, activation="sigmoid"),
                               [(2, 3), (3, 4)]),
    "matmul_packed_weight": (
        lambda a, b, bias: ops.fused_matmul(a, b, bias, activation="relu", packed_n=5),
        lambda a, b, bias: reference.fused_matmul(a, b, bias, activation="relu", packed_n=5),
        [(3, 4), (3, 4, 2), (5,)]),
    "matmul_einsum_dense": (  # EinsumDense's 'abcd,cde->abe' and 'abc,cde->abde' forms in one
        lambda a, b, bias: ops.fused_matmul(a, b, bias, activation="tanh", num_k_dims=2, n_dims=(2, 3)),
        lambda a, b, bias: reference.fused_matmul(a, b, bias, activation="tanh", num_k_dims=2, n_dims=(2, 3)),
        [(2, 3, 2, 2), (4, 6), (6,)]),
    "matmul_groups": (  # two layers side by side, written group-major
        lambda a, b, bias: ops.fused_matmul(a, b, bias, activation="tanh", groups=2),
        lambda a, b, bias: reference.fused_matmul(a, b, bias, activation="tanh", groups=2),
        [(2, 3, 4), (4, 6), (6,)]),
    "batch_matmul_add": (
        lambda x, y, mask: ops.fused_batch_matmul_add(x, y, mask, adj_y=True, alpha=0.5),
        lambda x, y, mask: reference.fused_batch_matmul_add(x, y, mask, adj_y=True, alpha=0.5),
        [(2, 3, 4, 5), (2, 1, 3, 5), (2, 1, 1, 3)]),
    "batch_matmul_transpose": (
        lambda x, y: ops.fused_batch_matmul_transpose(x, y, [0, 2, 1, 3], adj_x=True),
        lambda x, y: reference.fused_batch_matmul_transpose(x, y, perm=[0, 2, 1, 3], adj_x=True),
        [(2, 3, 4, 5), (1, 3, 4, 2)]),
    "layer_norm": (lambda x, gamma, beta: ops.layer_norm(x, gamma, beta, epsilon=0.01),
                   lambda x, gamma, beta: reference.layer_norm(x, gamma, beta, epsilon=0.01),
                   [(2, 3, 5), (5,), (5,)]),
    "layer_norm_residual": (  # the residual broadcast over x's batch: its gradient sums over it
        lambda x, gamma, beta, residual: ops.layer_norm(x, gamma, beta, residual=residual, epsilon=0.01),
        lambda x, gamma, beta, residual: reference.layer_norm(x + residual, gamma, beta, epsilon=0.01),
        [(2, 3, 5), (5,), (5,), (1, 3, 5)]),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_numerical_jacobian_of_every_input(case):
    fused, _, shapes = CASES[case]
    rng = np.random.default_rng(7)  # fixed: keeps inputs away from activation kinks
    inputs = [random_tensor(rng, s) for s in shapes]
    theoretical, numerical = tf.test.compute_gradient(fused, inputs, delta=1e-2)
    for index, (t, n) in enumerate(zip(theoretical, numerical)):
        assert np.abs(t - n).max() < 2e-3, f"input {index}"


@pytest.mark.parametrize("case", sorted(CASES))
def test_gradients_equal_tf_ops_gradients(rng, case):
    fused, composed, shapes = CASES[case]
    inputs = [tf.constant(random_tensor(rng, s)) for s in shapes]
    upstream = None
    results = []
    for function in (fused, composed):
        with tf.GradientTape() as tape:
            tape.watch(inputs)
            out = function(*inputs)
        upstream = upstream if upstream is not None else random_tensor(rng, out.shape)
        results.append(tape.gradient(out, inputs, output_gradients=upstream))
    for got, want in zip(*results):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_gradient_inside_tf_function_and_second_order(rng):
    a, b, bias = (tf.constant(random_tensor(rng, s)) for s in [(3, 4), (4, 5), (5,)])

    def second_derivative(dense):
        @tf.function
        def run(a):
            with tf.GradientTape() as outer:
                outer.watch(a)
                with tf.GradientTape() as inner:
                    inner.watch(a)
                    y = tf.reduce_sum(dense(a, b, bias, activation="gelu"))
                g = inner.gradient(y, a)
            return outer.gradient(g, a)
        return run(a)

    fused, composed = second_derivative(ops.fused_matmul), second_derivative(reference.fused_matmul)
    assert np.abs(composed).max() > 0
    np.testing.assert_allclose(fused, composed, rtol=1e-4, atol=1e-5)
