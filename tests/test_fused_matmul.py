"""DietcodeFusedMatMul against TF's MatMul + BiasAdd + activation."""

import numpy as np
import pytest
import tensorflow as tf

from conftest import assert_matches_reference, random_tensor
from tf_dietcode import ops, reference

SHAPES = [  # (M, K, N): edges, primes, the paper's dims
    (1, 1, 1), (0, 5, 3), (4, 0, 3), (3, 5, 0), (1, 768, 2304), (7, 13, 17),
    (31, 37, 41), (16 * 17, 768, 2304), (128, 64, 3072), (97, 3072, 101),
]
ACTIVATIONS = [None, *sorted(set(reference.ACTIVATIONS) - {"none"})]


def operands(rng, m, k, n, transpose_a, transpose_b):
    a = random_tensor(rng, (k, m) if transpose_a else (m, k))
    b = random_tensor(rng, (n, k) if transpose_b else (k, n))
    return a, b, random_tensor(rng, (n,))


@pytest.mark.parametrize("m,k,n", SHAPES)
@pytest.mark.parametrize("transpose_a", [False, True])
@pytest.mark.parametrize("transpose_b", [False, True])
def test_matches_tf_across_shapes_and_layouts(rng, m, k, n, transpose_a, transpose_b):
    a, b, bias = operands(rng, m, k, n, transpose_a, transpose_b)
    actual = ops.fused_matmul(a, b, bias, transpose_a=transpose_a, transpose_b=transpose_b)
    assert_matches_reference(actual, reference.fused_matmul, [a, b, bias],
                             transpose_a=transpose_a, transpose_b=transpose_b)


@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("with_bias", [False, True])
def test_activations_and_optional_bias(rng, activation, with_bias):
    a, b, bias = operands(rng, 33, 96, 130, False, True)
    bias = bias if with_bias else None
    actual = ops.fused_matmul(a, b, bias, transpose_b=True, activation=activation)
    assert_matches_reference(actual, reference.fused_matmul, [a, b, bias], transpose_b=True,
                             activation=activation or "none")


# (a's shape, num_k_dims, n_dims, N): Dense on N-D input, EinsumDense's forms, edges
N_D_CASES = [((2, 3, 8), 1, (), 5), ((2, 0, 8), 1, (), 5), ((4, 3, 2, 8), 1, (), 7), ((8,), 1, (), 5),
             ((2, 5, 3, 4), 2, (), 6), ((2, 5, 12), 1, (3, 4), 12), ((2, 5, 3, 4), 2, (2, 3), 6),
             ((3, 4), 2, (), 5), ((2, 7, 16), 1, (4, 0), 0)]


@pytest.mark.parametrize("shape,num_k_dims,n_dims,n", N_D_CASES)
def test_n_d_input_contracts_its_trailing_dims(rng, shape, num_k_dims, n_dims, n):
    a = random_tensor(rng, shape)
    b = random_tensor(rng, (int(np.prod(shape[len(shape) - num_k_dims:])), n))
    bias = random_tensor(rng, (n,))
    actual = ops.fused_matmul(a, b, bias, activation="relu", num_k_dims=num_k_dims, n_dims=n_dims)
    assert actual.shape == shape[:len(shape) - num_k_dims] + (tuple(n_dims) or (n,))
    contracted = b.reshape(shape[len(shape) - num_k_dims:] + (n,))
    expected = np.maximum(np.tensordot(a.astype(np.float64), contracted, num_k_dims) + bias, 0)
    expected = expected.reshape(actual.shape)
    np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=1e-4)
    assert_matches_reference(actual, reference.fused_matmul, [a, b, bias], activation="relu",
                             num_k_dims=num_k_dims, n_dims=n_dims)


def test_n_d_shapes_are_inferred_with_unknown_dims(rng):
    @tf.function(input_signature=[tf.TensorSpec([None, None, 3, 4]), tf.TensorSpec([12, 6])])
    def einsum_dense(a, b):
        out = ops.fused_matmul(a, b, num_k_dims=2, n_dims=(2, 3))
        assert out.shape.as_list() == [None, None, 2, 3]
        return out

    a, b = random_tensor(rng, (2, 5, 3, 4)), random_tensor(rng, (12, 6))
    assert_matches_reference(einsum_dense(a, b), reference.fused_matmul, [a, b], num_k_dims=2, n_dims=(2, 3))


def test_activation_names_as_keras_passes_them(rng):
    a, b, bias = operands(rng, 3, 4, 5, False, False)
    np.testing.assert_array_equal(ops.fused_matmul(a, b, bias, activation="linear"),
                                  ops.fused_matmul(a, b, bias))
    with pytest.raises(ValueError, match="activation must be one of"):
        ops.fused_matmul(a, b, bias, activation="swish")


def test_tf_function_with_unknown_dims_keeps_them_unknown(rng):
    spec = tf.TensorSpec([None, 64], tf.float32)

    @tf.function(input_signature=[spec, tf.TensorSpec([64, 48]), tf.TensorSpec([48])])
    def dense(a, b, bias):
        out = ops.fused_matmul(a, b, bias, activation="relu")
        assert out.shape.as_list() == [None, 48]
        return out

    for m in (1, 5, 128):
        a, b, bias = operands(rng, m, 64, 48, False, False)
        assert_matches_reference(dense(a, b, bias), reference.fused_matmul, [a, b, bias], activation="relu")


def test_graph_mode_session(rng):
    a, b, bias = operands(rng, 19, 23, 29, True, False)
    with tf.Graph().as_default():
        pa = tf.compat.v1.placeholder(tf.float32, [None, None])
        pb = tf.compat.v1.placeholder(tf.float32, [None, 29])
        pbias = tf.compat.v1.placeholder(tf.float32, [29])
        out = ops.fused_matmul(pa, pb, pbias, transpose_a=True, activation="gelu_tanh")
        with tf.compat.v1.Session() as session:
            actual = session.run(out, {pa: a, pb: b, pbias: bias})
    assert_matches_reference(actual, reference.fused_matmul, [a, b, bias], transpose_a=True,
                             activation="gelu_tanh")


def test_respects_intra_op_threads_result_is_deterministic(rng):
    a, b, bias = operands(rng, 300, 200, 500, False, False)
    first = ops.fused_matmul(a, b, bias).numpy()
    for _ in range(3):
        np.testing.assert_array_equal(ops.fused_matmul(a, b, bias).numpy(), first)


def test_large_shape(rng):
    a, b, bias = operands(rng, 2048, 768, 2304, False, True)
    actual = ops.fused_matmul(a, b, bias, transpose_b=True, activation="gelu_tanh")
    assert_matches_reference(actual, reference.fused_matmul, [a, b, bias], transpose_b=True,
                             activation="gelu_tanh")


@pytest.mark.parametrize("k,n", [(1024, 2048), (768, 768)], ids=["8MiB", "2.25MiB"])
def test_weight_moved_to_huge_pages_reads_the_same(rng, k, n):
    """The op backs its weight with 2 MiB pages on first use, collapsed in place, the
    pages at its ends included (a BERT-base 768x768 weight holds at most one whole
    page): the values read before and after are the same, and so are those of
    tensors allocated around it, which may share its end pages."""
    a, b, bias = operands(rng, 3, k, n, False, True)
    before = [tf.constant(rng.standard_normal(size).astype(np.float32)) for size in (1000, 300_000)]
    b = tf.constant(b)
    after = [tf.constant(rng.standard_normal(size).astype(np.float32)) for size in (1000, 300_000)]
    neighbours = [t.numpy().copy() for t in before + after]
    results = [ops.fused_matmul(a, b, bias, transpose_b=True).numpy() for _ in range(3)]
    for result in results[1:]:
        np.testing.assert_array_equal(result, results[0])
    assert_matches_reference(results[-1], reference.fused_matmul, [a, b, bias], transpose_b=True)
    for tensor, values in zip(before + after, neighbours):
        np.testing.assert_array_equal(tensor.numpy(), values)


@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_non_finite_values_propagate_like_tf(rng, activation):
    a, b, bias = operands(rng, 6, 5, 4, False, False)
    a[0, 0], a[1, 1], a[2, 2] = np.nan, np.inf, -np.inf
    a[3, 0], a[4, 0] = 1e30, -1e30
    bias[3] = np.inf
    actual = ops.fused_matmul(a, b, bias, activation=activation).numpy()
    expected = reference.fused_matmul(a, b, bias, activation=activation or "none").numpy()
    np.testing.assert_array_equal(np.isnan(actual), np.isnan(expected))
    finite = np.isfinite(expected)
    np.testing.assert_array_equal(actual[~finite & ~np.isnan(expected)], expected[~finite & ~np.isnan(expected)])
    np.testing.assert_allclose(actual[finite], expected[finite], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("m,k,n,tile_n,blocks", [(1, 768, 2304, 16, 144), (17, 24, 40, 16, 4),
                                                 (5, 7, 9, 4, 3), (0, 8, 3, 2, 2), (6, 0, 5, 8, 1)])
def test_pre_packed_weight(rng, m, k, n, tile_n, blocks):
    """The generic kernel reads the tuned kernels' packed layout too (shapes
    outside every tuned range), padding included."""
    from tf_dietcode.tuning.templates import dense

    a, w, bias = random_tensor(rng, (m, k)), random_tensor(rng, (n, k)), random_tensor(rng, (n,))
    packed = dense.pack_weight(w, tile_n, blocks)
    actual = ops.fused_matmul(a, packed, bias, activation="gelu", packed_n=n)
    assert_matches_reference(actual, reference.fused_matmul, [a, w, bias], transpose_b=True, activation="gelu")
    np.testing.assert_array_equal(reference.unpack_weight(packed, n).numpy(), w.T)


def test_pre_packed_weight_shape_inference():
    @tf.function(input_signature=[tf.TensorSpec([None, 24], tf.float32), tf.TensorSpec([None, 24, 16], tf.float32)])
    def layer(a, packed):
        out = ops.fused_matmul(a, packed, packed_n=40)
        assert out.shape.as_list() == [None, 40]
        return out

    layer.get_concrete_function()


def grouped(product: np.ndarray, groups: int) -> np.ndarray:
    """[..., groups * n] -> group-major [groups, ..., n]: the layout of the op's groups."""
    return np.moveaxis(product.reshape(*product.shape[:-1], groups, product.shape[-1] // groups), -2, 0)


@pytest.mark.parametrize("rows,k,groups,n", [((5,), 16, 3, 32), ((2, 7), 8, 2, 16), ((1,), 768, 3, 768),
                                             ((0,), 4, 3, 16), ((3,), 0, 2, 16), ((4, 1), 5, 4, 8)])
@pytest.mark.parametrize("layout", ["packed", "stored", "transposed"])
def test_groups_write_each_layer_group_major(rng, rows, k, groups, n, layout):
    """Layers side by side in b (horizontal fusion): each group of n columns is one layer and
    the output is [groups, ..., n], through the generic kernel in every weight layout."""
    from tf_dietcode.tuning.templates import dense

    a, w, bias = (random_tensor(rng, (*rows, k)), random_tensor(rng, (groups * n, k)),
                  random_tensor(rng, (groups * n,)))
    b = {"packed": lambda: dense.pack_weight(w, 8, groups * n // 8 + 2),  # padded past N, as tuned kernels pack
         "stored": lambda: np.ascontiguousarray(w.T), "transposed": lambda: w}[layout]()
    actual = ops.fused_matmul(a, b, bias, activation="relu", groups=groups, transpose_b=layout == "transposed",
                              packed_n=groups * n if layout == "packed" else 0)
    assert actual.shape == (groups, *rows, n)
    expected = grouped(reference.fused_matmul(a, w, bias, transpose_b=True, activation="relu").numpy(), groups)
    np.testing.assert_allclose(actual.numpy(), expected, rtol=1e-5, atol=1e-5 * max(k, 1))
    np.testing.assert_allclose(reference.fused_matmul(a, w, bias, transpose_b=True, activation="relu",
                                                      groups=groups).numpy(), expected, rtol=1e-6, atol=1e-6)
    for i, piece in enumerate(tf.unstack(actual)):  # what the rewriter does with it
        np.testing.assert_array_equal(piece.numpy(), actual.numpy()[i])


def test_groups_shape_inference():
    @tf.function(input_signature=[tf.TensorSpec([None, None, 24], tf.float32), tf.TensorSpec([24, 48], tf.float32)])
    def layer(a, b):
        out = ops.fused_matmul(a, b, groups=3)
        assert out.shape.as_list() == [3, None, None, 16]
        return out

    layer.get_concrete_function()


@pytest.mark.parametrize("b_shape,options,message", [
    ((8, 30), {"groups": 4}, "must divide"),                     # 30 columns in 4 groups
    ((5, 8, 8), {"groups": 2, "packed_n": 36}, "straddle"),      # groups of 18 columns, blocks of 8
    ((8, 12), {"groups": 2, "n_dims": (3, 4)}, "n_dims must be empty"),
])
def test_groups_that_do_not_fit_are_clear_errors(rng, b_shape, options, message):
    a = random_tensor(rng, (3, 8))
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError), match=message):
        ops.fused_matmul(a, random_tensor(rng, b_shape), **options)
