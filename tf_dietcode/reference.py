"""The fused ops' computations written with standard TF ops.

The single definition of what each fused op means: gradients are derived from
it and tests compare the fused kernels against it.
"""

import functools

import tensorflow as tf

ACTIVATIONS = {
    "none": tf.identity,
    "relu": tf.nn.relu,
    "tanh": tf.tanh,
    "sigmoid": tf.sigmoid,
    "gelu": functools.partial(tf.nn.gelu, approximate=False),
    "gelu_tanh": functools.partial(tf.nn.gelu, approximate=True),
    "silu": tf.nn.silu,
}


def unpack_weight(packed, n):
    """A pre-packed b[blocks, K, tile_n] as the [K, N] matrix it holds."""
    k = tf.shape(packed)[1]
    return tf.reshape(tf.transpose(packed, [1, 0, 2]), [k, -1])[:, :n]


def fused_matmul(a, b, bias=None, *, transpose_a=False, transpose_b=False, activation="none", packed_n=0,
                 num_k_dims=1, n_dims=(), groups=1):
    if packed_n:
        b = unpack_weight(b, packed_n)
    rows = tf.shape(a)[1:] if transpose_a else tf.shape(a)[:tf.rank(a) - num_k_dims]
    if not transpose_a:
        # Explicit row count: with -1, TF reads an empty [0, 0] as one row.
        a = tf.reshape(a, [tf.reduce_prod(rows), tf.reduce_prod(tf.shape(a)[tf.rank(a) - num_k_dims:])])
    product = tf.linalg.matmul(a, b, transpose_a=transpose_a, transpose_b=transpose_b)
    if bias is not None:
        product = tf.nn.bias_add(product, bias)
    product = ACTIVATIONS[activation](product)
    if groups > 1:  # [M, groups * n] -> group-major [groups, M, n]
        group_n = tf.shape(product)[1] // groups
        product = tf.transpose(tf.reshape(product, [tf.shape(product)[0], groups, group_n]), [1, 0, 2])
        return tf.reshape(product, tf.concat([[groups], rows, [group_n]], 0))
    columns = tf.constant(list(n_dims), tf.int32) if n_dims else tf.shape(product)[1:]
    return tf.reshape(product, tf.concat([rows, columns], 0))


def _scaled_product(x, y, adj_x, adj_y, alpha, x_perm, y_perm):
    x = tf.transpose(x, x_perm) if x_perm else x
    y = tf.transpose(y, y_perm) if y_perm else y
    product = tf.linalg.matmul(x, y, adjoint_a=adj_x, adjoint_b=adj_y)
    return product if alpha == 1.0 else product * alpha


def fused_batch_matmul_add(x, y, addend, *, adj_x=False, adj_y=False, alpha=1.0, x_perm=None, y_perm=None):
    return _scaled_product(x, y, adj_x, adj_y, alpha, x_perm, y_perm) + addend


def fused_batch_matmul_transpose(x, y, *, perm, adj_x=False, adj_y=False, alpha=1.0, x_perm=None, y_perm=None):
    return tf.transpose(_scaled_product(x, y, adj_x, adj_y, alpha, x_perm, y_perm), perm)


def layer_norm(x, gamma, beta, *, epsilon=1e-3):
    """Keras' LayerNormalization over the last axis."""
    mean, variance = tf.nn.moments(x, axes=[-1], keepdims=True)
    return (x - mean) * tf.math.rsqrt(variance + epsilon) * gamma + beta


def reorder_append(cache, rows, new_entries, *, axis):
    """A beam search's cache step: the cache's rows reordered, the new entries appended along axis."""
    return tf.concat([tf.gather(cache, rows), new_entries], axis=axis)
