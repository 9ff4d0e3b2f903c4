"""Layer normalization as TF runs it: a dozen ops over the last axis.

Keras 3's LayerNormalization (TF backend) and tf.nn.batch_normalization over
tf.nn.moments both compute

    inv = rsqrt(mean((x - mean(x))^2) + epsilon) * gamma
    y = x * inv + (beta - mean(x) * inv)

Keras writes the second term as -mean * inv + beta, tf.nn as beta - mean *
inv; tf.nn.moments stops the mean's gradient, a hand-written one may not.
Each form is matched as an expression tree (graph_rewrite.analysis.expression_patterns)
and replaced by one DietcodeLayerNorm when the reduction is over the last
axis with kept dims, epsilon is a scalar constant and gamma and beta vary
along the last axis only (read at run time: they stay variables). Where x is
an add that only the layer norm reads (a Transformer's `x + sublayer(x)`),
the op takes the add's operands and sums them itself, broadcast as AddV2
does, so the sum is never written out and read back.
"""

import dataclasses
import itertools
from collections.abc import Callable

import numpy as np
import tensorflow as tf

from tf_dietcode import ops
from tf_dietcode.graph_rewrite.analysis.expression_patterns import SAME_OP, Capture, matches, read_only_inside
from tf_dietcode.graph_rewrite.analysis.graph_index import GraphIndex, tensor_name
from tf_dietcode.graph_rewrite.analysis.symbolic_shapes import SymbolicShapes
from tf_dietcode.graph_rewrite.fusions.contract import Binding, Found, Fusion, Replacement, Switches
from tf_dietcode.graph_rewrite.splice import scratch_graph

FORM = "layer norm"
X, GAMMA, BETA, EPSILON = Capture("x"), Capture("gamma"), Capture("beta"), Capture("epsilon")
AXES = (Capture("mean_axes"), Capture("variance_axes"))


def _tree(keras_offset: bool, stop_gradient: bool) -> tuple:
    mean = ("Mean", X, AXES[0])
    centred_mean = ("StopGradient", mean) if stop_gradient else mean
    variance = ("Mean", ("SquaredDifference", X, centred_mean), AXES[1])
    inv = ("Mul", ("Rsqrt", ("AddV2", variance, EPSILON)), GAMMA)
    offset = ("AddV2", ("Mul", ("Neg", mean), inv), BETA) if keras_offset else ("Sub", BETA, ("Mul", mean, inv))
    return "AddV2", ("Mul", X, inv), offset


PATTERNS = [_tree(*flags) for flags in itertools.product((True, False), repeat=2)]


@dataclasses.dataclass(frozen=True)
class LayerNormMatch:
    x: str
    gamma: str        # shaped [1, ..., 1, depth] (Keras reshapes its [depth] variable)
    beta: str
    epsilon: float
    output: str
    residual: str | None = None  # added to x first (x is then the add's other operand)
    form: str = FORM


def find(index: GraphIndex, shape_of: Callable[[str], tuple | None]) -> list[LayerNormMatch]:
    """Every layer norm in the graph whose intermediate results nothing else reads; shape_of
    gives a tensor's dims (ints, symbolic dims or None; None where even the rank is unknown)."""
    found = []
    for node in index.nodes.values():
        if node.op in SAME_OP["AddV2"]:  # every tree's root
            match = _match(index, shape_of, f"{node.name}:0")
            if match is not None:
                found.append(match)
    return found


def _match(index: GraphIndex, shape_of, output: str) -> LayerNormMatch | None:
    for pattern in PATTERNS:
        captured, nodes = {}, set()
        if not matches(index, output, pattern, captured, nodes):
            continue
        epsilon = _last_axis_epsilon(index, shape_of, captured, nodes)
        if epsilon is not None and read_only_inside(index, nodes, index.producer(output).name):
            x, residual = _residual_add(index, captured[X.name], nodes)
            return LayerNormMatch(x, captured[GAMMA.name], captured[BETA.name], epsilon, output, residual)
    return None


def _residual_add(index: GraphIndex, x: str, nodes: set) -> tuple[str, str | None]:
    """x's producer's operands (x, residual) where it is an add, with no control inputs,
    whose sum only the layer norm's nodes read; else (x, None)."""
    add = index.producer(x)
    if add.op not in SAME_OP["AddV2"] or any(i.startswith("^") for i in add.input):
        return x, None
    if any(reader not in nodes for reader in index.consumers.get(x, [])):
        return x, None
    return tensor_name(add.input[0]), tensor_name(add.input[1])


def _last_axis_epsilon(index: GraphIndex, shape_of, captured: dict[str, str], nodes: set) -> float | None:
    """Epsilon where the means reduce x's last axis only and keep it, epsilon is a scalar constant,
    and gamma and beta are [1, ..., 1, depth], depth being x's last dim (so the output is x's
    shape); else None."""
    shape = shape_of(captured[X.name])
    if not shape:
        return None
    rank, depth = len(shape), shape[-1]
    epsilon = index.scalar(captured[EPSILON.name])
    if epsilon is None:
        return None
    for axes in AXES:
        axis = index.scalar(captured[axes.name])
        if axis is None or int(axis) % rank != rank - 1:
            return None
    if not all(index.nodes[n].attr["keep_dims"].b for n in nodes if index.nodes[n].op == "Mean"):
        return None
    for vector in (GAMMA, BETA):
        vector_shape = _known_shape(index, captured[vector.name])
        if (not vector_shape or len(vector_shape) > rank or vector_shape[-1] != depth
                or any(d != 1 for d in vector_shape[:-1])):
            return None
    return epsilon


def _known_shape(index: GraphIndex, tensor: str) -> list[int] | None:
    """The tensor's static shape, or, where TF's shape inference cannot see it, the shape of the
    fixed value it holds at optimize time. (Variable reads have shapes in the index's
    graph, so no tested model needs the second.)"""
    shape = index.shape(tensor)
    if shape is not None and None not in shape:
        return shape
    value = index.value(tensor)
    return None if value is None else list(np.shape(value))


class LayerNorm(Fusion):
    """Layer norms as DietcodeLayerNorm (no tuned kernels); off with layer_norm_fusion=False."""
    name = "layer_norm"

    def find(self, index: GraphIndex, shapes: SymbolicShapes, switches: Switches) -> Found:
        return Found(find(index, shapes.shape) if switches.layer_norm_fusion else [])

    def forms(self, match: LayerNormMatch) -> tuple[str, ...]:
        return (match.form,)

    def replacement(self, match: LayerNormMatch, binding: Binding) -> Replacement:
        bound = {"x": match.x, "gamma": match.gamma, "beta": match.beta, "residual": match.residual}
        return Replacement(_replacement_graph(match), bound, [match.output])


def _replacement_graph(match: LayerNormMatch) -> tf.compat.v1.GraphDef:
    """One DietcodeLayerNorm over x's last axis; placeholders x, gamma and beta (the graph's
    [1, ..., 1, depth] tensors, read as [depth]), and residual where the match has one."""
    def build():
        x, gamma, beta = (tf.compat.v1.placeholder(tf.float32, name=name) for name in ("x", "gamma", "beta"))
        residual = tf.compat.v1.placeholder(tf.float32, name="residual") if match.residual else None
        ops.layer_norm(x, tf.reshape(gamma, [-1]), tf.reshape(beta, [-1]), residual=residual,
                       epsilon=match.epsilon, name="out_0")
    return scratch_graph(build)
