"""Replaces matched dense layers with DietcodeFusedMatMul in a GraphDef.

Each replacement is written with TF's Python API in a scratch graph (so every
node is built and typed by TF itself), then spliced in: its placeholders are
bound to the matched layer's tensors and the new resources, its other nodes
renamed under a unique prefix, and every reader of the layer's output reads
the replacement's output instead. Nodes nothing reads any more are pruned
when the graph becomes a function again.
"""

import tensorflow as tf

from tf_dietcode import ops
from tf_dietcode.graph_rewrite.dense_patterns import DenseMatch
from tf_dietcode.graph_rewrite.graph_index import node_name, tensor_name

BUNDLE_PLACEHOLDER = "dietcode/bundle"


def _replacement(match: DenseMatch) -> tf.compat.v1.GraphDef:
    """act(x @ W + b) over x's trailing dims, with W pre-packed, as node "out"; placeholders x,
    packed, bias, bundle and out_shape stand for tensors of the graph it goes into."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, name="x")
        packed = tf.raw_ops.ReadVariableOp(resource=tf.compat.v1.placeholder(tf.resource, name="packed"),
                                           dtype=tf.float32)
        bias = tf.reshape(tf.compat.v1.placeholder(tf.float32, name="bias"), [-1]) if match.bias else None
        bundle = tf.compat.v1.placeholder(tf.string, [], name="bundle")
        flat = match.form != "einsum"  # x is [M, K] already
        product = ops.fused_matmul(x if flat else tf.reshape(x, [-1, match.k]), packed, bias,
                                   activation=match.activation, packed_n=match.n, bundle=bundle,
                                   name="out" if match.out_shape is None and flat else None)
        if match.out_shape is not None:
            tf.reshape(product, tf.compat.v1.placeholder(tf.int32, name="out_shape"), name="out")
        elif not flat:
            leading = tf.shape(x)[: -match.contracted]
            tf.reshape(product, tf.concat([leading, tf.constant(match.out_dims, tf.int32)], 0), name="out")
    return graph.as_graph_def()


def add_placeholder(graph_def: tf.compat.v1.GraphDef, name: str, dtype: tf.DType) -> None:
    node = graph_def.node.add(name=name, op="Placeholder")
    node.attr["dtype"].type = dtype.as_datatype_enum


def splice_dense(graph_def: tf.compat.v1.GraphDef, match: DenseMatch, prefix: str, packed_placeholder: str,
                 replaced: dict[str, str]) -> str:
    """Adds match's replacement and rewires its readers; returns the new output tensor.

    `replaced` maps the outputs of layers spliced before to their replacements
    (a layer's input may be one) and gains this layer's entry.
    """
    bound = {"x": replaced.get(match.x, match.x), "packed": f"{packed_placeholder}:0", "bias": match.bias,
             "bundle": f"{BUNDLE_PLACEHOLDER}:0", "out_shape": match.out_shape}

    def rename(source: str) -> str:
        control = source.startswith("^")
        name = node_name(source)
        if name in bound:
            return ("^" + node_name(bound[name])) if control else bound[name]
        return ("^" if control else "") + f"{prefix}/{source.lstrip('^')}"

    for node in _replacement(match).node:
        if node.name in bound:
            continue
        new = graph_def.node.add()
        new.CopyFrom(node)
        new.name = f"{prefix}/{node.name}"
        new.input[:] = [rename(i) for i in node.input]
    output = f"{prefix}/out:0"
    old = tensor_name(match.output)
    for node in graph_def.node:
        if node.name.startswith(prefix + "/"):
            continue
        node.input[:] = [output if tensor_name(i) == old else i for i in node.input]
    replaced[old] = output
    return output
