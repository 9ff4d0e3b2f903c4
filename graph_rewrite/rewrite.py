"""Replaces matched patterns with Dietcode fused ops in a GraphDef.

Each replacement is written with TF's Python API in a scratch graph (so every
node is built and typed by TF itself), then spliced in: its placeholders are
bound to tensors of the graph it goes into, its other nodes renamed under a
unique prefix, and every reader of the pattern's output reads the
replacement's node "out" instead. Nodes nothing reads any more are pruned
when the graph becomes a function again.
"""

import tensorflow as tf

from tf_dietcode import ops
from tf_dietcode.graph_rewrite.attention_patterns import AttentionMatch
from tf_dietcode.graph_rewrite.dense_patterns import DenseMatch
from tf_dietcode.graph_rewrite.graph_index import node_name, tensor_name

BUNDLE_PLACEHOLDER = "dietcode/bundle"


def _scratch_graph(build) -> tf.compat.v1.GraphDef:
    graph = tf.Graph()
    with graph.as_default():
        build()
    return graph.as_graph_def()


def dense_replacement(match: DenseMatch, packed_n: int) -> tf.compat.v1.GraphDef:
    """act(x @ W + b) over x's trailing dims, with W pre-packed (packed_n = N) or as stored
    ([K, N], packed_n = 0); placeholders x, packed (W's variable), bias, bundle and out_shape."""
    def build():
        x = tf.compat.v1.placeholder(tf.float32, name="x")
        packed = tf.raw_ops.ReadVariableOp(resource=tf.compat.v1.placeholder(tf.resource, name="packed"),
                                           dtype=tf.float32)
        bias = tf.reshape(tf.compat.v1.placeholder(tf.float32, name="bias"), [-1]) if match.bias else None
        bundle = tf.compat.v1.placeholder(tf.string, [], name="bundle")
        flat = match.form != "einsum"  # x is [M, K] already
        product = ops.fused_matmul(x if flat else tf.reshape(x, [-1, match.k]), packed, bias,
                                   activation=match.activation, packed_n=packed_n, bundle=bundle,
                                   name="out" if match.out_shape is None and flat else None)
        if match.out_shape is not None:
            tf.reshape(product, tf.compat.v1.placeholder(tf.int32, name="out_shape"), name="out")
        elif not flat:
            leading = tf.shape(x)[: -match.contracted]
            tf.reshape(product, tf.concat([leading, tf.constant(match.out_dims, tf.int32)], 0), name="out")
    return _scratch_graph(build)


def _operand_layout(tensor: tf.Tensor, perm: list[int] | None) -> tuple[tf.Tensor, list[int] | None]:
    """The operand and the perm the op reads it through: in place where the perm keeps the last
    axis last, else transposed first (and read as is)."""
    if perm is None or perm[-1] == len(perm) - 1:
        return tensor, perm
    return tf.transpose(tensor, perm), None


def attention_replacement(match: AttentionMatch) -> tf.compat.v1.GraphDef:
    """alpha * op(x') @ op(y'), then + addend or transposed by perm, with x', y' the operands in
    matmul layout (read in place through x_perm/y_perm where the op can, else transposed first);
    placeholders x, y, addend and bundle."""
    def build():
        x = tf.compat.v1.placeholder(tf.float32, name="x")
        y = tf.compat.v1.placeholder(tf.float32, name="y")
        bundle = tf.compat.v1.placeholder(tf.string, [], name="bundle")
        x, x_perm = _operand_layout(x, match.x_perm)
        y, y_perm = _operand_layout(y, match.y_perm)
        options = {"adj_x": match.adj_x, "adj_y": match.adj_y, "alpha": match.alpha, "x_perm": x_perm,
                   "y_perm": y_perm, "bundle": bundle, "name": "out"}
        if match.addend is not None:
            ops.fused_batch_matmul_add(x, y, tf.compat.v1.placeholder(tf.float32, name="addend"), **options)
        else:
            ops.fused_batch_matmul_transpose(x, y, match.perm, **options)
    return _scratch_graph(build)


def add_placeholder(graph_def: tf.compat.v1.GraphDef, name: str, dtype: tf.DType) -> None:
    node = graph_def.node.add(name=name, op="Placeholder")
    node.attr["dtype"].type = dtype.as_datatype_enum


def add_string_constant(graph_def: tf.compat.v1.GraphDef, name: str, value: str) -> None:
    node = graph_def.node.add(name=name, op="Const")
    node.attr["dtype"].type = tf.string.as_datatype_enum
    node.attr["value"].tensor.CopyFrom(tf.make_tensor_proto(value))


def splice(graph_def: tf.compat.v1.GraphDef, replacement: tf.compat.v1.GraphDef, bound: dict[str, str | None],
           prefix: str, old_output: str, replaced: dict[str, str]) -> str:
    """Adds `replacement` (its placeholders bound to tensors by name) and rewires old_output's readers.

    `replaced` maps the outputs of patterns spliced before to their replacements
    (a bound tensor may be one) and gains this pattern's entry. Returns the new output.
    """
    bound = {name: replaced.get(tensor, tensor) for name, tensor in bound.items()}

    def rename(source: str) -> str:
        control = source.startswith("^")
        name = node_name(source)
        if name in bound:
            return ("^" + node_name(bound[name])) if control else bound[name]
        return ("^" if control else "") + f"{prefix}/{source.lstrip('^')}"

    for node in replacement.node:
        if node.name in bound:
            continue
        new = graph_def.node.add()
        new.CopyFrom(node)
        new.name = f"{prefix}/{node.name}"
        new.input[:] = [rename(i) for i in node.input]
    output, old = f"{prefix}/out:0", tensor_name(old_output)
    for node in graph_def.node:
        if not node.name.startswith(prefix + "/"):
            node.input[:] = [output if tensor_name(i) == old else i for i in node.input]
    replaced[old] = output
    return output
