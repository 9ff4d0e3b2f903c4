"""int8 weights with per-column scales, and the int8 dense op's exact computation.

DietcodeFusedMatMulInt8 computes act(float(q_a @ b_q) * s_row * scale + bias):
the weight quantized here once (symmetric, one scale per output column), the
activations quantized per row by the op at run time. `reference` is that
computation in numpy, exact up to the activation function.
"""

import dataclasses

import numpy as np

from tf_dietcode import reference as tf_reference
from tf_dietcode.precision import packing

# Symmetric quantization: values in [-127, 127], so that -x is representable for every x.
LEVELS = np.float32(127)


@dataclasses.dataclass(frozen=True)
class Int8Weight:
    """A weight [K, N] as the int8 op reads it: w[k, j] ~ b_q[k, j] * scale[j]."""

    packed: np.ndarray  # int8 [ceil(N / 16), ceil(K / 4), 16, 4]
    scale: np.ndarray  # float32 [N]
    column_sums: np.ndarray  # int32 [N]: sum over k of b_q[k, j]
    k: int
    n: int

    def quantized(self) -> np.ndarray:
        """b_q [K, N], int8."""
        return packing.unpack(self.packed, self.k, self.n)

    def dequantized(self) -> np.ndarray:
        """b_q * scale [K, N], float32: the weight the op multiplies by."""
        return self.quantized().astype(np.float32) * self.scale


def _symmetric(values: np.ndarray, amax: np.ndarray, axis: int) -> tuple[np.ndarray, np.ndarray]:
    """(q, s): s = amax / 127 and q = clamp(rint(values / s), -127, 127), s broadcast along
    `axis`; q = 0 where s = 0."""
    scale = (amax / LEVELS).astype(np.float32)
    divisor = np.expand_dims(scale, axis)
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.where(divisor > 0, np.clip(np.rint(values / divisor), -127, 127), 0)
    return q.astype(np.int8), scale


def quantize(weight: np.ndarray) -> Int8Weight:
    """weight [K, N] float32 -> int8 with one scale per column, max |w[:, j]| / 127 (0 for a zero column)."""
    weight = np.asarray(weight)
    if weight.ndim != 2 or weight.dtype != np.float32:
        raise ValueError(f"weight must be a float32 matrix [K, N], got {weight.dtype} {weight.shape}")
    if not np.all(np.isfinite(weight)):
        raise ValueError("weight holds NaN or Inf, which int8 cannot represent")
    q, scale = _symmetric(weight, np.max(np.abs(weight), axis=0, initial=np.float32(0)), axis=0)
    return Int8Weight(packed=packing.pack(q), scale=scale, column_sums=q.sum(axis=0, dtype=np.int32),
                      k=weight.shape[0], n=weight.shape[1])


def quantize_rows(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The op's activation quantization of a[M, K] float32: (q int8 [M, K], s float32 [M]),
    s_i = max |a[i]| / 127; a row holding NaN or Inf gets s_i = NaN and q = 0."""
    magnitude = np.abs(a)
    finite = np.all(np.isfinite(a), axis=1)
    amax = np.where(finite, np.max(magnitude, axis=1, initial=np.float32(0)), np.float32(0))
    q, scale = _symmetric(np.where(finite[:, None], a, np.float32(0)), amax.astype(np.float32), axis=1)
    return q, np.where(finite, scale, np.float32(np.nan)).astype(np.float32)


def reference(a: np.ndarray, weight: Int8Weight, bias: np.ndarray | None = None,
              activation: str = "none") -> np.ndarray:
    """DietcodeFusedMatMulInt8 on a[M, K] in numpy: int32 sums exact, the scaling and bias in
    float32 in the op's order, the activation by the fused ops' reference (TF)."""
    q, row_scale = quantize_rows(np.asarray(a, np.float32))
    sums = q.astype(np.int64) @ weight.quantized().astype(np.int64)
    assert np.all(np.abs(sums) < 2**31), "int32 sums overflow"
    with np.errstate(invalid="ignore"):
        out = sums.astype(np.float32) * row_scale[:, None] * weight.scale[None, :]
        if bias is not None:
            out = out + np.asarray(bias, np.float32)
    out = np.array(tf_reference.ACTIVATIONS[activation](out), np.float32)
    out[~np.isfinite(row_scale)] = np.nan
    return out
