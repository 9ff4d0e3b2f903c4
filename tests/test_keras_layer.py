"""tf_dietcode.keras: DietDense behaves as keras.layers.Dense (outputs, gradients,
training, masks, config, saving, export) while running the fused op; convert()."""

import functools
import inspect
import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest
import tensorflow as tf

import tf_dietcode
from conftest import random_tensor
from tf_dietcode.keras import DietDense, convert

K, UNITS = 8, 6  # UNITS even: glu halves the last axis


def _keras_activations():
    """Every public Keras activation a Dense layer can take by name (those needing only x)."""
    names = []
    for name, function in vars(keras.activations).items():
        if name.startswith("_") or name in ("get", "serialize", "deserialize") or not inspect.isfunction(function):
            continue
        if all(p.default is not p.empty for p in list(inspect.signature(function).parameters.values())[1:]):
            names.append(name)
    return sorted(names)


KERAS_ACTIVATIONS = _keras_activations()
CUSTOM_ACTIVATIONS = {
    "relu_max_value": lambda x: keras.activations.relu(x, max_value=0.5),
    "gelu_approximate": functools.partial(keras.activations.gelu, approximate=True),
    "tf_nn_relu": tf.nn.relu,
}


def test_activation_list_covers_keras():
    assert {"linear", "relu", "tanh", "sigmoid", "gelu", "softmax", "elu", "selu", "silu", "swish",
            "leaky_relu", "relu6", "mish", "hard_sigmoid", "exponential", "log_softmax"} <= set(KERAS_ACTIVATIONS)
    assert "threshold" not in KERAS_ACTIVATIONS  # needs arguments, so Dense cannot take it by name


def _pair(rng, units=UNITS, k=K, **config):
    """A Dense and a DietDense with the same config and the same random weights."""
    dense, diet = keras.layers.Dense(units, **config), DietDense(units, **config)
    for layer in (dense, diet):
        layer.build((None, k))
    weights = [random_tensor(rng, w.shape) for w in dense.weights]
    dense.set_weights(weights)
    diet.set_weights(weights)
    return dense, diet


def _assert_close(actual, expected, rtol=1e-5):
    expected = np.asarray(expected)
    scale = max(1.0, float(np.abs(expected).max(initial=0.0)))
    np.testing.assert_allclose(np.asarray(actual), expected, rtol=rtol, atol=rtol * scale)


def _op_types(function, *specs):
    return [op.type for op in tf.function(function).get_concrete_function(*specs).graph.get_operations()]


@pytest.mark.parametrize("use_bias", [True, False], ids=["bias", "no_bias"])
@pytest.mark.parametrize("activation", KERAS_ACTIVATIONS + sorted(CUSTOM_ACTIVATIONS))
def test_outputs_match_dense(rng, activation, use_bias):
    dense, diet = _pair(rng, activation=CUSTOM_ACTIVATIONS.get(activation, activation), use_bias=use_bias)
    for shape in [(5, K), (0, K), (1, K), (2, 3, K), (0, 3, K), (1, 1, K), (2, 1, 3, K)]:
        x = random_tensor(rng, shape)
        expected = dense(x)
        actual = diet(x)
        assert actual.shape == expected.shape
        _assert_close(actual, expected)


@pytest.mark.parametrize("activation, epilogue", [("linear", "none"), (None, "none"), ("relu", "relu"),
                                                  ("tanh", "tanh"), ("gelu", "gelu"), ("silu", "silu"),
                                                  ("swish", "silu"), ("sigmoid", "none"), ("softmax", "none")])
def test_the_op_runs_with_the_activation_fused_where_it_can(rng, activation, epilogue):
    _, diet = _pair(rng, activation=activation)
    graph = tf.function(diet).get_concrete_function(tf.TensorSpec([None, None, K])).graph
    fused = [op for op in graph.get_operations() if op.type == "DietcodeFusedMatMul"]
    assert len(fused) == 1 and fused[0].get_attr("activation").decode() == epilogue
    assert ("Sigmoid" in {op.type for op in graph.get_operations()}) == (activation == "sigmoid")
    assert graph.outputs[0].shape.as_list() == [None, None, UNITS]


def test_sigmoid_keeps_keras_logits_for_crossentropy(rng):
    """Keras' sigmoid tags its output with the logits, which binary cross-entropy reads: a fused
    sigmoid would lose them and clip saturated outputs (loss ~16 instead of ~40 here)."""
    dense, diet = _pair(rng, units=1, activation="sigmoid")
    x = np.full((4, K), 10.0, np.float32)
    for layer in (dense, diet):
        layer.set_weights([np.full((K, 1), -0.5, np.float32), np.zeros((1,), np.float32)])
    loss = keras.losses.BinaryCrossentropy()
    expected = loss(np.ones((4, 1), np.float32), dense(x))
    np.testing.assert_allclose(loss(np.ones((4, 1), np.float32), diet(x)), expected, rtol=1e-6)
    assert float(expected) > 39.0


@pytest.mark.parametrize("activation", ["gelu", "silu", "sigmoid", "softplus"])
def test_gradients_match_dense(rng, activation):
    dense, diet = _pair(rng, activation=activation)
    x = tf.constant(random_tensor(rng, (3, 4, K)))
    upstream = random_tensor(rng, (3, 4, UNITS))
    grads = []
    for layer in (dense, diet):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = layer(x)
            objective = tf.reduce_sum(y * upstream)
        grads.append(tape.gradient(objective, [x, layer.kernel, layer.bias]))
    for expected, actual in zip(*grads):
        assert actual is not None
        _assert_close(actual, expected)


def test_lora_runs_the_op_on_the_merged_kernel(rng):
    dense, diet = _pair(rng, activation="relu")
    for layer in (dense, diet):
        layer.enable_lora(2)
        layer.lora_kernel_b.assign(random_tensor(rng, layer.lora_kernel_b.shape))
    diet.lora_kernel_a.assign(dense.lora_kernel_a)
    diet.lora_kernel_b.assign(dense.lora_kernel_b)
    x = tf.constant(random_tensor(rng, (5, K)))
    grads = []
    for layer in (dense, diet):
        with tf.GradientTape() as tape:
            objective = tf.reduce_sum(layer(x) ** 2)
        grads.append(tape.gradient(objective, layer.trainable_weights))
    assert [w.name for w in diet.trainable_weights] == ["bias", "lora_kernel_a", "lora_kernel_b"]
    for expected, actual in zip(*grads):
        _assert_close(actual, expected)
    _assert_close(diet(x), dense(x))
    assert "DietcodeFusedMatMul" in _op_types(diet, tf.TensorSpec([None, K]))


@pytest.mark.parametrize("dtype", ["mixed_bfloat16", "float64"])
def test_other_dtypes_run_dense_own_call(rng, dtype):
    """The op is float32 only: other compute dtypes fall back to Dense.call, unchanged."""
    dense, diet = _pair(rng, activation="relu", dtype=dtype)
    x = random_tensor(rng, (2, 3, K))
    np.testing.assert_array_equal(diet(x), dense(x))
    assert "DietcodeFusedMatMul" not in _op_types(diet, tf.TensorSpec([None, None, K]))


def test_quantized_layers_run_keras_quantized_call(rng):
    dense, diet = _pair(rng)
    with pytest.raises(NotImplementedError):   # Keras refuses to quantize any Dense subclass by default
        diet.quantize("int8")
    dense.quantize("int8")
    diet.quantize("int8", type_check=False)
    x = random_tensor(rng, (3, K))
    np.testing.assert_array_equal(diet(x), dense(x))


def test_fit_follows_dense(rng):
    x = random_tensor(rng, (64, 4))
    y = x @ random_tensor(rng, (4, 1)) + 0.1 * random_tensor(rng, (64, 1))
    keras.utils.set_random_seed(int(rng.integers(2**31)))
    original = keras.Sequential([keras.Input((4,)), keras.layers.Dense(16, activation="tanh"),
                                 keras.layers.Dense(8, activation="gelu"), keras.layers.Dense(1)])
    converted = convert(original)
    histories = []
    for model in (original, converted):
        model.compile(optimizer=keras.optimizers.SGD(learning_rate=0.05), loss="mse")
        histories.append(model.fit(x, y, batch_size=16, epochs=4, shuffle=False, verbose=0).history["loss"])
    np.testing.assert_allclose(histories[1], histories[0], rtol=1e-4)
    assert histories[0][-1] < histories[0][0]
    for expected, actual in zip(original.get_weights(), converted.get_weights()):
        _assert_close(actual, expected, rtol=1e-4)


def test_config_weights_and_serialization_are_dense(rng):
    config = dict(activation="gelu", use_bias=True, kernel_regularizer="l2", bias_constraint="non_neg",
                  kernel_initializer="he_normal", name="ffn")
    dense, diet = _pair(rng, units=16, **config)
    assert diet.get_config() == dense.get_config()
    assert DietDense.from_config(diet.get_config()).get_config() == diet.get_config()
    assert [w.name for w in diet.weights] == ["kernel", "bias"] == [w.name for w in dense.weights]
    assert [w.path for w in diet.weights] == ["ffn/kernel", "ffn/bias"]
    serialized = keras.saving.serialize_keras_object(diet)
    assert serialized["registered_name"] == "tf_dietcode>DietDense"
    assert type(keras.saving.deserialize_keras_object(serialized)) is DietDense
    assert diet.bundle_path == "" and "bundle" not in str(diet.get_config())
    x = random_tensor(rng, (3, K))
    diet(x)
    _assert_close(sum(diet.losses), sum(dense.losses))  # the kernel regularizer works


def test_no_xla(rng):
    _, diet = _pair(rng)
    assert diet.supports_jit is False
    model = keras.Sequential([keras.Input((K,)), diet])
    with pytest.warns(UserWarning, match="jit_compile"):
        model.compile(loss="mse", jit_compile=True)
    assert model.jit_compile is False


def test_mask_passes_through(rng):
    ids = keras.Input((None,), dtype="int32")
    embedded = keras.layers.Embedding(10, K, mask_zero=True)(ids)
    pooled = keras.layers.GlobalAveragePooling1D()(keras.layers.Dense(UNITS, activation="relu")(embedded))
    original = keras.Model(ids, pooled)
    converted = convert(original)
    tokens = np.array([[3, 4, 0, 0], [5, 0, 0, 0], [1, 2, 3, 9]], np.int32)
    _assert_close(converted(tokens), original(tokens))
    embedding, diet = converted.layers[1], converted.layers[2]
    assert type(diet) is DietDense
    outputs = diet(embedding(tokens))
    np.testing.assert_array_equal(outputs._keras_mask, original.layers[2](original.layers[1](tokens))._keras_mask)
    np.testing.assert_array_equal(outputs._keras_mask, tokens != 0)
    assert not np.allclose(tf.reduce_mean(outputs, axis=1), converted(tokens))  # the pooling used the mask


def _dietdense_model():
    inputs = keras.Input((None, K), name="x")
    hidden = DietDense(16, activation="gelu")(inputs)
    return keras.Model(inputs, DietDense(4)(hidden))


def test_keras_file_round_trip(rng, tmp_path):
    model = _dietdense_model()
    x = random_tensor(rng, (2, 5, K))
    model.save(tmp_path / "model.keras")
    loaded = keras.saving.load_model(tmp_path / "model.keras")
    assert [type(layer) for layer in loaded.layers[1:]] == [DietDense, DietDense]
    np.testing.assert_array_equal(loaded(x), model(x))


SERVE = textwrap.dedent("""
    import sys
    import numpy as np
    import tensorflow as tf
    import tf_dietcode
    tf_dietcode.load_op_library()
    exported = tf.saved_model.load(sys.argv[1])   # kept: its variables die with it
    np.save(sys.argv[3], exported.serve(tf.constant(np.load(sys.argv[2]))).numpy())
""")


def test_export_serves_in_a_fresh_process(rng, tmp_path):
    model = _dietdense_model()
    model.export(str(tmp_path / "exported"), verbose=False)
    assert b"DietcodeFusedMatMul" in (tmp_path / "exported" / "saved_model.pb").read_bytes()
    x = random_tensor(rng, (3, 7, K))
    np.save(tmp_path / "x.npy", x)
    run = subprocess.run([sys.executable, "-c", SERVE, str(tmp_path / "exported"), str(tmp_path / "x.npy"),
                          str(tmp_path / "y.npy")], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    np.testing.assert_allclose(np.load(tmp_path / "y.npy"), model(x), rtol=1e-6, atol=1e-6)


def _transformer_block():
    inputs = keras.Input((None, 16))
    attended = keras.layers.MultiHeadAttention(num_heads=2, key_dim=8)(inputs, inputs)
    hidden = keras.layers.LayerNormalization()(keras.layers.Add()([inputs, attended]))
    ffn = keras.layers.Dense(16)(keras.layers.Dense(32, activation="gelu")(hidden))
    return keras.Model(inputs, keras.layers.LayerNormalization()(keras.layers.Add()([hidden, ffn])))


def test_convert_a_transformer_block(rng):
    keras.utils.set_random_seed(int(rng.integers(2**31)))
    original = _transformer_block()
    for norm in [layer for layer in original.layers if isinstance(layer, keras.layers.LayerNormalization)]:
        norm.set_weights([random_tensor(rng, w.shape) for w in norm.weights])  # not the 1/0 defaults
    before = [w.copy() for w in original.get_weights()]
    converted = convert(original)
    assert [type(layer).__name__ for layer in original.layers].count("Dense") == 2
    assert [type(layer) for layer in converted.layers].count(DietDense) == 2
    assert keras.layers.Dense not in [type(layer) for layer in converted.layers]
    for x in (original.get_weights(), converted.get_weights()):
        assert all(np.array_equal(a, b) for a, b in zip(before, x, strict=True))
    for length in (1, 7, 16):
        x = random_tensor(rng, (2, length, 16))
        _assert_close(converted(x), original(x))
    ffn_out = [layer for layer in converted.layers if type(layer) is DietDense][-1]
    ffn_out.kernel.assign(tf.zeros_like(ffn_out.kernel))
    assert all(np.array_equal(a, b) for a, b in zip(before, original.get_weights()))  # no shared variables


def test_convert_nested_models_and_keeps_dense_subclasses(rng):
    class MyDense(keras.layers.Dense):
        pass

    inner = keras.Sequential([keras.Input((K,)), keras.layers.Dense(4, activation="relu")])
    inputs = keras.Input((K,))
    original = keras.Model(inputs, MyDense(3)(inner(inputs)))
    converted = convert(original)
    assert type(converted.layers[1].layers[0]) is DietDense
    assert type(converted.layers[2]) is MyDense
    x = random_tensor(rng, (5, K))
    _assert_close(converted(x), original(x))


def test_convert_refuses_a_subclassed_model():
    class Model(keras.Model):
        def __init__(self):
            super().__init__()
            self.dense = keras.layers.Dense(3)

        def call(self, x):
            return self.dense(x)

    with pytest.raises(TypeError, match="Functional or Sequential model, got Model"):
        convert(Model())


def test_bad_input_is_a_clear_error(rng):
    _, diet = _pair(rng)
    with pytest.raises(ValueError, match="expected axis -1 of input shape to have value 8"):
        diet(np.zeros((2, 5), np.float32))
    dynamic = tf.function(diet, input_signature=[tf.TensorSpec([None, None], tf.float32)])
    with pytest.raises(tf.errors.InvalidArgumentError, match="contraction dims differ"):
        dynamic(np.zeros((3, 16), np.float32))     # as many elements as [6, 8]: must not reshape silently


def test_activation_none_set_after_construction_is_linear(rng):
    dense, diet = _pair(rng, activation="relu")
    dense.activation = diet.activation = None   # Dense's call skips a None activation
    x = random_tensor(rng, (4, K))
    _assert_close(diet(x), dense(x))


def test_package_attribute():
    assert tf_dietcode.__getattr__("keras") is tf_dietcode.keras
    assert tf_dietcode.keras.DietDense is DietDense
