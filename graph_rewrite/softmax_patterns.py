"""Softmax as our op: TF's Softmax node (float32, over the last axis) becomes one
DietcodeSoftmax.

Why: with oneDNN on, TF runs Softmax as _MklSoftmax, 45-70 us a call even for
BERT-base's [1, 12, 1, 1] at batch 1, where DietcodeSoftmax takes 3-10 us
(ops/softmax.cc; measured in docs/decisions.md).
"""

import dataclasses

import tensorflow as tf

from tf_dietcode.graph_rewrite.graph_index import GraphIndex, tensor_name

FORM = "softmax"


@dataclasses.dataclass(frozen=True)
class SoftmaxMatch:
    x: str
    output: str
    form: str = FORM


def find(index: GraphIndex) -> list[SoftmaxMatch]:
    return [SoftmaxMatch(tensor_name(node.input[0]), f"{node.name}:0") for node in index.nodes.values()
            if node.op == "Softmax" and node.attr["T"].type == tf.float32.as_datatype_enum]
