"""Dense layers (dense_patterns, with their activations) as fused matmul ops.

Each layer, or each group of layers horizontal fusion merged (horizontal_fusion:
a lone layer is a group of one), is one op over its weights converted for the
precision it runs in (tf_dietcode.precision): in float32, DietcodeFusedMatMul
over the weights packed in the layout its tuned kernels read, with one
workload: M rows (x's leading dims), the group's N and K; in a reduced
precision, that precision's op over the weights converted to it.
"""

import math

import numpy as np
import tensorflow as tf

from tf_dietcode.graph_rewrite.analysis import shape_ranges
from tf_dietcode.graph_rewrite.analysis.graph_index import GraphIndex
from tf_dietcode.graph_rewrite.analysis.symbolic_shapes import SymbolicShapes
from tf_dietcode.graph_rewrite.fusions import dense_patterns, horizontal_fusion
from tf_dietcode.graph_rewrite.fusions.contract import Binding, Found, Replacement, Switches, TunedFusion
from tf_dietcode.graph_rewrite.fusions.dense_patterns import DenseMatch
from tf_dietcode.graph_rewrite.fusions.horizontal_fusion import DenseGroup
from tf_dietcode.graph_rewrite.splice import scratch_graph
from tf_dietcode.op_contract import LOW_PRECISION_BLOCK_COLUMNS
from tf_dietcode.precision.contract import Precision
from tf_dietcode.tuning import hardware
from tf_dietcode.tuning.workload import Workload


class Dense(TunedFusion):
    name = "dense"
    ops_in_bodies = frozenset(dense_patterns.CORES)

    def find(self, index: GraphIndex, shapes: SymbolicShapes, switches: Switches) -> Found:
        matches, left_alone = dense_patterns.find(index)
        groups = horizontal_fusion.group(matches, switches.horizontal_fusion, hardware.detect().vector_lanes)
        return Found(groups, left_alone)

    def forms(self, group: DenseGroup) -> tuple[str, ...]:
        return tuple(m.form for m in group.members)

    def label(self, form: str) -> str:
        return f"dense ({form})"

    def kept_float32(self, group: DenseGroup) -> str | None:
        if group.groups == 1 or (group.n // group.groups) % LOW_PRECISION_BLOCK_COLUMNS == 0:
            return None
        return (f"horizontal fusion merged it with {group.groups - 1} other layer(s) into one GEMM of "
                f"{group.n // group.groups}-column layers; the int8 and bfloat16 ops merge only layers of "
                f"whole {LOW_PRECISION_BLOCK_COLUMNS}-column blocks")

    def summary(self, merged: tuple[int, int], switches: Switches) -> list[str]:
        if not switches.horizontal_fusion:
            return ["horizontal fusion: off (the default; horizontal_fusion=True or --horizontal_fusion merges "
                    "dense layers that read the same input)"]
        return ["horizontal fusion: {} GEMMs sharing an input merged into {}".format(*merged)]

    def weight_bytes(self, group: DenseGroup) -> int:
        return group.weight.nbytes

    def operands(self, group: DenseGroup) -> dict[str, str]:
        return {"x": group.x}

    def sized_by_graph(self, group: DenseGroup, shapes: SymbolicShapes,
                       cold_weight: bool) -> tuple[Workload, str] | None:
        x = shapes.shape(group.x)
        rows = None if x is None or None in x else shapes.canonical(math.prod(x) / group.k)
        if shapes.range_of(rows) is None:
            return None
        return _workload(group, shapes.range_of(rows), cold_weight), f"M = {rows}"

    def sized_at_corners(self, group: DenseGroup, observed: dict[str, list[list[int]]],
                         cold_weight: bool) -> tuple[Workload, bool]:
        rows = shape_ranges.row_range(observed["x"], group.k)
        return _workload(group, rows, cold_weight), rows[0] == rows[1]

    def replacement(self, group: DenseGroup, binding: Binding) -> Replacement:
        """The group's op over its weight converted for its precision (in float32: in the layout of
        its kernels, read in place or packed)."""
        precision = binding.precision(group)
        weights = precision.convert(group.weight, binding.kernels(group).get("weight_layout"))
        members = {f"{name}_{j}": tensor for j, m in enumerate(group.members)
                   for name, tensor in (("bias", m.bias), ("out_shape", m.out_shape))}
        bound = {"x": group.x, "bundle": binding.bundle, **members,
                 **{f"weight_{name}": binding.variable(value) for name, value in weights.items()}}
        return Replacement(_replacement_graph(group, precision, weights), bound, [m.output for m in group.members])


def _workload(group: DenseGroup, rows: tuple[int, int], cold_weight: bool) -> Workload:
    return Workload("dense", (max(rows[0], 1), max(rows[1], 1)), group.n, group.k,
                    bias=group.has_bias, activation=group.activation, cold_weight=cold_weight, groups=group.groups,
                    weight_layout="packed" if group.groups > 1 else "any")


def _bias_vector(member: DenseMatch, i: int) -> tf.Tensor:
    """Member i's bias as the op reads it, [N] (zeros where it has none); placeholder bias_<i>."""
    if member.bias is None:
        return tf.zeros([member.n])
    bias = tf.compat.v1.placeholder(tf.float32, member.bias_shape, f"bias_{i}")
    return bias if len(member.bias_shape) == 1 else tf.reshape(bias, [-1])


def _read(name: str, value: np.ndarray) -> tf.Tensor:
    """The value of the variable bound to placeholder weight_<name>, with `value`'s dtype and shape."""
    handle = tf.compat.v1.placeholder(tf.resource, name=f"weight_{name}")
    tensor = tf.raw_ops.ReadVariableOp(resource=handle, dtype=tf.as_dtype(value.dtype))
    tensor.set_shape(value.shape)
    return tensor


def _replacement_graph(group: DenseGroup, precision: Precision,
                       weights: dict[str, np.ndarray]) -> tf.compat.v1.GraphDef:
    """act(x @ W + b) over x's trailing dims for a group of layers, W their weights side by side as
    `precision` converted them (`weights`, read from variables), written group-major and unstacked
    (no copy) into each member's output "out_<i>". Placeholders x, weight_<name> (one per array of
    `weights`), bias_<i>, out_shape_<i> and bundle."""
    def build():
        x = tf.compat.v1.placeholder(tf.float32, name="x")
        converted = {name: _read(name, value) for name, value in weights.items()}
        bias = None
        if group.has_bias:  # the members' biases as vectors side by side, zeros for those without
            biases = [_bias_vector(member, i) for i, member in enumerate(group.members)]
            bias = biases[0] if len(biases) == 1 else tf.concat(biases, 0)
        bundle = tf.compat.v1.placeholder(tf.string, [], name="bundle")
        first = group.members[0]
        whole = len(group.members) == 1 and first.out_shape is None  # the op's output is the layer's
        operand, num_k_dims = (x, group.contracted) if group.shares_x else (tf.reshape(x, [-1, group.k]), 1)
        product = precision.product(operand, converted, bias, n=group.n, activation=group.activation,
                                    num_k_dims=num_k_dims, n_dims=first.out_dims if whole else (),
                                    groups=group.groups, bundle=bundle, name="out_0" if whole else None)
        if whole:
            return
        pieces = tf.unstack(product, num=group.groups, axis=0) if group.groups > 1 else [product]
        for i, (member, piece) in enumerate(zip(group.members, pieces)):
            if member.out_shape is not None:
                shape = tf.compat.v1.placeholder(tf.int32, name=f"out_shape_{i}")
            elif len(member.out_dims) > 1:
                shape = tf.concat([tf.shape(piece)[:-1], tf.constant(member.out_dims, tf.int32)], 0)
            else:
                tf.identity(piece, name=f"out_{i}")
                continue
            tf.reshape(piece, shape, name=f"out_{i}")
    return scratch_graph(build)
