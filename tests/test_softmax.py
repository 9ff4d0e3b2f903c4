"""DietcodeSoftmax (and its log softmax, each with or without a mask) against a float64 softmax and TF's own: fresh random inputs,
edge shapes (rows of every tail length, blocks of rows split over the intra-op
pool), masked and extreme logits, gradients, bad input as clear errors; and
optimize() putting it in place of TF's Softmax nodes."""

import numpy as np
import pytest
import tensorflow as tf

import tf_dietcode
from tf_dietcode import ops
from tf_dietcode.graph_rewrite.fusions import softmax
from tf_dietcode.tuning import search

from conftest import TINY_TUNING_OPTIONS, shared_database

TINY_TUNING = search.SearchOptions(**TINY_TUNING_OPTIONS)


def _float64_softmax(x):
    x = np.asarray(x, np.float64)
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


@pytest.mark.parametrize("shape", [(1, 12, 1, 1), (1, 12, 5, 5), (2, 12, 17, 17), (1, 3, 62, 62), (128, 128),
                                   (1,), (7, 1), (3, 4097), (300, 13), (0, 8), (2, 0, 5)])
def test_matches_a_float64_softmax(rng, shape):
    x = (rng.normal(size=shape) * rng.uniform(0.1, 30, shape[:-1] + (1,))
         + rng.uniform(-100, 100, shape[:-1] + (1,))).astype(np.float32)
    got = ops.softmax(x).numpy()
    assert got.shape == x.shape
    np.testing.assert_allclose(got, _float64_softmax(x), rtol=2e-6, atol=1e-7)


@pytest.mark.parametrize("shape", [(1, 12, 1, 1), (32, 8000), (2, 12, 17, 17), (1,), (7, 1), (3, 4097), (300, 13),
                                   (0, 8), (2, 0, 5)])
def test_log_softmax_matches_a_float64_log_softmax(rng, shape):
    x = (rng.normal(size=shape) * rng.uniform(0.1, 30, shape[:-1] + (1,))
         + rng.uniform(-100, 100, shape[:-1] + (1,))).astype(np.float32)
    got = ops.softmax(x, log=True).numpy()
    assert got.shape == x.shape
    expected = np.log(np.maximum(_float64_softmax(x), 1e-300))
    np.testing.assert_allclose(got, expected, rtol=2e-6, atol=2e-5)
    np.testing.assert_allclose(got, tf.nn.log_softmax(x).numpy(), rtol=2e-6, atol=2e-5)


def test_log_softmax_of_masked_and_extreme_logits_as_tf():
    x = np.array([[0.0, -np.inf, 1.0], [-1e30, 0.0, 1e30], [88.0, 89.0, -200.0], [-1e9, -1e9, 3.0]], np.float32)
    np.testing.assert_allclose(ops.softmax(x, log=True).numpy(), tf.nn.log_softmax(x).numpy(), rtol=1e-6, atol=1e-6)


def test_masked_and_extreme_logits():
    """As TF for masks and extremes; a NaN makes its row NaN, as in numpy (oneDNN's softmax keeps the
    row's other elements finite)."""
    x = np.array([[0.0, -np.inf, 1.0], [-1e30, 0.0, 1e30], [88.0, 89.0, -200.0], [-np.inf] * 3,
                  [1.0, np.nan, 2.0]], np.float32)
    got = ops.softmax(x).numpy()
    np.testing.assert_allclose(got[:3], tf.nn.softmax(x[:3]).numpy(), rtol=1e-6, atol=1e-7)
    with np.errstate(invalid="ignore"):
        np.testing.assert_array_equal(np.isnan(got[3:]), np.isnan(_float64_softmax(x[3:])))


def test_gradient_and_shape_inside_tf_function(rng):
    x = tf.constant(rng.normal(size=(2, 5, 9)).astype(np.float32))
    traced = tf.function(ops.softmax, input_signature=[tf.TensorSpec([None, None, 9], tf.float32)])
    assert traced.get_concrete_function().outputs[0].shape.as_list() == [None, None, 9]
    weights = tf.constant(rng.normal(size=(2, 5, 9)).astype(np.float32))
    grads = []
    for softmax in (ops.softmax, tf.nn.softmax, lambda v: ops.softmax(v, log=True), tf.nn.log_softmax):
        with tf.GradientTape() as tape:
            tape.watch(x)
            loss = tf.reduce_sum(softmax(x) * weights)
        grads.append(tape.gradient(loss, x))
    np.testing.assert_allclose(grads[0], grads[1], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(grads[2], grads[3], rtol=1e-5, atol=1e-5)


def test_bad_input_is_a_clear_error():
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError), match="rank >= 1|rank at least 1"):
        ops.softmax(np.float32(1.0))
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError), match="float32"):
        ops.softmax(np.ones((2, 3), np.float64))


def test_optimize_replaces_softmax_nodes(tmp_path, rng):
    """A model with nothing to tune: the Softmax and LogSoftmax nodes still become ours, in every signature."""
    class Model(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None, None, 5], tf.float32, name="x")])
        def serve(self, x):
            return {"out": tf.nn.softmax(x * 3.0) + tf.nn.softmax(x), "log": tf.nn.log_softmax(x + 2.0)}

    model = Model()
    tf.saved_model.save(model, str(tmp_path / "in"), signatures={"serving_default": model.serve})
    report = tf_dietcode.optimize(tmp_path / "in", tmp_path / "out", shape_ranges={"x": [(1, 2), (1, 9), 5]})
    assert report.found["softmax"] == report.fused["softmax"] == 2
    assert report.found["log softmax (of logits + a scalar)"] == report.fused["log softmax (of logits + a scalar)"] == 1
    assert "softmax: 2 / 2" in report.summary()
    optimized = tf.saved_model.load(str(tmp_path / "out")).signatures["serving_default"]
    x = rng.uniform(-3, 3, (2, 7, 5)).astype(np.float32)
    for name, expected in model.serve(x).items():
        np.testing.assert_allclose(optimized(x=x)[name], expected, rtol=1e-6, atol=1e-6, err_msg=name)
    graph_ops = {n.op for f in optimized.graph.as_graph_def().library.function for n in f.node_def}
    assert "DietcodeSoftmax" in graph_ops and not {"Softmax", "_MklSoftmax", "LogSoftmax"} & graph_ops


def test_optimize_drops_a_scalar_added_to_the_logits(tmp_path, rng):
    """softmax(x + c) = softmax(x): Hugging Face's TF models add 1e-9 before every softmax; the Add goes
    where the scalar is fixed and the sum read only by the Softmax, and stays otherwise."""
    class Model(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None, 3, None, None], tf.float32, name="x")])
        def serve(self, x):
            shared = x + 2.0  # read twice: stays
            return {"out": tf.nn.softmax(x + 1e-9) + tf.nn.softmax(7.5 + x * 3.0) + tf.nn.softmax(shared) + shared,
                    "broadcast": tf.nn.softmax(x[0, 0] + tf.constant(0.5, shape=[1, 1, 1]))}  # the rank grows: stays

    model = Model()
    tf.saved_model.save(model, str(tmp_path / "in"), signatures={"serving_default": model.serve})
    report = tf_dietcode.optimize(tmp_path / "in", tmp_path / "out", shape_ranges={"x": [(1, 2), 3, (1, 9), (1, 9)]})
    assert report.found[softmax.SHIFTED_FORM] == report.fused[softmax.SHIFTED_FORM] == 2
    assert report.found[softmax.FORM] == report.fused[softmax.FORM] == 2
    original, optimized = (tf.saved_model.load(str(tmp_path / name)).signatures["serving_default"]
                           for name in ("in", "out"))

    def adds(signature) -> int:
        return sum(n.op in ("Add", "AddV2") for f in signature.graph.as_graph_def().library.function
                   for n in f.node_def)

    assert adds(optimized) == adds(original) - 2
    for shape in [(1, 3, 1, 1), (2, 3, 7, 5), (2, 3, 9, 9)]:
        x = rng.uniform(-3, 3, shape).astype(np.float32)
        expected, actual = model.serve(x), optimized(x=x)
        for name in expected:
            np.testing.assert_allclose(actual[name], expected[name], rtol=1e-6, atol=1e-6, err_msg=name)


@pytest.mark.parametrize("logits_shape, mask_shape", [
    ((2, 3, 5, 5), (2, 1, 1, 5)),     # Keras' attention: [batch, 1, 1, keys] over every head and query
    ((1, 12, 17, 17), (1, 1, 17, 17)),
    ((2, 3, 5, 5), (2, 3, 5, 5)),
    ((3, 4, 62), (62,)),
    ((2, 3, 5, 7), (2, 3, 5, 1)),     # broadcast along the row: a row is all logits or all fill
    ((1, 7), (3, 4, 1, 7)),           # the logits broadcast: the output takes the mask's shape
    ((4, 1, 9), (1, 6, 1)),
    ((300, 13), (300, 13)),
    ((0, 8), (1, 8)), ((2, 0, 5), (2, 1, 5)), ((1,), (1,)),
])
@pytest.mark.parametrize("log", [False, True])
def test_a_mask_gives_softmax_of_where_mask_logits_fill(rng, logits_shape, mask_shape, log):
    x = rng.normal(0, 3, logits_shape).astype(np.float32)
    mask = rng.uniform(size=mask_shape) < 0.7
    got = ops.softmax(x, mask=mask, fill=-1e9, log=log).numpy()
    masked = np.where(mask, x, np.float32(-1e9))
    expected = np.log(np.maximum(_float64_softmax(masked), 1e-300)) if log else _float64_softmax(masked)
    assert got.shape == masked.shape
    if log:  # masked positions read about -1e9: float32's spacing there is 64
        np.testing.assert_allclose(got, (tf.nn.log_softmax(masked)).numpy(), rtol=1e-6, atol=2e-5)
    else:
        np.testing.assert_allclose(got, expected, rtol=2e-6, atol=1e-7)


def test_masked_rows_of_every_position_as_tf():
    """A row masked throughout: uniform with Keras' finite fill, NaN with -inf (as TF's where + softmax)."""
    x = np.arange(12, dtype=np.float32).reshape(2, 6)
    mask = np.array([[False] * 6, [True, False] * 3])
    for fill in (-2.3726709e38, -np.inf, 0.0):
        expected = tf.nn.softmax(tf.where(mask, x, np.float32(fill))).numpy()
        np.testing.assert_allclose(ops.softmax(x, mask=mask, fill=fill).numpy(), expected, rtol=1e-6, atol=1e-7)


def test_masked_gradient_and_shape_inside_tf_function(rng):
    x = tf.constant(rng.normal(size=(2, 3, 4, 4)).astype(np.float32))
    mask = tf.constant(rng.uniform(size=(2, 1, 1, 4)) < 0.6)
    traced = tf.function(lambda v, m: ops.softmax(v, mask=m, fill=-1e9),
                         input_signature=[tf.TensorSpec([None, 3, None, None], tf.float32),
                                          tf.TensorSpec([None, 1, 1, None], tf.bool)])
    assert traced.get_concrete_function().outputs[0].shape.as_list() == [None, 3, None, None]
    weights = tf.constant(rng.normal(size=(2, 3, 4, 4)).astype(np.float32))
    grads = []
    for softmax_of in (lambda v: ops.softmax(v, mask=mask, fill=-1e9),
                       lambda v: tf.nn.softmax(tf.where(mask, v, -1e9))):
        with tf.GradientTape() as tape:
            tape.watch(x)
            loss = tf.reduce_sum(softmax_of(x) * weights)
        grads.append(tape.gradient(loss, x))
    np.testing.assert_allclose(grads[0], grads[1], rtol=1e-5, atol=1e-6)


def test_a_mask_that_does_not_broadcast_is_a_clear_error():
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError), match="broadcast|Incompatible|Dimensions"):
        ops.softmax(np.ones((2, 5), np.float32), mask=np.ones((3, 5), bool))
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError), match="bool"):
        ops.softmax(np.ones((2, 5), np.float32), mask=np.ones((2, 5), np.float32))
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError), match="rank >= 1|rank at least 1"):
        ops.softmax(np.float32(1.0), mask=np.bool_(True))


def test_optimize_takes_keras_attention_masks_into_the_softmax(tmp_path, rng):
    """Keras' MultiHeadAttention with an attention mask: its SelectV2 (and the LogicalAnd with
    ones_like it builds the mask with) go into DietcodeSoftmax; outputs agree wherever the mask is."""
    keras = tf.keras
    tokens = keras.Input((None, 16), name="x")
    keep = keras.Input((None,), dtype="bool", name="keep")
    attention = keras.layers.MultiHeadAttention(num_heads=2, key_dim=8)
    out = attention(tokens, tokens, attention_mask=keras.ops.expand_dims(keep, 1))
    model = keras.Model([tokens, keep], out)
    model.export(str(tmp_path / "in"), verbose=False)
    report = tf_dietcode.optimize(tmp_path / "in", tmp_path / "out", tuning=TINY_TUNING, database=shared_database(),
                                  shape_ranges={"x": [(1, 2), (1, 9), 16], "keep": [(1, 2), (1, 9)]})
    assert report.found[softmax.MASKED_FORM] == report.fused[softmax.MASKED_FORM] >= 1
    original, optimized = (tf.saved_model.load(str(tmp_path / name)).signatures["serving_default"]
                           for name in ("in", "out"))
    graph_ops = {n.op for f in optimized.graph.as_graph_def().library.function for n in f.node_def}
    assert "DietcodeSoftmax" in graph_ops and not {"SelectV2", "LogicalAnd", "Softmax", "_MklSoftmax"} & graph_ops
    for batch, t in [(1, 1), (2, 7), (2, 9)]:
        x = rng.normal(size=(batch, t, 16)).astype(np.float32)
        mask = rng.uniform(size=(batch, t)) < 0.7
        mask[:, 0] = True
        expected, actual = original(x=x, keep=mask), optimized(x=x, keep=mask)
        for name in expected:
            np.testing.assert_allclose(actual[name], expected[name], rtol=1e-5, atol=1e-5, err_msg=name)


def test_a_select_read_elsewhere_or_a_fill_that_is_not_a_fixed_scalar_stays(tmp_path, rng):
    class Model(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None, 5], tf.float32, name="x"),
                                      tf.TensorSpec([None, 5], tf.bool, name="m")])
        def serve(self, x, m):
            shared = tf.where(m, x, -1e9)  # read twice: stays
            return {"shared": tf.nn.softmax(shared) + shared, "varying": tf.nn.softmax(tf.where(m, x, x * 2.0)),
                    "masked": tf.nn.softmax(tf.where(m, x, -1e9))}

    model = Model()
    tf.saved_model.save(model, str(tmp_path / "in"), signatures={"serving_default": model.serve})
    report = tf_dietcode.optimize(tmp_path / "in", tmp_path / "out", shape_ranges={"x": [(1, 3), 5], "m": [(1, 3), 5]})
    assert report.fused[softmax.MASKED_FORM] == 1 and report.fused[softmax.FORM] == 2
    optimized = tf.saved_model.load(str(tmp_path / "out")).signatures["serving_default"]
    x, m = rng.normal(size=(3, 5)).astype(np.float32), rng.uniform(size=(3, 5)) < 0.5
    for name, expected in model.serve(x, m).items():
        np.testing.assert_allclose(optimized(x=x, m=m)[name], expected, rtol=1e-6, atol=1e-6, err_msg=name)
