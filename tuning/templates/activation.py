"""Activations as TE expressions, matching tf_dietcode.reference.ACTIVATIONS."""

import math

from tvm import te, tirx


def apply(name: str, x):
    if name == "none":
        return x
    if name == "relu":
        return te.max(x, tirx.const(0.0, "float32"))
    if name == "tanh":
        return te.tanh(x)
    if name == "sigmoid":
        return te.sigmoid(x)
    if name == "gelu":
        return 0.5 * x * (1.0 + te.erf(x * (1.0 / math.sqrt(2.0))))
    if name == "gelu_tanh":
        return 0.5 * x * (1.0 + te.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x * x * x)))
    raise ValueError(f"unknown activation {name!r}")
