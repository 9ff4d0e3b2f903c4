"""Activations TF emits as several ops, recognised by expression shape.

A pattern is a tree: (op, operand, ...) with X for the activation's input and
floats for scalar constants; Mul and AddV2 match in either operand order. A
match needs every node inside the tree to be read only by the tree, and X to
be read only by it too, since the fused op replaces them all.
"""

import math

import numpy as np

from tf_dietcode.graph_rewrite.graph_index import GraphIndex, tensor_name

X = "X"
COMMUTATIVE = {"Mul", "AddV2"}
SAME_OP = {"AddV2": {"AddV2", "Add"}}

# 0.5 x erfc(-x / sqrt 2): Keras' and tf.nn.gelu's exact form.
GELU_EXACT = ("Mul", ("Mul", 0.5, X), ("Erfc", ("Mul", ("Neg", X), 1 / math.sqrt(2))))
# 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))): tf.nn.gelu(approximate=True).
GELU_TANH = ("Mul", ("Mul", 0.5, X),
             ("AddV2", 1.0, ("Tanh", ("Mul", math.sqrt(2 / math.pi), ("AddV2", X, ("Mul", 0.044715, ("Pow", X, 3.0)))))))
PATTERNS = {"gelu": GELU_EXACT, "gelu_tanh": GELU_TANH}
_DEPTH = 7  # the deepest pattern's height


def _matches(index: GraphIndex, tensor: str, pattern, x: str, nodes: set) -> bool:
    if pattern == X:
        return tensor == x
    if isinstance(pattern, float):
        value = index.value(tensor)
        return value is not None and np.size(value) == 1 and np.isclose(float(value), pattern, rtol=1e-6)
    node = index.producer(tensor)
    op, *operands = pattern
    if node.op not in SAME_OP.get(op, {op}):
        return False
    inputs = [tensor_name(i) for i in node.input if not i.startswith("^")]
    if len(inputs) != len(operands):
        return False
    orders = [inputs, inputs[::-1]] if op in COMMUTATIVE else [inputs]
    for order in orders:
        found: set = set()
        if all(_matches(index, t, p, x, found) for t, p in zip(order, operands)):
            nodes |= found | {node.name}
            return True
    return False


def _downstream(index: GraphIndex, x: str) -> list:
    """Nodes reachable from x within the patterns' depth, nearest first."""
    seen, frontier = [], [x]
    for _ in range(_DEPTH):
        frontier = [name for t in frontier for name in index.consumers.get(t, []) if name not in seen]
        seen += frontier
        frontier = [f"{name}:0" for name in frontier]
    return [index.nodes[name] for name in dict.fromkeys(seen)]


def match(index: GraphIndex, x: str) -> tuple[str, str] | None:
    """(activation name, output tensor) of a multi-op activation applied to x, or None."""
    for root in _downstream(index, x):
        for name, pattern in PATTERNS.items():
            nodes: set = set()
            output = f"{root.name}:0"
            if not _matches(index, output, pattern, x, nodes):
                continue
            readers = {reader for t in [x, *(f"{n}:0" for n in nodes - {root.name})]
                       for reader in index.consumers.get(t, [])}
            if readers <= nodes:
                return name, output
    return None
