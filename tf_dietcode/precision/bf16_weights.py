"""bfloat16 weights as DietcodeFusedMatMulBf16 reads them."""

import ml_dtypes
import numpy as np

from tf_dietcode.precision import packing

BFLOAT16 = np.dtype(ml_dtypes.bfloat16)


def pack(weight: np.ndarray) -> np.ndarray:
    """weight [K, N] float32 rounded to bfloat16 (to nearest even) and packed
    [ceil(N / 16), ceil(K / 2), 16, 2]."""
    weight = np.asarray(weight)
    if weight.ndim != 2 or weight.dtype != np.float32:
        raise ValueError(f"weight must be a float32 matrix [K, N], got {weight.dtype} {weight.shape}")
    return packing.pack(weight.astype(BFLOAT16))


def unpack(packed: np.ndarray, k: int, n: int) -> np.ndarray:
    """The [K, N] float32 weight (the bfloat16 values) a packed one holds."""
    return packing.unpack(packed, k, n).astype(np.float32)
