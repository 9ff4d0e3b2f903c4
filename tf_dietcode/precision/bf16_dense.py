"""bfloat16: DietcodeFusedMatMulBf16 on weights rounded to bfloat16 (bf16_weights).

The op rounds activations to bfloat16 and accumulates in float32; its kernels
are chosen by the op from the CPU's instruction sets (ops.low_precision_isa),
not tuned.
"""

from collections.abc import Sequence

import numpy as np
import tensorflow as tf

from tf_dietcode import ops
from tf_dietcode.precision import bf16_weights
from tf_dietcode.precision.contract import Precision


NATIVE_KERNELS = ("amx_bf16", "avx512_bf16")  # ops/bf16_tiles.cc's paths with bfloat16 dot products


class Bfloat16(Precision):
    name = "bfloat16"
    max_error = 2e-2  # a cosine of 0.9998 for unit-norm rows: docs/decisions.md, "Precision"
    tuned = False

    def convert(self, weight: np.ndarray, layout: dict | None) -> dict[str, np.ndarray]:
        return {"packed": bf16_weights.pack(weight)}

    def product(self, x: tf.Tensor, weights: dict[str, tf.Tensor], bias: tf.Tensor | None, *, n: int,
                activation: str, num_k_dims: int = 1, n_dims: Sequence[int] = (), groups: int = 1,
                bundle: tf.Tensor | str = "", name: str | None = None) -> tf.Tensor:
        return ops.fused_matmul_bf16(x, weights["packed"], bias, n=n, activation=activation,
                                     num_k_dims=num_k_dims, n_dims=n_dims, groups=groups, name=name)

    def kernel_path(self) -> str:
        return ops.low_precision_isa()["bfloat16"]

    def native(self) -> bool:
        """Whether this CPU multiplies bfloat16 in hardware (the other path widens it to float32)."""
        return self.kernel_path() in NATIVE_KERNELS
