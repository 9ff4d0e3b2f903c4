"""DietcodeLayerNorm against a float64 layer norm and TF's own ops: fresh random
inputs, edge shapes, rows split over the intra-op pool, a residual added first
(broadcast either way), NaN/Inf as TF, and bad input as clear errors."""

import numpy as np
import pytest
import tensorflow as tf

from tf_dietcode import ops, reference


def _float64_layer_norm(x, gamma, beta, epsilon):
    x = np.asarray(x, np.float64)
    mean = x.mean(-1, keepdims=True)
    variance = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(variance + epsilon) * gamma + beta


@pytest.mark.parametrize("shape", [(1, 768), (2, 17, 768), (3, 1, 5, 13), (7, 1), (1,), (2048, 96), (0, 8),
                                   (2, 0, 768)])
@pytest.mark.parametrize("epsilon", [1e-3, 1e-12])
def test_matches_a_float64_layer_norm(rng, shape, epsilon):
    # rows with offsets and scales far from 0 and 1: a one-pass variance would lose them
    x = (rng.normal(size=shape) * rng.uniform(0.01, 50, shape[:-1] + (1,))
         + rng.uniform(-300, 300, shape[:-1] + (1,))).astype(np.float32)
    gamma = rng.normal(1, 0.5, shape[-1:]).astype(np.float32)
    beta = rng.normal(0, 0.5, shape[-1:]).astype(np.float32)
    got = ops.layer_norm(x, gamma, beta, epsilon=epsilon).numpy()
    assert got.shape == x.shape
    expected = _float64_layer_norm(x, gamma, beta, epsilon)
    if shape[-1] == 1:  # every element is its row's mean: beta exactly
        np.testing.assert_array_equal(got, np.broadcast_to(beta, shape))
    else:
        np.testing.assert_allclose(got, expected, rtol=2e-5, atol=2e-5 * np.abs(gamma).max())


@pytest.mark.parametrize("x_shape, residual_shape", [
    ((2, 17, 768), (2, 17, 768)),  # a Transformer's residual
    ((1, 5, 8), (3, 5, 8)),        # x broadcast over the batch: the output is the residual's shape
    ((3, 5, 8), (5, 1)),           # the residual broadcast along rows and the last axis
    ((4, 8), (8,)),
    ((3, 1), (1, 7)),              # both broadcast: the output is larger than either
    ((2, 3), ()),
    ((0, 4), (4,)),
    ((2048, 96), (2048, 96)),      # rows split over the pool
])
def test_adds_the_residual_first_as_tf_broadcasts(rng, x_shape, residual_shape):
    x = rng.normal(3, 2, x_shape).astype(np.float32)
    residual = np.asarray(rng.normal(-1, 5, residual_shape), np.float32)
    depth = np.broadcast_shapes(x_shape, residual_shape)[-1]
    gamma = rng.normal(1, 0.5, depth).astype(np.float32)
    beta = rng.normal(0, 0.5, depth).astype(np.float32)
    got = ops.layer_norm(x, gamma, beta, residual=residual).numpy()
    assert got.shape == np.broadcast_shapes(x_shape, residual_shape)
    expected = _float64_layer_norm(x + residual, gamma, beta, 1e-3)  # summed in float32, as AddV2
    np.testing.assert_allclose(got, expected, rtol=2e-5, atol=2e-5 * np.abs(gamma).max())


def test_residual_shapes_inside_tf_function(rng):
    gamma, beta = np.ones(32, np.float32), np.zeros(32, np.float32)
    traced = tf.function(lambda x, r: ops.layer_norm(x, gamma, beta, residual=r),
                         input_signature=[tf.TensorSpec([None, None, 32], tf.float32),
                                          tf.TensorSpec([1, None, 32], tf.float32)])
    assert traced.get_concrete_function().outputs[0].shape.as_list() == [None, None, 32]
    x, r = rng.normal(size=(3, 4, 32)).astype(np.float32), rng.normal(size=(1, 4, 32)).astype(np.float32)
    np.testing.assert_allclose(traced(x, r), reference.layer_norm(x + r, gamma, beta), rtol=1e-5, atol=1e-5)


def test_agrees_with_tf_ops_and_inside_tf_function(rng):
    x = tf.constant(rng.normal(size=(4, 9, 32)).astype(np.float32))
    gamma, beta = (tf.constant(rng.normal(size=32).astype(np.float32)) for _ in range(2))
    traced = tf.function(lambda x: ops.layer_norm(x, gamma, beta),
                         input_signature=[tf.TensorSpec([None, None, 32], tf.float32)])
    assert traced.get_concrete_function().outputs[0].shape.as_list() == [None, None, 32]
    np.testing.assert_allclose(traced(x), reference.layer_norm(x, gamma, beta), rtol=1e-5, atol=1e-5)


def test_nan_and_inf_as_tf_ops():
    x = np.array([[1.0, np.nan, 2.0], [1.0, np.inf, 2.0], [3.0, 3.0, 3.0], [1.0, 2.0, 3.0]], np.float32)
    gamma, beta = np.ones(3, np.float32), np.zeros(3, np.float32)
    got = ops.layer_norm(x, gamma, beta, epsilon=0.0).numpy()
    expected = reference.layer_norm(x, gamma, beta, epsilon=0.0).numpy()
    np.testing.assert_array_equal(np.isnan(got), np.isnan(expected))  # a constant row with no epsilon: 0 * inf
    np.testing.assert_allclose(got[3], expected[3], rtol=1e-6)


@pytest.mark.parametrize("x, gamma, epsilon, match", [
    (np.float32(1.0), np.ones(1), 1e-3, "rank >= 1"),
    (np.ones((2, 3)), np.ones(4), 1e-3, r"\[3\]"),
    (np.ones((2, 3)), np.ones((1, 3)), 1e-3, r"\[3\]|rank 1"),
    (np.ones((2, 3)), np.ones(3), -1.0, "epsilon"),
])
def test_bad_input_is_a_clear_error(x, gamma, epsilon, match):
    x, gamma = np.asarray(x, np.float32), np.asarray(gamma, np.float32)
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError), match=match):
        ops.layer_norm(x, gamma, np.zeros_like(gamma), epsilon=epsilon)


@pytest.mark.parametrize("x, residual, depth, match", [
    ((2, 3), (2, 4), 3, "do not broadcast"),
    ((2, 1), (2, 4), 1, r"\[4\] \(the last dim of x \+ residual\)"),  # gamma sized for x alone
])
def test_bad_residuals_are_a_clear_error(x, residual, depth, match):
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError), match=match):
        ops.layer_norm(np.ones(x, np.float32), np.ones(depth, np.float32), np.zeros(depth, np.float32),
                       residual=np.ones(residual, np.float32))


def test_other_dtypes_are_refused():
    with pytest.raises(tf.errors.InvalidArgumentError, match="float32"):
        ops.layer_norm(np.ones((2, 3), np.float64), np.ones(3, np.float32), np.zeros(3, np.float32))
