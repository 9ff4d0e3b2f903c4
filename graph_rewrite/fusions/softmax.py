"""Softmax as our op: TF's Softmax node (float32, over the last axis) becomes one
DietcodeSoftmax.

Why: with oneDNN on, TF runs Softmax as _MklSoftmax, 45-70 us a call even for
BERT-base's [1, 12, 1, 1] at batch 1, where DietcodeSoftmax takes 3-10 us
(ops/softmax_kernel.cc; measured in docs/decisions.md).
"""

import dataclasses
import functools

import tensorflow as tf

from tf_dietcode import ops
from tf_dietcode.graph_rewrite.analysis.graph_index import GraphIndex, tensor_name
from tf_dietcode.graph_rewrite.analysis.symbolic_shapes import SymbolicShapes
from tf_dietcode.graph_rewrite.fusions.contract import Binding, Found, Fusion, Replacement, Switches
from tf_dietcode.graph_rewrite.splice import scratch_graph

FORM = "softmax"


@dataclasses.dataclass(frozen=True)
class SoftmaxMatch:
    x: str
    output: str
    form: str = FORM


def find(index: GraphIndex) -> list[SoftmaxMatch]:
    return [SoftmaxMatch(tensor_name(node.input[0]), f"{node.name}:0") for node in index.nodes.values()
            if node.op == "Softmax" and node.attr["T"].type == tf.float32.as_datatype_enum]


class Softmax(Fusion):
    name = "softmax"

    def find(self, index: GraphIndex, shapes: SymbolicShapes, switches: Switches) -> Found:
        return Found(find(index))

    def forms(self, match: SoftmaxMatch) -> tuple[str, ...]:
        return (match.form,)

    def replacement(self, match: SoftmaxMatch, binding: Binding) -> Replacement:
        return Replacement(_replacement_graph(), {"x": match.x}, [match.output])


@functools.cache
def _replacement_graph() -> tf.compat.v1.GraphDef:
    """One DietcodeSoftmax; placeholder x. The same for every Softmax node."""
    return scratch_graph(lambda: ops.softmax(tf.compat.v1.placeholder(tf.float32, name="x"), name="out_0"))
