"""Lookups over one GraphDef: producers, consumers, static shapes and values.

The GraphDef is also imported into a tf.Graph once, so TF's own shape
inference and constant evaluation (tensor_util.constant_value) answer the
static questions matching asks.
"""

import collections

import numpy as np
import tensorflow as tf
from tensorflow.python.framework import tensor_util


def _matmul(node, a, b):
    return np.matmul(a.T if node.attr["transpose_a"].b else a, b.T if node.attr["transpose_b"].b else b)


# Ops value() computes in numpy from fixed operands: (node, operand values) -> value. Weights are
# rearranged (stored [N, K] and transposed, or [1, K, N] and reshaped, as PyTorch-style layers and
# GPT-2's conv1d keep theirs) or computed from other weights (Keras' LoRA: W + (A @ B) * scale).
FOLDS = {
    "Reshape": lambda node, value, shape: np.reshape(value, shape),
    "Transpose": lambda node, value, perm: np.transpose(value, perm),
    "ExpandDims": lambda node, value, axis: np.expand_dims(value, int(axis)),
    "Squeeze": lambda node, value: np.squeeze(value, axis=tuple(node.attr["squeeze_dims"].list.i) or None),
    "AddV2": lambda node, a, b: np.add(a, b),
    "Sub": lambda node, a, b: np.subtract(a, b),
    "Mul": lambda node, a, b: np.multiply(a, b),
    "MatMul": _matmul,
}
# Ops whose value follows from their input's static shape alone, not from its elements.
SHAPE_READERS = {"Shape", "Size", "Rank"}


def node_name(tensor: str) -> str:
    return tensor.lstrip("^").split(":")[0]


def ancestors(graph_def: tf.compat.v1.GraphDef, roots) -> set[str]:
    """The nodes `roots` name (tensors, nodes or control inputs) and every node they depend on,
    through data and control inputs: what runs to compute them."""
    inputs = {node.name: node.input for node in graph_def.node}
    found, pending = set(), [node_name(root) for root in roots]
    while pending:
        name = pending.pop()
        if name not in found and name in inputs:
            found.add(name)
            pending += [node_name(t) for t in inputs[name]]
    return found


def tensor_name(tensor: str) -> str:
    """'x' -> 'x:0'; control inputs stay as they are."""
    return tensor if tensor.startswith("^") or ":" in tensor else f"{tensor}:0"


class GraphIndex:
    def __init__(self, graph_def: tf.compat.v1.GraphDef, captured_values: dict[str, np.ndarray]):
        """captured_values: placeholder name -> value of the variable it captures."""
        self.nodes = {n.name: n for n in graph_def.node}
        self.consumers: dict[str, list[str]] = collections.defaultdict(list)  # tensor -> consumer nodes
        for node in graph_def.node:
            for source in node.input:
                self.consumers[tensor_name(source)].append(node.name)
        self.captured_values = captured_values
        self.graph = tf.Graph()
        with self.graph.as_default():
            tf.graph_util.import_graph_def(self._variable_reads_shaped(graph_def), name="")
        self._computed = self._computed_nodes()
        self._folded: dict[str, np.ndarray | None] = {}

    def producer(self, tensor: str):
        return self.nodes[node_name(tensor)]

    def sole_consumer(self, tensor: str):
        """The one node that reads `tensor`, or None if zero or several do."""
        users = self.consumers.get(tensor_name(tensor), [])
        return self.nodes[users[0]] if len(users) == 1 else None

    def shape(self, tensor: str) -> list[int | None]:
        shape = self.graph.get_tensor_by_name(tensor_name(tensor)).shape
        return shape.as_list() if shape.rank is not None else None

    def value(self, tensor: str) -> np.ndarray | None:
        """The tensor's value if it is fixed at optimize time: a constant, a captured variable
        read (variables are read at their current value), or computed from those (FOLDS)."""
        node = self.producer(tensor)
        if node.op == "ReadVariableOp":
            return self.variable_value(node.input[0])
        if node.op == "Identity":
            return self.value(node.input[0])
        if node.op in FOLDS and tensor_name(tensor) == f"{node.name}:0":
            if node.name in self._computed:
                return None
            if node.name not in self._folded:
                operands = [self.value(i) for i in node.input if not i.startswith("^")]
                self._folded[node.name] = None if any(o is None for o in operands) else FOLDS[node.op](node, *operands)
            return self._folded[node.name]
        return tensor_util.constant_value(self.graph.get_tensor_by_name(tensor_name(tensor)))

    def scalar(self, tensor: str) -> float | None:
        """The tensor's fixed value where it holds one element (a [1] axis constant too), as a
        float; else None."""
        value = self.value(tensor)
        return None if value is None or np.size(value) != 1 else float(np.ravel(value)[0])

    def _computed_nodes(self) -> set[str]:
        """Nodes whose elements depend on the signature's inputs (placeholders that stand for no
        captured variable): value() answers None there without walking the graph up to them."""
        computed = set()
        for operation in self.graph.get_operations():  # in topological order
            node = self.nodes[operation.name]
            if node.op == "Placeholder" and node.name not in self.captured_values:
                computed.add(node.name)
            elif node.op not in SHAPE_READERS and any(node_name(i) in computed for i in node.input
                                                      if not i.startswith("^")):
                computed.add(node.name)
        return computed

    def _variable_reads_shaped(self, graph_def: tf.compat.v1.GraphDef) -> tf.compat.v1.GraphDef:
        """graph_def for TF's shape inference, each read of a captured variable a placeholder of
        its value's shape: a resource placeholder carries no shape, so anything a variable takes
        part in (a product scaled by a trainable scalar, say) lost even its rank."""
        shaped = tf.compat.v1.GraphDef()
        shaped.CopyFrom(graph_def)
        for node in shaped.node:
            value = self.variable_value(node.input[0]) if node.op == "ReadVariableOp" else None
            if value is not None:
                dtype = node.attr["dtype"].type
                node.op = "Placeholder"
                del node.input[:]
                node.attr.clear()
                node.attr["dtype"].type = dtype
                node.attr["shape"].shape.CopyFrom(tf.TensorShape(np.shape(value)).as_proto())
        return shaped

    def variable_value(self, handle: str) -> np.ndarray | None:
        """The current value of the captured variable a resource handle refers to."""
        node = self.producer(handle)
        while node.op == "Identity":  # inlined function arguments
            node = self.producer(node.input[0])
        return self.captured_values.get(node.name)
