"""Activations TF emits as several ops, recognised by expression shape
(graph_rewrite.analysis.expression_patterns), X standing for the activation's input.
A match needs every node inside the tree to be read only by the tree, and X to
be read only by it too, since the fused op replaces them all.

Activations:
  gelu, gelu_tanh   tf.nn.gelu and Keras' gelu (exact and tanh forms)
  silu              x * sigmoid(x), tf.nn.silu, Keras' silu / swish
"""

import math

from tf_dietcode.graph_rewrite.analysis.expression_patterns import Capture, matches, read_only_inside
from tf_dietcode.graph_rewrite.analysis.graph_index import GraphIndex

X = Capture("x")

# 0.5 x erfc(-x / sqrt 2): Keras' and tf.nn.gelu's exact form.
GELU_EXACT = ("Mul", ("Mul", 0.5, X), ("Erfc", ("Mul", ("Neg", X), 1 / math.sqrt(2))))
# 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))): tf.nn.gelu(approximate=True).
GELU_TANH = ("Mul", ("Mul", 0.5, X),
             ("AddV2", 1.0, ("Tanh", ("Mul", math.sqrt(2 / math.pi), ("AddV2", X, ("Mul", 0.044715, ("Pow", X, 3.0)))))))
# x sigmoid(x): written by hand; tf.nn.silu (Keras' silu and swish) multiplies x by its beta, 1.0, and
# as a tf.custom_gradient returns the product through an IdentityN that also carries x and beta.
SILU = ("Mul", X, ("Sigmoid", X))
SILU_BETA = ("Mul", X, ("Sigmoid", ("Mul", 1.0, X)))
SILU_CUSTOM_GRADIENT = ("IdentityN", SILU_BETA, X, 1.0)
PATTERNS = [("gelu", GELU_EXACT), ("gelu_tanh", GELU_TANH),  # (the op's activation, a form of it)
            ("silu", SILU), ("silu", SILU_BETA), ("silu", SILU_CUSTOM_GRADIENT)]
_DEPTH = 7  # the deepest pattern's height


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
        for name, pattern in PATTERNS:
            nodes: set = set()
            output = f"{root.name}:0"
            if matches(index, output, pattern, {X.name: x}, nodes) and read_only_inside(index, nodes, root.name,
                                                                                         also=(x,)):
                return name, output
    return None
