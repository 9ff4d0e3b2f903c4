"""graph_rewrite.slice_sinking: a row slice of a chain of fused dense / layer-norm ops moves ahead
of the chain, which then computes the kept rows only; the result equals the original's on fresh
inputs of many shapes, and slices that are not row slices (or ops whose output is read elsewhere)
stay where they are."""

import numpy as np
import pytest
import tensorflow as tf

from tf_dietcode import ops
from tf_dietcode.graph_rewrite import bodies, slice_sinking

DEPTH, HIDDEN = 16, 24
rng = np.random.default_rng(7)
W1, W2 = rng.standard_normal((DEPTH, HIDDEN), np.float32), rng.standard_normal((HIDDEN, DEPTH), np.float32)
B1, B2 = rng.standard_normal(HIDDEN, np.float32), rng.standard_normal(DEPTH, np.float32)
GAMMA, BETA = rng.standard_normal(DEPTH, np.float32), rng.standard_normal(DEPTH, np.float32)


def _block(x, r):
    """A Transformer's last feed-forward block and a projection: LN(x + r) -> dense(relu) -> dense."""
    h = ops.layer_norm(x, GAMMA, BETA, residual=r, name="norm")
    return ops.fused_matmul(ops.fused_matmul(h, W1, B1, activation="relu", name="inner"), W2, B2, name="outer")


def _graph(build, rank: int | None = 3):
    """(graph_def, output tensor names) of build(x, r) on placeholders of the given rank."""
    graph = tf.Graph()
    with graph.as_default():
        shape = None if rank is None else [None] * (rank - 1) + [DEPTH]
        x = tf.compat.v1.placeholder(tf.float32, shape, name="x")
        r = tf.compat.v1.placeholder(tf.float32, shape, name="r")
        outputs = build(x, r)
    return graph.as_graph_def(), [t.name for t in outputs]


def _run(graph_def, outputs, x, r):
    graph = tf.Graph()
    with graph.as_default():
        tf.graph_util.import_graph_def(graph_def, name="")
    with tf.compat.v1.Session(graph=graph) as session:
        return session.run(outputs, {"x:0": x, "r:0": r})


def _sunk(build, rank=3):
    graph_def, outputs = _graph(build, rank)
    original = tf.compat.v1.GraphDef()
    original.CopyFrom(graph_def)
    moved = slice_sinking.sink(graph_def, {}, set(outputs))
    return original, graph_def, outputs, moved


def _assert_same_results(original, sunk, outputs, shapes):
    for shape in shapes:
        x, r = rng.standard_normal(shape, np.float32), rng.standard_normal(shape, np.float32)
        for expected, actual in zip(_run(original, outputs, x, r), _run(sunk, outputs, x, r)):
            np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("take", [lambda y: y[:, -1, :], lambda y: y[:, :1, :], lambda y: y[-1, :, :],
                                  lambda y: y[:, 2:7:2, :], lambda y: y[1:], lambda y: y[:, -1]])
def test_a_row_slice_moves_ahead_of_the_whole_chain(take):
    original, sunk, outputs, moved = _sunk(lambda x, r: [take(_block(x, r))])
    assert moved == ["outer", "inner", "norm"]
    live = bodies.needed_nodes(sunk, outputs, [])
    assert not {"outer", "inner", "norm"} & live, "the full-size ops still run"
    _assert_same_results(original, sunk, outputs, [(1, 1, DEPTH), (2, 9, DEPTH), (3, 13, DEPTH), (5, 8, DEPTH)])


def test_identical_slices_of_one_output_move_together():
    original, sunk, outputs, moved = _sunk(lambda x, r: (lambda y: [y[:, -1, :], 2 * y[:, -1, :]])(_block(x, r)))
    assert moved == ["outer", "inner", "norm"]
    _assert_same_results(original, sunk, outputs, [(1, 1, DEPTH), (4, 11, DEPTH)])


@pytest.mark.parametrize("why, build, rank", [
    ("the slice cuts the feature axis", lambda x, r: [_block(x, r)[:, :, :5]], 3),
    ("an ellipsis", lambda x, r: [_block(x, r)[..., -1:, :]], 3),
    ("a new axis", lambda x, r: [_block(x, r)[:, tf.newaxis, -1, :]], 3),
    ("the full output is read too", lambda x, r: (lambda y: [y[:, -1, :], y])(_block(x, r)), 3),
    ("unknown rank", lambda x, r: [_block(x, r)[:, -1, :]], None),
])
def test_other_slices_stay(why, build, rank):
    original, sunk, outputs, moved = _sunk(build, rank)
    assert "outer" not in moved, why
    _assert_same_results(original, sunk, outputs, [(2, 5, DEPTH)])


def test_a_layer_contracting_two_axes_moves():
    """EinsumDense's 'abcd,cde->abe' (num_k_dims = 2): the slice applies to a's leading axes."""
    weight = rng.standard_normal((4, 4, DEPTH), np.float32).reshape(DEPTH, DEPTH)

    def build(x, r):
        heads = tf.reshape(x + r, tf.concat([tf.shape(x)[:-1], [4, 4]], 0))
        return [ops.fused_matmul(heads, weight, num_k_dims=2, name="projection")[:, -1, :]]

    original, sunk, outputs, moved = _sunk(build)
    assert moved == ["projection"]
    _assert_same_results(original, sunk, outputs, [(1, 1, DEPTH), (3, 7, DEPTH)])
