"""graph_index's shared lookups: a tensor's fixed scalar value, and what a set of nodes depends on."""

import tensorflow as tf

from tf_dietcode.graph_rewrite.analysis.graph_index import GraphIndex, ancestors


def small_graph() -> tf.compat.v1.GraphDef:
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None], name="x")
        tf.constant(3, name="three")
        tf.constant([-1], name="axis")
        pair = tf.constant([1.0, 2.0], name="pair")
        y = tf.add(x, tf.constant(1.0, name="one"), name="y")
        with tf.control_dependencies([pair]):
            tf.identity(y, name="z")
        tf.multiply(x, 2.0, name="unused")
    return graph.as_graph_def()


def test_scalar_is_the_value_of_a_one_element_constant_of_any_shape_else_none():
    index = GraphIndex(small_graph(), {})
    assert index.scalar("three:0") == 3.0 and isinstance(index.scalar("three:0"), float)
    assert index.scalar("axis:0") == -1.0  # a [1] axis, as tf.reduce_mean(axis=[-1]) writes it
    assert index.scalar("pair:0") is None  # two elements
    assert index.scalar("x:0") is None  # not fixed at optimize time


def test_ancestors_follow_data_and_control_inputs_and_nothing_else():
    graph_def = small_graph()
    found = ancestors(graph_def, ["z:0"])
    assert found == {"z", "y", "x", "one", "pair"}
    assert ancestors(graph_def, ["^pair", "three"]) == {"pair", "three"}
    assert ancestors(graph_def, ["not_a_node:0"]) == set()
