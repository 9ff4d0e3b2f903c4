"""What a precision mode is, so that optimize(), DietDense and the accuracy gate treat them alike.

A mode says how a dense layer's weight [K, N] becomes, once at optimize time
(or when a DietDense layer is converted), the arrays its op reads, which the
output model stores as variables; how that op is called on them; the default
bound on the model's output error that the accuracy gate holds it to; and
which kernels it runs. Only dense layers change precision: attention
products, layer norms and softmax read no fixed weight to convert and keep
their float32 ops.

Adding a mode: a module with its Precision, and its line in modes.PRECISIONS.
"""

import abc
import dataclasses
from collections.abc import Sequence

import numpy as np
import tensorflow as tf


@dataclasses.dataclass(frozen=True)
class LayerPrecision:
    """The precision one fused layer runs in, and why where it is not the one asked for."""
    precision: str
    why: str = ""

    def describe(self, kernels: str = "") -> str:
        """As the report groups layers: the precision, its kernels where named, and why."""
        named = f"{self.precision} on {kernels} kernels" if kernels else self.precision
        return f"{named}: {self.why}" if self.why else named


class Precision(abc.ABC):
    name: str          # as optimize(precision=...) takes it
    max_error: float   # the accuracy gate's default bound on output_check.row_error
    tuned: bool        # its dense ops run the kernels tuned into the bundle (else the op picks its own)

    @abc.abstractmethod
    def convert(self, weight: np.ndarray, layout: dict | None) -> dict[str, np.ndarray]:
        """The arrays the op reads for a layer's float32 weight [K, N], by name; `layout` is the
        weight layout of the layer's tuned kernels (a bundle manifest's), None where none were tuned."""

    @abc.abstractmethod
    def product(self, x: tf.Tensor, weights: dict[str, tf.Tensor], bias: tf.Tensor | None, *, n: int,
                activation: str, num_k_dims: int = 1, n_dims: Sequence[int] = (), groups: int = 1,
                bundle: tf.Tensor | str = "", name: str | None = None) -> tf.Tensor:
        """activation(x @ W + bias) over x's last num_k_dims dims, W being `weights` as convert()
        made them (N columns, `groups` layers side by side), by the mode's op."""

    @abc.abstractmethod
    def kernel_path(self) -> str:
        """Which kernels its dense ops run on this machine, as the report names them."""

    def put_back_in(self) -> tuple[str, ...]:
        """The precisions the accuracy gate puts this mode's most sensitive layers back in, cheapest
        first (accuracy_gate.settle tries the next where the bound fails with every layer back in
        one); float32, whose tuned kernels round as TF does, is always last."""
        return ("float32",)
