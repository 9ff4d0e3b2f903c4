"""Softmax as our op: TF's Softmax and LogSoftmax nodes (float32, over the last
axis) become one DietcodeSoftmax each (log=True for LogSoftmax).

Why: with oneDNN on, TF runs Softmax as _MklSoftmax, 45-70 us a call even for
BERT-base's [1, 12, 1, 1] at batch 1, where DietcodeSoftmax takes 3-10 us
(ops/softmax_kernel.cc; measured in docs/decisions.md). TF's LogSoftmax took
350 us a call on a beam search's [32, 8000] log probabilities.

softmax(x + c) = softmax(x) for a scalar c (log softmax too): a fixed scalar
added to the logits and read only by the Softmax is dropped (Hugging Face's TF models add 1e-9
before every softmax, transformers' stable_softmax; one elementwise pass over
the attention scores per layer).

Masked logits, SelectV2(mask, x, c) for a fixed scalar c read only by the
Softmax, go into the op as its mask (Keras' attention and Softmax layers mask
their scores so): the op gathers each row as it computes it, without the
SelectV2's pass. Keras builds that mask as LogicalAnd(ones_like(x), m) in every
layer; the op reads m instead, which broadcasts with x to the same shape.
"""

import dataclasses
import functools

import numpy as np
import tensorflow as tf

from tf_dietcode import ops
from tf_dietcode.graph_rewrite.analysis.graph_index import GraphIndex, tensor_name
from tf_dietcode.graph_rewrite.analysis.symbolic_shapes import SymbolicShapes
from tf_dietcode.graph_rewrite.fusions.contract import Binding, Found, Fusion, Replacement, Switches
from tf_dietcode.graph_rewrite.splice import scratch_graph

FORMS = {"Softmax": "softmax", "LogSoftmax": "log softmax"}  # by the TF op
SHIFTED = " (of logits + a scalar)"
MASKED = "masked "
FORM, SHIFTED_FORM, MASKED_FORM = FORMS["Softmax"], FORMS["Softmax"] + SHIFTED, MASKED + FORMS["Softmax"]


@dataclasses.dataclass(frozen=True)
class SoftmaxMatch:
    x: str
    output: str
    log: bool = False
    shifted: bool = False
    mask: str | None = None  # softmax of where(mask, x, fill)
    fill: float = 0.0

    @property
    def form(self) -> str:
        return ((MASKED if self.mask else "") + FORMS["LogSoftmax" if self.log else "Softmax"]
                + (SHIFTED if self.shifted else ""))


def find(index: GraphIndex) -> list[SoftmaxMatch]:
    return [_masked(index, node) or _unshifted(index, node) for node in index.nodes.values()
            if node.op in FORMS and node.attr["T"].type == tf.float32.as_datatype_enum]


def _masked(index: GraphIndex, softmax) -> SoftmaxMatch | None:
    """The match of a Softmax node whose input is SelectV2(mask, x, c), c a fixed scalar, the
    SelectV2 read only by the Softmax; None otherwise."""
    logits = tensor_name(softmax.input[0])
    select = index.producer(logits)
    if select.op != "SelectV2" or index.sole_consumer(logits) is not softmax:
        return None
    mask, x, fill = (tensor_name(i) for i in select.input)
    value = index.value(fill)
    if value is None or np.size(value) != 1 or np.ndim(value) > 0 or index.value(x) is not None:
        return None
    return SoftmaxMatch(x, f"{softmax.name}:0", softmax.op == "LogSoftmax", mask=_without_ones(index, mask, x),
                        fill=float(value))


def _without_ones(index: GraphIndex, mask: str, x: str) -> str:
    """m where mask is LogicalAnd(Fill(Shape(x), true), m) (or the operands swapped): both broadcast
    with x to x's shape broadcast with m's, so the Fill changes nothing the op computes."""
    node = index.producer(mask)
    if node.op != "LogicalAnd":
        return mask
    operands = [tensor_name(i) for i in node.input]
    for ones, other in (operands, operands[::-1]):
        fill = index.producer(ones)
        value = index.value(tensor_name(fill.input[1])) if fill.op == "Fill" else None
        if value is not None and bool(np.all(value)):
            shape = index.producer(tensor_name(fill.input[0]))
            if shape.op == "Shape" and tensor_name(shape.input[0]) == x:
                return other
    return mask


def _unshifted(index: GraphIndex, softmax) -> SoftmaxMatch:
    """The match of a Softmax node: reading x where its input is x + c (c a fixed finite scalar that
    does not broadcast x to a higher rank, the sum read only by the Softmax), else its input."""
    logits, output, log = tensor_name(softmax.input[0]), f"{softmax.name}:0", softmax.op == "LogSoftmax"
    shift = index.producer(logits)
    if shift.op not in ("Add", "AddV2") or index.sole_consumer(logits) is not softmax:
        return SoftmaxMatch(logits, output, log)
    operands = [tensor_name(i) for i in shift.input]
    for x, c in (operands, operands[::-1]):
        value, shape = index.value(c), index.shape(x)
        if (value is not None and np.size(value) == 1 and np.isfinite(value).all() and index.value(x) is None
                and shape is not None and np.ndim(value) <= len(shape)):
            return SoftmaxMatch(x, output, log, shifted=True)
    return SoftmaxMatch(logits, output, log)


class Softmax(Fusion):
    name = "softmax"

    def find(self, index: GraphIndex, shapes: SymbolicShapes, switches: Switches) -> Found:
        return Found(find(index))

    def forms(self, match: SoftmaxMatch) -> tuple[str, ...]:
        return (match.form,)

    def replacement(self, match: SoftmaxMatch, binding: Binding) -> Replacement:
        bound = {"x": match.x} if match.mask is None else {"x": match.x, "mask": match.mask}
        return Replacement(_replacement_graph(match.log, match.mask is not None, match.fill), bound, [match.output])


@functools.cache
def _replacement_graph(log: bool, masked: bool, fill: float) -> tf.compat.v1.GraphDef:
    """One DietcodeSoftmax; placeholder x, and mask where masked. The same for every Softmax (or
    LogSoftmax) node of a kind."""
    def build():
        mask = tf.compat.v1.placeholder(tf.bool, name="mask") if masked else None
        return ops.softmax(tf.compat.v1.placeholder(tf.float32, name="x"), log=log, mask=mask, fill=fill,
                           name="out_0")
    return scratch_graph(build)
