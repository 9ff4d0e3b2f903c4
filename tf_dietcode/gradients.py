"""Gradients of the fused ops, derived from their reference TF-op definitions.

Each gradient re-runs the op's reference composition under a GradientTape and
takes its vector-Jacobian product, so the backward pass is built from standard
TF ops (differentiable again, and correct by construction). The price is one
recomputed forward product per backward pass.
"""

import tensorflow as tf

from tf_dietcode import reference


def _vjp(function, inputs, output_gradient):
    with tf.GradientTape() as tape:
        tape.watch(inputs)
        output = function(*inputs)
    return tape.gradient(output, inputs, output_gradients=output_gradient,
                         unconnected_gradients=tf.UnconnectedGradients.ZERO)


def _batch_attrs(op):
    return {name: op.get_attr(name) for name in ("adj_x", "adj_y", "alpha", "x_perm", "y_perm")}


@tf.RegisterGradient("DietcodeFusedMatMul")
def _fused_matmul_gradient(op, grad):
    attrs = {name: op.get_attr(name) for name in ("transpose_a", "transpose_b", "packed_n", "num_k_dims", "n_dims",
                                                      "groups")}
    attrs["activation"] = op.get_attr("activation").decode()
    operands = list(op.inputs[:-1])  # a, b and the optional bias; not the bundle path
    grads = _vjp(lambda a, b, *bias: reference.fused_matmul(a, b, *bias, **attrs), operands, grad)
    return [*grads, None]


@tf.RegisterGradient("DietcodeFusedBatchMatMulAdd")
def _fused_batch_matmul_add_gradient(op, grad):
    attrs = _batch_attrs(op)
    grads = _vjp(lambda x, y, addend: reference.fused_batch_matmul_add(x, y, addend, **attrs),
                 list(op.inputs[:3]), grad)
    return [*grads, None]


@tf.RegisterGradient("DietcodeFusedBatchMatMulTranspose")
def _fused_batch_matmul_transpose_gradient(op, grad):
    attrs = {**_batch_attrs(op), "perm": op.get_attr("perm")}
    grads = _vjp(lambda x, y: reference.fused_batch_matmul_transpose(x, y, **attrs),
                 list(op.inputs[:2]), grad)
    return [*grads, None]


@tf.RegisterGradient("DietcodeLayerNorm")
def _layer_norm_gradient(op, grad):
    epsilon = op.get_attr("epsilon")

    def layer_norm(x, gamma, beta, *residual):
        return reference.layer_norm(x + residual[0] if residual else x, gamma, beta, epsilon=epsilon)
    return _vjp(layer_norm, list(op.inputs), grad)


@tf.RegisterGradient("DietcodeSoftmax")
def _softmax_gradient(op, grad):
    softmax = tf.nn.log_softmax if op.get_attr("log") else tf.nn.softmax
    if len(op.inputs) == 1:
        return _vjp(softmax, list(op.inputs), grad)
    logits, mask = op.inputs
    fill = op.get_attr("fill")
    return [_vjp(lambda x: softmax(tf.where(mask, x, fill)), [logits], grad)[0], None]


@tf.RegisterGradient("DietcodeReorderAppend")
def _reorder_append_gradient(op, grad):
    axis = op.get_attr("axis")
    cache, rows, entries = op.inputs
    grads = _vjp(lambda c, e: reference.reorder_append(c, rows, e, axis=axis), [cache, entries], grad)
    return [grads[0], None, grads[1]]


def _inference_only(op, grad):
    raise LookupError(f"{op.type} reads int8 or bfloat16 weights converted for inference "
                      "and has no gradient; differentiate the float32 model instead")


for _op_type in ("DietcodeFusedMatMulInt8", "DietcodeFusedMatMulBf16"):
    tf.RegisterGradient(_op_type)(_inference_only)
