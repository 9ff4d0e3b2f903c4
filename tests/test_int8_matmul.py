"""DietcodeFusedMatMulInt8 against the exact integer reference, on every kernel path this CPU runs."""

import numpy as np
import pytest
import tensorflow as tf

from low_precision_paths import ACTIVATIONS, PATHS, SHAPES, kernel_path_fixture
from tf_dietcode import ops, reference
from tf_dietcode.precision import int8_weights, packing

InvalidArgument = tf.errors.InvalidArgumentError
path = kernel_path_fixture("int8")


def operands(rng, m, k, n):
    a = rng.standard_normal((m, k)).astype(np.float32)
    weight = int8_weights.quantize(rng.standard_normal((k, n)).astype(np.float32))
    return a, weight, rng.standard_normal(n).astype(np.float32)


def run(a, weight, bias=None, **options):
    return ops.fused_matmul_int8(a, weight.packed, weight.scale, weight.column_sums, bias, n=weight.n,
                                 **options).numpy()


@pytest.mark.parametrize("with_bias", [False, True])
def test_exact_on_every_path(rng, path, with_bias):
    for m, k, n in SHAPES:
        a, weight, bias = operands(rng, m, k, n)
        bias = bias if with_bias else None
        np.testing.assert_array_equal(run(a, weight, bias), int8_weights.reference(a, weight, bias),
                                      err_msg=f"M={m} K={k} N={n}")


@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_activations(rng, path, activation):
    a, weight, bias = operands(rng, 17, 63, 33)
    expected = int8_weights.reference(a, weight, bias, activation)
    pre_activation = int8_weights.reference(a, weight, bias)
    np.testing.assert_allclose(run(a, weight, bias, activation=activation), expected, rtol=4e-7,
                               atol=4 * np.finfo(np.float32).eps * np.abs(pre_activation).max())


def test_contracted_dims_and_output_dims(rng, path):
    a = rng.standard_normal((2, 5, 3, 4)).astype(np.float32)
    weight = int8_weights.quantize(rng.standard_normal((12, 6)).astype(np.float32))
    actual = run(a, weight, num_k_dims=2, n_dims=(2, 3))
    assert actual.shape == (2, 5, 2, 3)
    np.testing.assert_array_equal(actual.reshape(10, 6), int8_weights.reference(a.reshape(10, 12), weight))


@pytest.mark.parametrize("groups, layer_n", [(2, 16), (3, 48), (3, 32)])
def test_layers_side_by_side_write_group_major(rng, path, groups, layer_n):
    """Merged layers (horizontal fusion): each layer's columns land in its own [rows, N / groups]
    slice; 32-column layers (a unit's two blocks in one layer) and 16- or 48-column ones (a unit's
    two blocks in two layers) alike."""
    for m in (1, 5, 17):
        a, weight, bias = operands(rng, m, 67, groups * layer_n)
        actual = run(a.reshape(m, 1, 67), weight, bias, groups=groups, activation="relu")
        assert actual.shape == (groups, m, 1, layer_n)
        expected = int8_weights.reference(a, weight, bias, "relu")
        for g in range(groups):
            np.testing.assert_array_equal(actual[g, :, 0], expected[:, g * layer_n:(g + 1) * layer_n])


def test_zero_nonfinite_and_extreme_rows(rng, path):
    a, weight, bias = operands(rng, 8, 127, 40)
    a[0] = 0
    a[1, 5] = np.nan
    a[2, 0] = np.inf
    a[3, -1] = -np.inf
    a[4] *= np.float32(1e30)
    a[5] *= np.float32(1e-30)
    a[6, :] = -1e30  # every element at the row's maximum magnitude
    for activation in ("none", "relu"):
        actual = run(a, weight, bias, activation=activation)
        np.testing.assert_array_equal(actual, int8_weights.reference(a, weight, bias, activation))
        assert np.all(np.isnan(actual[1:4])) and np.all(np.isfinite(actual[[0, 4, 5, 6, 7]]))
        np.testing.assert_array_equal(actual[0], np.maximum(bias, 0) if activation == "relu" else bias)


def test_quantization_error_is_small(rng, path):
    a = rng.standard_normal((64, 768)).astype(np.float32)
    w = rng.standard_normal((768, 768)).astype(np.float32)
    exact = a.astype(np.float64) @ w
    error = np.abs(run(a, int8_weights.quantize(w)) - exact).max()
    assert error < 0.02 * np.abs(exact).max()


def test_weight_packing_and_quantization(rng):
    w = rng.standard_normal((5, 17)).astype(np.float32)
    w[:, 3] = 0
    weight = int8_weights.quantize(w)
    assert weight.packed.shape == (2, 2, 16, 4) and weight.packed.dtype == np.int8
    q = weight.quantized()
    np.testing.assert_array_equal(packing.unpack(packing.pack(q), 5, 17), q)
    assert weight.packed[16 // 16, 4 // 4, 16 % 16, 4 % 4] == q[4, 16] and np.all(weight.packed[1, :, 1:] == 0)
    assert weight.scale[3] == 0 and np.all(q[:, 3] == 0)
    np.testing.assert_array_equal(weight.column_sums, q.astype(np.int64).sum(axis=0))
    assert np.abs(q).max() == 127 and q.min() >= -127
    np.testing.assert_allclose(weight.dequantized(), w, atol=np.abs(w).max(axis=0).max() / 254 * 1.0001)


def test_row_quantization_rounds_half_to_even():
    a = np.array([[127, 0.5, 1.5, 2.5, -0.5, -2.5]], np.float32)
    q, scale = int8_weights.quantize_rows(a)
    assert scale[0] == 1 and q.tolist() == [[127, 0, 2, 2, 0, -2]]
    weight = int8_weights.quantize(np.eye(6, dtype=np.float32) * 127)
    np.testing.assert_array_equal(run(a, weight), q.astype(np.float32) * 127)  # q[k] * b_q = 127 * q[k], scales 1


def test_shape_inference_with_unknown_rows(rng):
    weight = int8_weights.quantize(rng.standard_normal((12, 6)).astype(np.float32))

    @tf.function(input_signature=[tf.TensorSpec([None, None, 3, 4])])
    def dense(a):
        out = ops.fused_matmul_int8(a, weight.packed, weight.scale, weight.column_sums, n=6, num_k_dims=2,
                                    n_dims=(2, 3))
        assert out.shape.as_list() == [None, None, 2, 3]
        return out

    a = rng.standard_normal((2, 5, 3, 4)).astype(np.float32)
    np.testing.assert_array_equal(dense(a).numpy().reshape(10, 6), int8_weights.reference(a.reshape(10, 12), weight))
    with pytest.raises(ValueError, match="must be 2"):  # b's groups for K = 5
        tf.function(lambda a: ops.fused_matmul_int8(a, weight.packed, weight.scale, weight.column_sums, n=6)
                    ).get_concrete_function(tf.TensorSpec([None, 5]))


def test_not_differentiable(rng):
    a, weight, bias = operands(rng, 2, 4, 3)
    a = tf.constant(a)
    with tf.GradientTape() as tape:
        tape.watch(a)
        out = ops.fused_matmul_int8(a, weight.packed, weight.scale, weight.column_sums, bias, n=3)
    with pytest.raises(LookupError, match="DietcodeFusedMatMulInt8 .* has no gradient"):
        tape.gradient(out, a)


def bad_inputs(rng):
    a, weight, bias = operands(rng, 2, 8, 20)
    good = {"a": a, "b": weight.packed, "scale": weight.scale, "column_sums": weight.column_sums, "bias": bias,
            "n": 20}
    return [
        ({"b": weight.packed[0]}, "b must be a packed weight"),
        ({"b": weight.packed[..., :2]}, "b must be a packed weight"),
        ({"n": 33}, r"holds 2 blocks of 16 columns; n=33 needs 3"),
        ({"a": a[:, :4]}, "has K=4, which b packs in 1 groups"),
        ({"a": a[0, 0]}, r"a must be \[..., K\]"),
        ({"scale": weight.scale[:5]}, r"scale must have shape \[20\]"),
        ({"column_sums": weight.column_sums[None]}, r"column_sums must have shape \[20\]"),
        ({"bias": bias[:3]}, r"bias must have shape \[20\]"),
        ({"b": weight.packed.astype(np.int32)}, "input 'b' must be int8"),
        ({"column_sums": weight.column_sums.astype(np.int64)}, "input 'column_sums' must be int32"),
        ({"groups": 2}, "n=20 must be 2 layers of a whole positive number of 16-column blocks"),
        ({"groups": 0}, "groups"),
    ], good


def test_bad_inputs(rng):
    cases, good = bad_inputs(rng)
    for change, message in cases:
        inputs = {**good, **change}
        with pytest.raises(InvalidArgument, match=message):
            ops.fused_matmul_int8(inputs["a"], inputs["b"], inputs["scale"], inputs["column_sums"], inputs["bias"],
                                  n=inputs["n"], groups=inputs.get("groups", 1))


def test_k_beyond_exact_int32_sums():
    k = 131073
    with pytest.raises(InvalidArgument, match="K=131073 is above 131072"):
        ops.fused_matmul_int8(np.ones((1, k), np.float32), np.zeros((1, -(-k // 4), 16, 4), np.int8),
                              np.ones(1, np.float32), np.zeros(1, np.int32), n=1)


def test_isa_report_follows_disabled_extensions():
    from low_precision_paths import disabled_isa
    with disabled_isa(("avx512f", "amx_tile")):
        assert ops.low_precision_isa() == {"int8": "avx2", "bfloat16": "avx2"}
    assert set(ops.low_precision_isa()["int8"] for _ in range(2)) <= set(PATHS["int8"])
