"""float32, the default: DietcodeFusedMatMul on the DietCode-tuned kernels of the model's bundle.

The weight is stored in the layout its tuned kernels read (pre-packed or in
place, tuning.templates.dense); a layer with no tuned kernels reads it in place.
"""

from collections.abc import Sequence

import numpy as np
import tensorflow as tf

from tf_dietcode import ops, output_check
from tf_dietcode.precision.contract import Precision
from tf_dietcode.tuning.templates import dense as dense_template

IN_PLACE = {"packed": False}  # the layout of a layer whose kernels were not tuned


class Float32(Precision):
    name = "float32"
    max_error = output_check.BOUND
    tuned = True

    def convert(self, weight: np.ndarray, layout: dict | None) -> dict[str, np.ndarray]:
        value, _ = dense_template.weight_operand(weight.T, layout or IN_PLACE)
        return {"packed": value}

    def product(self, x: tf.Tensor, weights: dict[str, tf.Tensor], bias: tf.Tensor | None, *, n: int,
                activation: str, num_k_dims: int = 1, n_dims: Sequence[int] = (), groups: int = 1,
                bundle: tf.Tensor | str = "", name: str | None = None) -> tf.Tensor:
        packed = weights["packed"]
        return ops.fused_matmul(x, packed, bias, activation=activation, packed_n=n if packed.shape.rank == 3 else 0,
                                num_k_dims=num_k_dims, n_dims=n_dims, groups=groups, bundle=bundle, name=name)

    def kernel_path(self) -> str:
        return "DietCode-tuned kernels of the model's bundle"
