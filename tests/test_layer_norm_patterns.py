"""optimize() replaces the layer norms TF emits (Keras 3's LayerNormalization,
tf.nn.batch_normalization over tf.nn.moments, a hand-written mean/variance) with
one DietcodeLayerNorm each, and leaves alone those it must: a norm over another
axis, or one whose intermediate results something else reads. An add that only
the norm reads (a Transformer's residual) goes into the op."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import tf_dietcode

RANGES = {"x": [(1, 2), (1, 12), 16]}
SPEC = tf.TensorSpec([None, None, 16], tf.float32, name="x")


class Norms(tf.Module):
    """x (plus a residual) -> a norm of it over `axis` written one way (gamma and beta per
    feature); `extra` names intermediate results also returned ("variance", "sum")."""

    def __init__(self, form: str, axis: int = -1, extra: tuple[str, ...] = (), residual: str = "none"):
        rng = np.random.default_rng(0)
        self.gamma = tf.Variable(rng.normal(1, 0.2, 16).astype(np.float32))
        self.beta = tf.Variable(rng.normal(0, 0.2, 16).astype(np.float32))
        self.form, self.axis, self.extra, self.residual = form, axis, extra, residual

    @tf.function(input_signature=[SPEC])
    def serve(self, x):
        outputs = {}
        if self.residual != "none":  # x + a sublayer's output, or + its mean over time (broadcast)
            sublayer = tf.tanh(x) if self.residual == "same shape" else tf.reduce_mean(x, axis=1, keepdims=True)
            x = outputs["sum"] = x + sublayer
        if self.form == "moments":
            mean, variance = tf.nn.moments(x, axes=[self.axis], keepdims=True)
        else:  # by hand: no StopGradient on the mean
            mean = tf.reduce_mean(x, axis=self.axis, keepdims=True)
            variance = tf.reduce_mean(tf.math.squared_difference(x, mean), axis=self.axis, keepdims=True)
        outputs.update(y=tf.nn.batch_normalization(x, mean, variance, self.beta, self.gamma, 1e-5),
                       variance=variance)
        return {name: outputs[name] for name in ("y", *self.extra)}


def _keras_model(axis: int) -> keras.Model:
    keras.utils.set_random_seed(0)
    inputs = keras.Input((None, 16), name="x")
    return keras.Model(inputs, keras.layers.LayerNormalization(axis=axis, epsilon=1e-4)(inputs * 2.0 + 1.0))


def _save(model, path):
    if isinstance(model, keras.Model):
        model.export(str(path), verbose=False)
    else:
        tf.saved_model.save(model, str(path), signatures={"serving_default": model.serve})


@pytest.mark.parametrize("model, fused, switch", [
    (lambda: _keras_model(-1), 1, True), (lambda: _keras_model(2), 1, True), (lambda: Norms("moments"), 1, True),
    (lambda: Norms("by hand"), 1, True),
    (lambda: _keras_model(-1), 0, False),                 # layer_norm_fusion=False
    (lambda: Norms("moments", axis=1), 0, True),          # normalised over time, not the last axis
    (lambda: Norms("moments", extra=("variance",)), 0, True),  # the variance is an output too
])
def test_layer_norms_are_fused_where_they_can_be(tmp_path, rng, model, fused, switch):
    _save(model(), tmp_path / "original")
    report = tf_dietcode.optimize(tmp_path / "original", tmp_path / "optimized", shape_ranges=RANGES,
                                  layer_norm_fusion=switch)
    signatures = len(report.signatures)
    assert report.found["layer norm"] == report.fused["layer norm"] == fused * signatures
    original, optimized = (tf.saved_model.load(str(tmp_path / name)) for name in ("original", "optimized"))
    graph = optimized.signatures["serving_default"].graph
    ops_in = {node.op for f in graph.as_graph_def().library.function for node in f.node_def}
    assert ("DietcodeLayerNorm" in ops_in) == bool(fused)
    assert ("SquaredDifference" in ops_in) == (not fused)
    for batch, t in [(1, 1), (2, 7), (2, 12), (1, 30)]:  # 30: past the range, nothing depends on it
        x = tf.constant((rng.normal(size=(batch, t, 16)) * 3 + 5).astype(np.float32))
        want = original.signatures["serving_default"](x=x)
        got = optimized.signatures["serving_default"](x=x)
        for key in want:
            np.testing.assert_allclose(got[key], want[key], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("form", ["moments", "by hand"])
@pytest.mark.parametrize("residual, extra, absorbed", [
    ("same shape", (), True), ("broadcast", (), True),
    ("same shape", ("sum",), False),  # the sum is read elsewhere too (a pre-LN residual stream)
])
def test_residual_adds_go_into_the_op(tmp_path, rng, form, residual, extra, absorbed):
    _save(Norms(form, residual=residual, extra=extra), tmp_path / "original")
    report = tf_dietcode.optimize(tmp_path / "original", tmp_path / "optimized", shape_ranges=RANGES)
    assert report.fused["layer norm"] == len(report.signatures)
    original, optimized = (tf.saved_model.load(str(tmp_path / name)) for name in ("original", "optimized"))
    nodes = [node for f in optimized.signatures["serving_default"].graph.as_graph_def().library.function
             for node in f.node_def]
    norms = [node for node in nodes if node.op == "DietcodeLayerNorm"]
    assert [node.attr["num_residual"].i for node in norms] == [int(absorbed)]
    assert any(node.op in ("AddV2", "Add") for node in nodes) == (not absorbed)
    for batch, t in [(1, 1), (2, 7), (1, 30)]:
        x = tf.constant((rng.normal(size=(batch, t, 16)) * 3 + 5).astype(np.float32))
        want = original.signatures["serving_default"](x=x)
        got = optimized.signatures["serving_default"](x=x)
        for key in want:
            np.testing.assert_allclose(got[key], want[key], rtol=1e-5, atol=1e-5)
