"""Python API of the Dietcode fused ops.

Each wrapper checks dtypes, loads the op library on first use and calls the op;
`bundle` is the path of a tuned kernel bundle (a string tensor, usually a
SavedModel asset), "" for the generic kernel. The op library loads a bundle
once per process and keeps it by path, so a bundle written later at the same
path is not seen until the process restarts: give each bundle a path of its
own (optimize() and DietDense name theirs by content, see bundle_store).
"""

import json
from collections.abc import Sequence

import tensorflow as tf

from tf_dietcode import gradients  # noqa: F401  (registers the ops' gradients)
from tf_dietcode.op_contract import ACTIVATIONS
from tf_dietcode.op_library import load_op_library

TensorLike = tf.types.experimental.TensorLike


def _typed(value: TensorLike, dtype: tf.DType, name: str) -> tf.Tensor:
    tensor = tf.convert_to_tensor(value)
    if tensor.dtype != dtype:
        raise tf.errors.InvalidArgumentError(
            None, None, f"input '{name}' must be {dtype.name}, got {tensor.dtype.name}")
    return tensor


def _float32(value: TensorLike, name: str) -> tf.Tensor:
    return _typed(value, tf.float32, name)


def _activation_name(activation: str | None) -> str:
    name = "none" if activation in (None, "linear") else activation
    if name not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {sorted(ACTIVATIONS)} or None, got {activation!r}")
    return name


def fused_matmul(a: TensorLike, b: TensorLike, bias: TensorLike | None = None, *,
                 transpose_a: bool = False, transpose_b: bool = False,
                 activation: str | None = None, bundle: TensorLike = "",
                 packed_n: int = 0, num_k_dims: int = 1, n_dims: Sequence[int] = (), groups: int = 1,
                 name: str | None = None) -> tf.Tensor:
    """activation(op(a) @ op(b) + bias) in one op: a[..., K] (or [K, M]), b[K, N] (or [N, K]),
    bias[N] -> [..., N], as a Dense layer on N-D input.

    a's last num_k_dims dims are contracted (K is their product) and n_dims, if
    given, splits N into the output's trailing dims: EinsumDense's
    'abcd,cde->abe' is num_k_dims=2, and 'abc,cde->abde' is n_dims=(d, e).
    With packed_n = N > 0, b is a pre-packed weight [blocks, K, tile_n] (the
    layout tuned dense kernels read, see tuning.templates.dense.pack_weight).
    With groups > 1, b holds that many layers side by side (N / groups columns
    each) and the output is group-major, [groups, ..., N / groups]: tf.unstack
    along axis 0 gives each layer's output without a copy (horizontal fusion).
    """
    return load_op_library().dietcode_fused_mat_mul(
        a=_float32(a, "a"), b=_float32(b, "b"),
        bias=[] if bias is None else [_float32(bias, "bias")],
        bundle=bundle, transpose_a=transpose_a, transpose_b=transpose_b,
        activation=_activation_name(activation), packed_n=packed_n, num_k_dims=num_k_dims,
        n_dims=[int(d) for d in n_dims], groups=groups, name=name)


def _batch_options(x_perm, y_perm, adj_x, adj_y, alpha) -> dict:
    return {"x_perm": [int(p) for p in x_perm or ()], "y_perm": [int(p) for p in y_perm or ()],
            "adj_x": adj_x, "adj_y": adj_y, "alpha": alpha}


def fused_batch_matmul_add(x: TensorLike, y: TensorLike, addend: TensorLike, *,
                           adj_x: bool = False, adj_y: bool = False, alpha: float = 1.0,
                           x_perm: Sequence[int] | None = None, y_perm: Sequence[int] | None = None,
                           bundle: TensorLike = "", name: str | None = None) -> tf.Tensor:
    """alpha * BatchMatMulV2(x', y') + addend, with addend broadcastable to the product.

    x' = tf.transpose(x, x_perm) and y' likewise, read in place (no transpose
    runs); an operand permutation must keep the last axis last.
    """
    return load_op_library().dietcode_fused_batch_mat_mul_add(
        x=_float32(x, "x"), y=_float32(y, "y"), addend=_float32(addend, "addend"),
        bundle=bundle, name=name, **_batch_options(x_perm, y_perm, adj_x, adj_y, alpha))


def fused_batch_matmul_transpose(x: TensorLike, y: TensorLike, perm: Sequence[int], *,
                                 adj_x: bool = False, adj_y: bool = False, alpha: float = 1.0,
                                 x_perm: Sequence[int] | None = None, y_perm: Sequence[int] | None = None,
                                 bundle: TensorLike = "", name: str | None = None) -> tf.Tensor:
    """tf.transpose(alpha * BatchMatMulV2(x', y'), perm) in one op (x', y' as in fused_batch_matmul_add)."""
    return load_op_library().dietcode_fused_batch_mat_mul_transpose(
        x=_float32(x, "x"), y=_float32(y, "y"), bundle=bundle, perm=[int(p) for p in perm],
        name=name, **_batch_options(x_perm, y_perm, adj_x, adj_y, alpha))


def layer_norm(x: TensorLike, gamma: TensorLike, beta: TensorLike, *, residual: TensorLike | None = None,
               epsilon: float = 1e-3, name: str | None = None) -> tf.Tensor:
    """(s - mean) * rsqrt(variance + epsilon) * gamma + beta over s's last axis, s being x or
    x + residual (broadcast as tf.add does), gamma and beta [depth]: Keras' LayerNormalization,
    and a Transformer's residual add before it, in one op instead of a dozen."""
    return load_op_library().dietcode_layer_norm(
        x=_float32(x, "x"), gamma=_float32(gamma, "gamma"), beta=_float32(beta, "beta"),
        residual=[] if residual is None else [_float32(residual, "residual")], epsilon=epsilon, name=name)


def softmax(logits: TensorLike, *, log: bool = False, mask: TensorLike | None = None, fill: float = 0.0,
            name: str | None = None) -> tf.Tensor:
    """tf.nn.softmax (log: tf.nn.log_softmax) over the last axis, in one op of ours (TF's
    oneDNN softmax has a large fixed cost per call, its LogSoftmax a slow one per element).
    With a bool `mask`: of tf.where(mask, logits, fill), broadcast as tf.where does, in the same
    pass (attention's masked scores)."""
    masks = [] if mask is None else [_typed(mask, tf.bool, "mask")]
    return load_op_library().dietcode_softmax(logits=_float32(logits, "logits"), mask=masks, log=log, fill=fill,
                                              name=name)


def reorder_append(cache: TensorLike, rows: TensorLike, new_entries: TensorLike, *, axis: int,
                   name: str | None = None) -> tf.Tensor:
    """tf.concat([tf.gather(cache, rows), new_entries], axis) in one copy: a beam search's cache
    reordered by the chosen beams' parents and this step's keys or values appended (axis >= 1)."""
    return load_op_library().dietcode_reorder_append(
        cache=_float32(cache, "cache"), rows=_typed(rows, tf.int32, "rows"),
        new_entries=_float32(new_entries, "new_entries"), axis=axis, name=name)


def bundle_stats(bundle: str) -> dict:
    """How this process uses a kernel bundle: "problem" (why it is not used,
    "" when it is), calls per tuned kernel of each workload, generic calls, and
    tuned calls by their use of the intra-op pool: "calling_thread_calls" (too
    small to split, run on the op's own thread), "launcher_joined_calls" (the
    op's thread running tasks beside one pool thread) and "pool_calls" (every
    task on the pool)."""
    return json.loads(load_op_library().dietcode_bundle_stats(bundle=bundle).numpy())


def fused_matmul_int8(a: TensorLike, b: TensorLike, scale: TensorLike, column_sums: TensorLike,
                      bias: TensorLike | None = None, *, n: int, activation: str | None = None,
                      num_k_dims: int = 1, n_dims: Sequence[int] = (), groups: int = 1,
                      name: str | None = None) -> tf.Tensor:
    """activation(a @ w + bias) with an int8 weight w[k, j] ~ b[k, j] * scale[j] (packed, see
    tf_dietcode.precision.int8_weights.quantize, which also gives column_sums), a[..., K]
    quantized per row inside the op; n is N. The op's Doc (DietcodeFusedMatMulInt8) states the
    computation exactly. num_k_dims, n_dims and groups as in fused_matmul (each of the groups
    a whole number of 16-column blocks). Not differentiable."""
    return load_op_library().dietcode_fused_mat_mul_int8(
        a=_float32(a, "a"), b=_typed(b, tf.int8, "b"), scale=_float32(scale, "scale"),
        column_sums=_typed(column_sums, tf.int32, "column_sums"),
        bias=[] if bias is None else [_float32(bias, "bias")], n=n,
        activation=_activation_name(activation), num_k_dims=num_k_dims, n_dims=[int(d) for d in n_dims],
        groups=groups, name=name)


def fused_matmul_bf16(a: TensorLike, b: TensorLike, bias: TensorLike | None = None, *, n: int,
                      activation: str | None = None, num_k_dims: int = 1, n_dims: Sequence[int] = (),
                      groups: int = 1, name: str | None = None) -> tf.Tensor:
    """activation(bf16(a) @ b + bias) with b a packed bfloat16 weight
    (tf_dietcode.precision.bf16_weights.pack), products summed in float32; n is N.
    num_k_dims, n_dims and groups as in fused_matmul (each of the groups a whole number of
    16-column blocks). Not differentiable."""
    return load_op_library().dietcode_fused_mat_mul_bf16(
        a=_float32(a, "a"), b=_typed(b, tf.bfloat16, "b"),
        bias=[] if bias is None else [_float32(bias, "bias")], n=n,
        activation=_activation_name(activation), num_k_dims=num_k_dims, n_dims=[int(d) for d in n_dims],
        groups=groups, name=name)


def low_precision_isa() -> dict:
    """The kernel path each reduced-precision op runs on this machine now, e.g.
    {"int8": "avx512_vnni", "bfloat16": "avx512_bf16"} (TF_DIETCODE_DISABLE_ISA masks extensions)."""
    return json.loads(load_op_library().dietcode_low_precision_isa().numpy())
