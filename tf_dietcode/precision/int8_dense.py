"""int8: DietcodeFusedMatMulInt8 on weights quantized per output column (int8_weights).

The op quantizes each row of activations symmetrically, accumulates in int32
and scales back in the epilogue, with the bias and activation; its kernels are
chosen by the op from the CPU's instruction sets (ops.low_precision_isa), not
tuned.
"""

from collections.abc import Sequence

import numpy as np
import tensorflow as tf

from tf_dietcode import ops
from tf_dietcode.precision import int8_weights
from tf_dietcode.precision.bf16_dense import Bfloat16
from tf_dietcode.precision.contract import Precision


class Int8(Precision):
    name = "int8"
    max_error = 0.1  # a cosine of 0.995 for unit-norm rows: docs/decisions.md, "Precision"
    tuned = False

    def convert(self, weight: np.ndarray, layout: dict | None) -> dict[str, np.ndarray]:
        quantized = int8_weights.quantize(weight)
        return {"packed": quantized.packed, "scale": quantized.scale, "column_sums": quantized.column_sums}

    def product(self, x: tf.Tensor, weights: dict[str, tf.Tensor], bias: tf.Tensor | None, *, n: int,
                activation: str, num_k_dims: int = 1, n_dims: Sequence[int] = (), groups: int = 1,
                bundle: tf.Tensor | str = "", name: str | None = None) -> tf.Tensor:
        return ops.fused_matmul_int8(x, weights["packed"], weights["scale"], weights["column_sums"], bias, n=n,
                                     activation=activation, num_k_dims=num_k_dims, n_dims=n_dims, groups=groups,
                                     name=name)

    def kernel_path(self) -> str:
        return ops.low_precision_isa()["int8"]

    def put_back_in(self) -> tuple[str, ...]:
        # bfloat16 first where it is native: MiniLM's 6 layers the gate puts back, in bfloat16 instead of
        # float32, met the same accuracy and ran 1.0-1.2x faster at batch 1 (docs/decisions.md, "Precision")
        return ("bfloat16", "float32") if Bfloat16().native() else ("float32",)
