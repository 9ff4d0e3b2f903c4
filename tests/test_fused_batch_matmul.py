"""DietcodeFusedBatchMatMulAdd / Transpose against BatchMatMulV2 + AddV2 / Transpose."""

import numpy as np
import pytest
import tensorflow as tf

from conftest import assert_matches_reference, random_tensor
from tf_dietcode import ops, reference

# (x batch dims, y batch dims, M, K, N): broadcasting, empty and edge sizes.
CASES = [
    ((), (), 5, 7, 3),
    ((4,), (4,), 1, 128, 17),
    ((3, 1), (1, 5), 6, 11, 13),
    ((2, 3), (3,), 7, 5, 9),
    ((1,), (), 17, 64, 17),
    ((192,), (192,), 43, 64, 43),
    ((0,), (0,), 4, 4, 4),
    ((2,), (2,), 0, 3, 4),
    ((2,), (2,), 3, 0, 4),
    ((64, 8), (64, 8), 1, 128, 17),
]


def operands(rng, xb, yb, m, k, n, adj_x, adj_y):
    x = random_tensor(rng, (*xb, k, m) if adj_x else (*xb, m, k))
    y = random_tensor(rng, (*yb, n, k) if adj_y else (*yb, k, n))
    return x, y


def product_shape(xb, yb, m, n):
    return (*np.broadcast_shapes(xb, yb), m, n)


@pytest.mark.parametrize("xb,yb,m,k,n", CASES)
@pytest.mark.parametrize("adj_x,adj_y", [(False, False), (False, True), (True, False), (True, True)])
def test_add_full_addend(rng, xb, yb, m, k, n, adj_x, adj_y):
    x, y = operands(rng, xb, yb, m, k, n, adj_x, adj_y)
    addend = random_tensor(rng, product_shape(xb, yb, m, n))
    actual = ops.fused_batch_matmul_add(x, y, addend, adj_x=adj_x, adj_y=adj_y, alpha=0.125)
    assert_matches_reference(actual, reference.fused_batch_matmul_add, [x, y, addend],
                             adj_x=adj_x, adj_y=adj_y, alpha=0.125)


@pytest.mark.parametrize("addend_shape", [
    (16, 1, 1, 23),   # attention mask [B,1,1,T]
    (1, 23),          # row bias
    (19, 1),          # column bias
    (),               # scalar
    (1, 3, 19, 1),    # broadcast over batch and columns
    (16, 3, 19, 23),  # full
])
def test_add_broadcast_addend(rng, addend_shape):
    x, y = operands(rng, (16, 3), (16, 3), 19, 64, 23, False, True)
    addend = random_tensor(rng, addend_shape)
    actual = ops.fused_batch_matmul_add(x, y, addend, adj_y=True)
    assert_matches_reference(actual, reference.fused_batch_matmul_add, [x, y, addend], adj_y=True)


@pytest.mark.parametrize("xb,yb,m,k,n", CASES)
def test_transpose_context_layout(rng, xb, yb, m, k, n):
    x, y = operands(rng, xb, yb, m, k, n, False, False)
    rank = len(product_shape(xb, yb, m, n))
    for perm in {tuple(range(rank)), tuple(reversed(range(rank))),
                 tuple(range(rank - 2)) + (rank - 1, rank - 2), (rank - 2,) + tuple(range(rank - 2)) + (rank - 1,)}:
        actual = ops.fused_batch_matmul_transpose(x, y, perm, alpha=2.0)
        assert_matches_reference(actual, reference.fused_batch_matmul_transpose, [x, y],
                                 perm=list(perm), alpha=2.0)


@pytest.mark.parametrize("perm", [[0, 2, 1, 3], [0, 1, 3, 2], [2, 0, 3, 1]])
@pytest.mark.parametrize("adj_x,adj_y", [(False, False), (True, True)])
def test_transpose_attention_shapes(rng, perm, adj_x, adj_y):
    x, y = operands(rng, (4, 12), (4, 12), 37, 37, 64, adj_x, adj_y)
    actual = ops.fused_batch_matmul_transpose(x, y, perm, adj_x=adj_x, adj_y=adj_y)
    assert_matches_reference(actual, reference.fused_batch_matmul_transpose, [x, y],
                             perm=perm, adj_x=adj_x, adj_y=adj_y)


@pytest.mark.parametrize("b,t,s,heads,depth", [(2, 17, 17, 12, 64), (1, 1, 5, 3, 8), (3, 0, 4, 2, 4), (2, 7, 1, 1, 16)])
def test_operand_permutations_read_projections_in_place(rng, b, t, s, heads, depth):
    """Keras attention: [B, T, heads, depth] projections read as [B, heads, T, depth]."""
    query, key, value = (random_tensor(rng, (b, n, heads, depth)) for n in (t, s, s))
    mask = random_tensor(rng, (b, 1, 1, s))
    scores = ops.fused_batch_matmul_add(query, key, mask, x_perm=[0, 2, 1, 3], y_perm=[0, 2, 1, 3],
                                        adj_y=True, alpha=0.125)
    assert_matches_reference(scores, reference.fused_batch_matmul_add, [query, key, mask], x_perm=[0, 2, 1, 3],
                             y_perm=[0, 2, 1, 3], adj_y=True, alpha=0.125)
    context = ops.fused_batch_matmul_transpose(scores, value, [0, 2, 1, 3], y_perm=[0, 2, 1, 3])
    assert_matches_reference(context, reference.fused_batch_matmul_transpose, [scores, value],
                             perm=[0, 2, 1, 3], y_perm=[0, 2, 1, 3])


def test_operand_permutation_with_broadcast_and_adjoint(rng):
    x = random_tensor(rng, (5, 3, 4, 2))   # read as [4, 3, K=5, M=2], an adjoint
    y = random_tensor(rng, (6, 3, 1, 5))   # read as [1, 3, N=6, K=5], an adjoint broadcast over 4
    actual = ops.fused_batch_matmul_add(x, y, 0.5, x_perm=[2, 1, 0, 3], y_perm=[2, 1, 0, 3], adj_x=True, adj_y=True)
    assert_matches_reference(actual, reference.fused_batch_matmul_add, [x, y, tf.constant(0.5)],
                             x_perm=[2, 1, 0, 3], y_perm=[2, 1, 0, 3], adj_x=True, adj_y=True)


def test_operand_permutations_in_shape_functions():
    @tf.function(input_signature=[tf.TensorSpec([None, None, 12, 64]), tf.TensorSpec([None, None, 12, 64])])
    def scores(q, k):
        product = ops.fused_batch_matmul_transpose(q, k, [0, 1, 3, 2], x_perm=[0, 2, 1, 3], y_perm=[0, 2, 1, 3],
                                                   adj_y=True)
        assert product.shape.as_list() == [None, 12, None, None]
        return product

    assert scores.get_concrete_function() is not None


def test_tf_function_with_unknown_dims(rng):
    spec = tf.TensorSpec([None, 12, None, 64], tf.float32)

    @tf.function(input_signature=[spec, spec, tf.TensorSpec([None, 1, 1, None])])
    def attention(q, k, mask):
        scores = ops.fused_batch_matmul_add(q, k, mask, adj_y=True)
        context = ops.fused_batch_matmul_transpose(scores, k, [0, 2, 1, 3])
        assert scores.shape.as_list() == [None, 12, None, None]
        assert context.shape.as_list() == [None, None, 12, 64]
        return context

    for t in (1, 17, 64):
        q, k = (random_tensor(rng, (2, 12, t, 64)) for _ in range(2))
        mask = random_tensor(rng, (2, 1, 1, t))
        expected = tf.transpose(tf.matmul(tf.matmul(q, k, transpose_b=True) + mask, k), [0, 2, 1, 3])
        np.testing.assert_allclose(attention(q, k, mask), expected, rtol=1e-4, atol=1e-4)


def test_graph_mode_session(rng):
    x, y = operands(rng, (3,), (3,), 8, 9, 10, False, False)
    addend = random_tensor(rng, (3, 1, 10))
    with tf.Graph().as_default():
        px, py, pa = (tf.compat.v1.placeholder(tf.float32, None) for _ in range(3))
        added = ops.fused_batch_matmul_add(px, py, pa)
        transposed = ops.fused_batch_matmul_transpose(px, py, [2, 1, 0])
        with tf.compat.v1.Session() as session:
            got_add, got_transpose = session.run([added, transposed], {px: x, py: y, pa: addend})
    assert_matches_reference(got_add, reference.fused_batch_matmul_add, [x, y, addend])
    assert_matches_reference(got_transpose, reference.fused_batch_matmul_transpose, [x, y], perm=[2, 1, 0])
