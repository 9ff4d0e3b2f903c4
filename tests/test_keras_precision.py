"""DietDense(precision=...): the layer trains on its float32 kernel (trainable, gradients flow),
tune() converts it once into the weights its bfloat16 or int8 op reads at inference, and the
converted weights travel with `.keras` files and `model.export()` SavedModels."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from tf_dietcode import keras as diet_keras
from tf_dietcode import output_check

LOW_OPS = {"bfloat16": "DietcodeFusedMatMulBf16", "int8": "DietcodeFusedMatMulInt8"}
CLOSE = {"bfloat16": 1e-2, "int8": 5e-2}  # output_check.row_error


def _model(precision: str) -> keras.Model:
    keras.utils.set_random_seed(0)
    inputs = keras.Input((None, 24), name="tokens")
    hidden = diet_keras.DietDense(48, activation="gelu", precision=precision)(inputs)
    return keras.Model(inputs, diet_keras.DietDense(8, precision=precision)(hidden))


def _ops(function, *args) -> set[str]:
    return {node.op for node in tf.function(function).get_concrete_function(*args).graph.as_graph_def().node}


@pytest.mark.parametrize("precision", ["bfloat16", "int8"])
def test_trains_in_float32_then_serves_the_converted_weights(precision, rng, tmp_path):
    model = _model(precision)
    layer = model.layers[1]
    assert layer.get_config()["precision"] == precision and layer.kernel.trainable
    x = rng.uniform(-1, 1, (4, 5, 24)).astype(np.float32)
    before = keras.ops.convert_to_numpy(layer.kernel).copy()
    model.compile(optimizer="sgd", loss="mse")
    model.fit(x, rng.uniform(-1, 1, (4, 5, 8)).astype(np.float32), epochs=2, verbose=0)
    assert not np.array_equal(keras.ops.convert_to_numpy(layer.kernel), before)  # the float32 kernel learns
    float32 = model(x).numpy()  # before tune(): nothing converted, float32
    report = diet_keras.tune(model, [(1, 4), (1, 8), 24], progress=False)
    assert report.converted == {layer.path: precision for layer in model.layers[1:]} and not report.tuned
    assert f"{precision}, weights converted" in report.summary() and "(not tuned)" in report.summary()
    served = model(x).numpy()
    assert output_check.row_error(float32, served) <= CLOSE[precision]
    assert not np.array_equal(served, float32)
    assert LOW_OPS[precision] in _ops(lambda t: model(t, training=False), x)
    assert "DietcodeFusedMatMul" in _ops(lambda t: model(t, training=True), x)  # training: the float32 kernel
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(model(x, training=True))
    assert all(g is not None for g in tape.gradient(loss, model.trainable_weights))
    assert [w.name for w in layer.non_trainable_weights] == [f"{precision}_{name}" for name in layer._converted]

    model.save(tmp_path / "model.keras")
    loaded = keras.saving.load_model(tmp_path / "model.keras")
    np.testing.assert_array_equal(loaded(x).numpy(), served)
    model.export(str(tmp_path / "exported"), verbose=False)
    exported = tf.saved_model.load(str(tmp_path / "exported"))
    np.testing.assert_array_equal(exported.serve(x).numpy(), served)


def test_tune_sets_the_precision_of_every_layer(rng):
    model = _model("float32")
    report = diet_keras.tune(model, [(1, 4), (1, 8), 24], precision="int8", progress=False)
    assert [layer.precision for layer in model.layers[1:]] == ["int8", "int8"]
    assert set(report.converted.values()) == {"int8"}
    x = rng.uniform(-1, 1, (2, 3, 24)).astype(np.float32)
    assert LOW_OPS["int8"] in _ops(lambda t: model(t), x)


def test_an_unknown_precision_is_a_clear_error():
    with pytest.raises(ValueError, match=r"unknown precision 'fp8': give one of \['float32', 'bfloat16', 'int8'\]"):
        diet_keras.DietDense(8, precision="fp8")
