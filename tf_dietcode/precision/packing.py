"""The packed weight layout of the int8 and bfloat16 dense ops (ops/op_contract.json).

A weight [K, N] is stored as [ceil(N / 16), ceil(K / per_group), 16, per_group]:
blocks of 16 output columns, each block K in groups of 4 bytes (4 int8 or 2
bfloat16 values), zero padded, so one group row of a block is 64 bytes: one
AVX-512 register, one AMX tile row.
"""

import numpy as np

from tf_dietcode.op_contract import LOW_PRECISION_BLOCK_COLUMNS, LOW_PRECISION_GROUP_BYTES


def values_per_group(dtype: np.dtype) -> int:
    """How many values of `dtype` one K group holds (4 for int8, 2 for bfloat16)."""
    return LOW_PRECISION_GROUP_BYTES // np.dtype(dtype).itemsize


def packed_shape(k: int, n: int, dtype: np.dtype) -> tuple[int, int, int, int]:
    per_group = values_per_group(dtype)
    return (-(-n // LOW_PRECISION_BLOCK_COLUMNS), -(-k // per_group), LOW_PRECISION_BLOCK_COLUMNS, per_group)


def pack(weight: np.ndarray) -> np.ndarray:
    """weight [K, N] in the packed layout of its dtype: column j, row k at
    [j // 16, k // per_group, j % 16, k % per_group]."""
    if weight.ndim != 2:
        raise ValueError(f"weight must be a matrix [K, N], got shape {weight.shape}")
    k, n = weight.shape
    blocks, groups, columns, per_group = packed_shape(k, n, weight.dtype)
    padded = np.zeros((groups * per_group, blocks * columns), weight.dtype)
    padded[:k, :n] = weight
    return np.ascontiguousarray(padded.reshape(groups, per_group, blocks, columns).transpose(2, 0, 3, 1))


def unpack(packed: np.ndarray, k: int, n: int) -> np.ndarray:
    """The [K, N] weight a packed one holds (the inverse of pack)."""
    blocks, groups, columns, per_group = packed.shape
    return packed.transpose(1, 3, 0, 2).reshape(groups * per_group, blocks * columns)[:k, :n]
