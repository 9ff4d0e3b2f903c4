"""Replaces matched patterns with Dietcode fused ops in a GraphDef.

Each replacement is written with TF's Python API in a scratch graph (so every
node is built and typed by TF itself), then spliced in: its placeholders are
bound to tensors of the graph it goes into, its other nodes renamed under a
unique prefix, and every reader of the pattern's i-th output reads the
replacement's node "out_<i>" instead. Nodes nothing reads any more are
pruned when the graph becomes a function again.
"""

import tensorflow as tf

from tf_dietcode import ops
from tf_dietcode.graph_rewrite.attention_patterns import AttentionMatch
from tf_dietcode.graph_rewrite.dense_patterns import DenseMatch
from tf_dietcode.graph_rewrite.horizontal_fusion import DenseGroup
from tf_dietcode.graph_rewrite.graph_index import node_name, tensor_name
from tf_dietcode.graph_rewrite.layer_norm_patterns import LayerNormMatch

BUNDLE_PLACEHOLDER = "dietcode/bundle"


def _scratch_graph(build) -> tf.compat.v1.GraphDef:
    graph = tf.Graph()
    with graph.as_default():
        build()
    return graph.as_graph_def()


def _bias_vector(member: DenseMatch, i: int) -> tf.Tensor:
    """Member i's bias as the op reads it, [N] (zeros where it has none); placeholder bias_<i>."""
    if member.bias is None:
        return tf.zeros([member.n])
    bias = tf.compat.v1.placeholder(tf.float32, member.bias_shape, f"bias_{i}")
    return bias if len(member.bias_shape) == 1 else tf.reshape(bias, [-1])


def dense_replacement(group: DenseGroup, packed_n: int) -> tf.compat.v1.GraphDef:
    """act(x @ W + b) over x's trailing dims for a group of layers, W their weights side by side,
    pre-packed (packed_n = N) or as stored ([K, N], packed_n = 0), written group-major and unstacked
    (no copy) into each member's output "out_<i>". Placeholders x, packed (W's variable), bias_<i>,
    out_shape_<i> and bundle."""
    def build():
        x = tf.compat.v1.placeholder(tf.float32, name="x")
        packed = tf.raw_ops.ReadVariableOp(resource=tf.compat.v1.placeholder(tf.resource, name="packed"),
                                           dtype=tf.float32)
        bias = None
        if group.has_bias:  # the members' biases as vectors side by side, zeros for those without
            biases = [_bias_vector(member, i) for i, member in enumerate(group.members)]
            bias = biases[0] if len(biases) == 1 else tf.concat(biases, 0)
        bundle = tf.compat.v1.placeholder(tf.string, [], name="bundle")
        first = group.members[0]
        whole = len(group.members) == 1 and first.out_shape is None  # the op's output is the layer's
        operand, num_k_dims = (x, group.contracted) if group.shares_x else (tf.reshape(x, [-1, group.k]), 1)
        product = ops.fused_matmul(operand, packed, bias, activation=group.activation, packed_n=packed_n,
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
                   "y_perm": y_perm, "bundle": bundle, "name": "out_0"}
        if match.addend is not None:
            ops.fused_batch_matmul_add(x, y, tf.compat.v1.placeholder(tf.float32, name="addend"), **options)
        else:
            ops.fused_batch_matmul_transpose(x, y, match.perm, **options)
    return _scratch_graph(build)


def layer_norm_replacement(match: LayerNormMatch) -> tf.compat.v1.GraphDef:
    """One DietcodeLayerNorm over x's last axis; placeholders x, gamma and beta (the graph's
    [1, ..., 1, depth] tensors, read as [depth]), and residual where the match has one."""
    def build():
        x, gamma, beta = (tf.compat.v1.placeholder(tf.float32, name=name) for name in ("x", "gamma", "beta"))
        residual = tf.compat.v1.placeholder(tf.float32, name="residual") if match.residual else None
        ops.layer_norm(x, tf.reshape(gamma, [-1]), tf.reshape(beta, [-1]), residual=residual,
                       epsilon=match.epsilon, name="out_0")
    return _scratch_graph(build)


def softmax_replacement() -> tf.compat.v1.GraphDef:
    """One DietcodeSoftmax; placeholder x. The same for every Softmax node."""
    return _scratch_graph(lambda: ops.softmax(tf.compat.v1.placeholder(tf.float32, name="x"), name="out_0"))


def add_placeholder(graph_def: tf.compat.v1.GraphDef, name: str, dtype: tf.DType) -> None:
    node = graph_def.node.add(name=name, op="Placeholder")
    node.attr["dtype"].type = dtype.as_datatype_enum


def add_string_constant(graph_def: tf.compat.v1.GraphDef, name: str, value: str) -> None:
    node = graph_def.node.add(name=name, op="Const")
    node.attr["dtype"].type = tf.string.as_datatype_enum
    node.attr["value"].tensor.CopyFrom(tf.make_tensor_proto(value))


def splice(graph_def: tf.compat.v1.GraphDef, replacement: tf.compat.v1.GraphDef, bound: dict[str, str | None],
           prefix: str, outputs: dict[str, str], replaced: dict[str, str]) -> dict[str, str]:
    """Adds `replacement` (its placeholders bound to tensors by name) and rewires the readers of
    each old output to the replacement's node `outputs[old output]`.

    `replaced` maps the outputs of patterns spliced before to their replacements
    (a bound tensor may be one) and gains this pattern's entries, which are returned.
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
    new_outputs = {tensor_name(old): f"{prefix}/{node}:0" for old, node in outputs.items()}
    for node in graph_def.node:
        if not node.name.startswith(prefix + "/"):
            node.input[:] = [new_outputs.get(tensor_name(i), i) for i in node.input]
    replaced.update(new_outputs)
    return new_outputs
