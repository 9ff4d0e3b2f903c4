"""DietcodeFusedMatMulBf16 against float64 products of the bfloat16-rounded operands, on every kernel
path this CPU runs."""

import numpy as np
import pytest
import tensorflow as tf

from low_precision_paths import ACTIVATIONS, SHAPES, kernel_path_fixture
from tf_dietcode import ops, reference
from tf_dietcode.precision import bf16_weights, packing

InvalidArgument = tf.errors.InvalidArgumentError
path = kernel_path_fixture("bfloat16")


def rounded(x):
    """x rounded to bfloat16 (to nearest even), as float32."""
    return np.asarray(x, np.float32).astype(bf16_weights.BFLOAT16).astype(np.float32)


def operands(rng, m, k, n):
    return (rng.standard_normal((m, k)).astype(np.float32), rng.standard_normal((k, n)).astype(np.float32),
            rng.standard_normal(n).astype(np.float32))


def run(a, w, bias=None, **options):
    return ops.fused_matmul_bf16(a, bf16_weights.pack(w), bias, n=w.shape[1], **options).numpy()


def assert_close_to_float64(actual, a, w, bias=None, activation="none"):
    """Within float32 accumulation's bound, (K + 2) roundings of the sum of |terms|, passed through the
    activation (slope at most 1.13, gelu's) with a few float32 ulps of its own."""
    a64, w64 = rounded(a).astype(np.float64), rounded(w).astype(np.float64)
    bias64 = np.zeros(w.shape[1]) if bias is None else bias.astype(np.float64)
    bound = (a.shape[1] + 2) * 2.0**-24 * (np.abs(a64) @ np.abs(w64) + np.abs(bias64))
    expected = np.asarray(reference.ACTIVATIONS[activation](a64 @ w64 + bias64))
    assert np.all(np.abs(actual - expected) <= 1.13 * bound + 4e-7 * np.abs(expected) + 1e-30)


@pytest.mark.parametrize("with_bias", [False, True])
def test_matches_float64_on_every_path(rng, path, with_bias):
    for m, k, n in SHAPES:
        a, w, bias = operands(rng, m, k, n)
        bias = bias if with_bias else None
        actual = run(a, w, bias)
        assert actual.shape == (m, n)
        assert_close_to_float64(actual, a, w, bias)


@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_activations(rng, path, activation):
    a, w, bias = operands(rng, 17, 63, 33)
    assert_close_to_float64(run(a, w, bias, activation=activation), a, w, bias, activation)


def test_contracted_dims_and_output_dims(rng, path):
    a = rng.standard_normal((2, 5, 3, 4)).astype(np.float32)
    w = rng.standard_normal((12, 6)).astype(np.float32)
    actual = run(a, w, num_k_dims=2, n_dims=(2, 3))
    assert actual.shape == (2, 5, 2, 3)
    assert_close_to_float64(actual.reshape(10, 6), a.reshape(10, 12), w)


@pytest.mark.parametrize("groups, layer_n", [(2, 16), (3, 48), (3, 32)])
def test_layers_side_by_side_write_group_major(rng, path, groups, layer_n):
    """Merged layers (horizontal fusion) in their own [rows, N / groups] slices: 32-column layers and
    16- or 48-column ones (a unit's two blocks in two layers)."""
    for m in (1, 5, 17):
        a, w, bias = operands(rng, m, 67, groups * layer_n)
        actual = run(a, w, bias, groups=groups, activation="gelu")
        assert actual.shape == (groups, m, layer_n)
        whole = np.concatenate(list(actual), axis=1)
        assert_close_to_float64(whole, a, w, bias, "gelu")


def test_nonfinite_and_extreme_rows_as_the_float32_op(rng, path):
    a, w, bias = operands(rng, 9, 127, 40)
    a[0] = 0
    a[1, 5] = np.nan
    a[2, 0] = np.inf
    a[3, -1] = -np.inf
    a[4] *= np.float32(1e30)
    a[5] *= np.float32(1e-30)
    a[6, 3] = np.float32(3e38)  # rounds to bfloat16's Inf
    w[:, 7] = 0  # Inf * 0 is NaN in both
    for activation in ("none", "relu", "sigmoid"):
        actual = run(a, w, bias, activation=activation)
        float32_op = ops.fused_matmul(rounded(a), rounded(w), bias, activation=activation).numpy()
        np.testing.assert_array_equal(np.isnan(actual), np.isnan(float32_op))
        np.testing.assert_array_equal(np.isinf(actual), np.isinf(float32_op))
        np.testing.assert_array_equal(actual[np.isinf(actual)], float32_op[np.isinf(float32_op)])
        finite = np.isfinite(float32_op)
        np.testing.assert_allclose(actual[finite], float32_op[finite], rtol=1e-5,
                                   atol=1e-5 * np.abs(float32_op[finite]).max())
    assert np.isnan(actual[1]).all() and np.isinf(run(a, w)[6]).any()


def test_weight_packing(rng):
    w = rng.standard_normal((5, 17)).astype(np.float32)
    packed = bf16_weights.pack(w)
    assert packed.shape == (2, 3, 16, 2) and packed.dtype == bf16_weights.BFLOAT16
    assert packed[16 // 16, 4 // 2, 16 % 16, 4 % 2] == rounded(w)[4, 16]
    assert np.all(packed[1, :, 1:] == 0) and np.all(packed[:, 2, :, 1] == 0)
    np.testing.assert_array_equal(bf16_weights.unpack(packed, 5, 17), rounded(w))
    assert packing.packed_shape(5, 17, np.int8) == (2, 2, 16, 4)


def test_activation_rounding_is_to_nearest_even():
    # 1 + 2^-8 is halfway between bfloat16's 1 and 1 + 2^-7 (ties to 1); 1 + 3 * 2^-8 ties up to 1 + 2^-6.
    a = np.array([[1 + 2**-8, 1 + 3 * 2**-8, 1 + 2**-9]], np.float32)
    np.testing.assert_array_equal(run(a, np.eye(3, dtype=np.float32)), [[1, 1 + 2**-6, 1]])


def test_shape_inference_with_unknown_rows(rng):
    w = rng.standard_normal((12, 6)).astype(np.float32)
    packed = bf16_weights.pack(w)

    @tf.function(input_signature=[tf.TensorSpec([None, None, 3, 4])])
    def dense(a):
        out = ops.fused_matmul_bf16(a, packed, n=6, num_k_dims=2, n_dims=(2, 3))
        assert out.shape.as_list() == [None, None, 2, 3]
        return out

    a = rng.standard_normal((2, 5, 3, 4)).astype(np.float32)
    assert_close_to_float64(dense(a).numpy().reshape(10, 6), a.reshape(10, 12), w)
    with pytest.raises(ValueError, match="must be 3"):  # b's groups for K = 5
        tf.function(lambda a: ops.fused_matmul_bf16(a, packed, n=6)).get_concrete_function(tf.TensorSpec([None, 5]))


def test_not_differentiable(rng):
    a, w, bias = operands(rng, 2, 4, 3)
    a = tf.constant(a)
    with tf.GradientTape() as tape:
        tape.watch(a)
        out = ops.fused_matmul_bf16(a, bf16_weights.pack(w), bias, n=3)
    with pytest.raises(LookupError, match="DietcodeFusedMatMulBf16 .* has no gradient"):
        tape.gradient(out, a)


def test_bad_inputs(rng):
    a, w, bias = operands(rng, 2, 8, 20)
    packed = bf16_weights.pack(w)
    good = {"a": a, "b": packed, "bias": bias, "n": 20}
    cases = [
        ({"b": packed[0]}, "b must be a packed weight"),
        ({"b": packing.pack(w.astype(np.int8))}, "input 'b' must be bfloat16"),
        ({"n": 15}, r"holds 2 blocks of 16 columns; n=15 needs 1"),
        ({"a": a[:, :5]}, "has K=5, which b packs in 3 groups"),
        ({"bias": bias[:3]}, r"bias must have shape \[20\]"),
        ({"a": a.astype(np.float64)}, "input 'a' must be float32"),
        ({"groups": 2}, "n=20 must be 2 layers of a whole positive number of 16-column blocks"),
    ]
    for change, message in cases:
        inputs = {**good, **change}
        with pytest.raises(InvalidArgument, match=message):
            ops.fused_matmul_bf16(inputs["a"], inputs["b"], inputs["bias"], n=inputs["n"],
                                  groups=inputs.get("groups", 1))
