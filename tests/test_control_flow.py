"""Models with loops: bounded by a scalar input or by the data, nested, holding conds or ops the
rewriter does not know. optimize() never fails on them: it fuses the top-level graph and the
loops' and conds' bodies (graph_rewrite.bodies; tuned bodies: test_loop_bodies.py), and saves a
model whose outputs are the original's. (A cond and an XLA function at the top level: test_optimize.py.)"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import tf_dietcode
from tf_dietcode import cli
from tf_dietcode.graph_rewrite import loop_invariants
from tf_dietcode.graph_rewrite.analysis import signature_graph
from tf_dietcode.tuning import search

from conftest import TINY_TUNING_OPTIONS, TUNING_DATABASE, shared_database

TINY_TUNING = search.SearchOptions(**TINY_TUNING_OPTIONS)
VOCAB, WIDTH, START, END = 50, 16, 1, 2
TOKEN_RANGES = {"tokens": [(1, 8), (1, 64)]}


class Translator(tf.Module):
    """A greedy Transformer translator written as TF's NMT tutorial writes its export: the
    source encoded once, then a loop over a TensorArray of ids that runs the decoder on the
    prefix and appends the argmax of its last position, stopping early at END."""

    def __init__(self):
        super().__init__()
        keras.utils.set_random_seed(0)
        self.source_embedding = keras.layers.Embedding(VOCAB, WIDTH)
        self.encoder_attention = keras.layers.MultiHeadAttention(num_heads=2, key_dim=8)
        self.encoder_norm = keras.layers.LayerNormalization()
        self.encoder_ffn = keras.Sequential([keras.layers.Dense(32, activation="relu"), keras.layers.Dense(WIDTH)])
        self.target_embedding = keras.layers.Embedding(VOCAB, WIDTH)
        self.self_attention = keras.layers.MultiHeadAttention(num_heads=2, key_dim=8)
        self.cross_attention = keras.layers.MultiHeadAttention(num_heads=2, key_dim=8)
        self.decoder_ffn = keras.layers.Dense(32, activation="relu")
        self.logits = keras.layers.Dense(VOCAB)
        self._decode(tf.zeros([1, 2], tf.int32), self._encode(tf.zeros([1, 3], tf.int32)))  # builds the layers

    def _encode(self, tokens):
        x = self.source_embedding(tokens)
        x = self.encoder_norm(x + self.encoder_attention(x, x))
        return x + self.encoder_ffn(x)

    def _decode(self, prefix, memory):
        x = self.target_embedding(prefix)
        x = x + self.self_attention(x, x, use_causal_mask=True)
        x = x + self.cross_attention(x, memory)
        return self.logits(self.decoder_ffn(x))

    @tf.function(input_signature=[tf.TensorSpec([None, None], tf.int32, name="tokens"),
                                  tf.TensorSpec([], tf.int32, name="max_len")])
    def translate(self, tokens, max_len):
        memory = self._encode(tokens)
        ids = tf.TensorArray(tf.int32, size=0, dynamic_size=True)
        ids = ids.write(0, tf.fill([tf.shape(tokens)[0]], START))
        for i in tf.range(max_len):
            prefix = tf.transpose(ids.stack())
            predicted = tf.argmax(self._decode(prefix, memory)[:, -1, :], axis=-1, output_type=tf.int32)
            ids = ids.write(i + 1, predicted)
            if tf.reduce_all(predicted == END):
                break
        return {"ids": tf.transpose(ids.stack())}


@pytest.fixture(scope="module")
def translator(tmp_path_factory):
    """The translator saved with tf.saved_model.save, as the tutorial exports it: (directory, module)."""
    path = tmp_path_factory.mktemp("translator") / "original"
    module = Translator()
    tf.saved_model.save(module, str(path), signatures={"serving_default": module.translate})
    return path, module


def _assert_same_translations(optimized_dir, module, rng):
    optimized = tf.saved_model.load(str(optimized_dir)).signatures["serving_default"]
    for shape, max_len in [((1, 1), 4), ((2, 5), 7), ((3, 17), 0), ((8, 64), 9), ((2, 70), 3)]:
        tokens = rng.integers(3, VOCAB, shape).astype(np.int32)
        expected = module.translate(tokens, tf.constant(max_len))["ids"].numpy()
        np.testing.assert_array_equal(optimized(tokens=tokens, max_len=tf.constant(max_len))["ids"], expected)


def test_a_tutorial_style_translator_has_its_encoder_and_its_decoding_loop_fused(translator, tmp_path, rng):
    path, module = translator
    report = tf_dietcode.optimize(path, tmp_path / "out", shape_ranges=TOKEN_RANGES, tuning=TINY_TUNING,
                                  database=shared_database())
    # the encoder (outside the loop): 4 projections, 2 attention products, the layer norm, the softmax, the FFN;
    # the decoder (in the loop's body): 10 dense layers, 4 attention products, 2 softmaxes, of which the
    # cross-attention's key and value projections of the encoder's output (the same each step) run before the loop
    assert report.fused == report.found and sum(report.fused.values()) == 10 + 16, report.summary()
    in_body = [layer for layer in report.layers if layer["where"]]
    assert len(in_body) == 14 and all(layer["where"].startswith("while body ") for layer in in_body)
    hoisted = [layer for layer in report.layers if not layer["where"] and "/hoisted/" in layer["node"]]
    assert len(hoisted) == 2 and all(layer["workload"] for layer in hoisted), hoisted
    assert not [note for note in report.notes if "left to TF" in note], report.notes
    # max_len has no range: 0 on zero inputs, the loop never ran and its length is unknown, so the products on
    # the prefix run the generic kernel, and the report says so; the cross-attention's keys and values (B x S
    # rows of the encoder's output, before the loop) are sized from the signature's shapes
    (unsized,) = [note for note in report.notes if "did not run when optimize() ran the model" in note]
    assert "generic kernel" in unsized and "input_fn" in unsized and "(here max_len)" in unsized, unsized
    assert all(layer["workload"] is None for layer in in_body), in_body
    assert [layer["workload"] for layer in hoisted] == ["dense M=1..512 N=16 K=16 bias=True none"] * 2, hoisted
    assert "serving_default.max_len: scalar" in report.summary()
    _assert_same_translations(tmp_path / "out", module, rng)


def test_the_translator_through_the_command_line(translator, tmp_path, capsys, rng):
    """The command a new user runs on the tutorial's export, max_len given a range of values (a bad one is
    refused clearly): the loop's products are tuned from its bound."""
    path, module = translator
    arguments = ["optimize", "--dir", str(path), "--output_dir", str(tmp_path / "out"),
                 "--shape_range", "tokens=1:8,1:64", "--quick", "--trials", "2", "--db", str(TUNING_DATABASE)]
    assert cli.main([*arguments, "--shape_range", "max_len=9:3"]) == 2
    assert "needs 0 <= min <= max, got (9, 3)" in capsys.readouterr().err and not (tmp_path / "out").exists()
    assert cli.main([*arguments, "--shape_range", "max_len=1:12"]) == 0
    printed = capsys.readouterr().out
    assert "did not run" not in printed and "sized from what the loop proves" in printed, printed
    assert "serving_default.max_len: 1..12" in printed and "batch matmul NT B=2..16 M=1..12 N=1..12" in printed
    _assert_same_translations(tmp_path / "out", module, rng)


def _dense_in(rng):
    """x[?, 16] -> relu(x @ w + b)[?, 24]: the fusable layer before each loop below."""
    weight, bias = rng.uniform(-1, 1, (16, 24)).astype(np.float32), rng.uniform(-1, 1, 24).astype(np.float32)
    return lambda x: tf.nn.relu(tf.matmul(x, weight) + bias)


def _contraction(rng, n=24):
    """A weight of spectral norm 1: tanh(h @ w) never grows h."""
    weight = rng.uniform(-1, 1, (n, n))
    return (weight / np.linalg.norm(weight, 2)).astype(np.float32)


def _unbounded_loop(rng):
    """tf.while_loop whose trip count follows the data; a dense layer reads its result."""
    dense_in, w, w_out = _dense_in(rng), _contraction(rng), rng.uniform(-1, 1, (24, 8)).astype(np.float32)

    def serve(x):
        steps, h = tf.while_loop(lambda i, h: tf.reduce_max(tf.abs(h)) > 1e-3,
                                 lambda i, h: (i + 1, 0.5 * tf.tanh(tf.matmul(h, w))), (0, dense_in(x)))
        return {"out": tf.matmul(h, w_out), "steps": steps}
    return serve, [], ["while body"]


def _cond_in_loop(rng):
    dense_in, w = _dense_in(rng), _contraction(rng)

    def serve(x, steps):
        h = dense_in(x)
        for _ in tf.range(steps):
            h = tf.cond(tf.reduce_sum(h) > 0, lambda: tf.tanh(tf.matmul(h, w)), lambda: 1.0 - h)
        return {"out": h}
    return serve, [tf.TensorSpec([], tf.int32, name="steps")], ["cond true branch", ", in while body"]


def _loop_in_loop(rng):
    dense_in, w, w_inner = _dense_in(rng), _contraction(rng), _contraction(rng)

    def serve(x, steps):
        h = dense_in(x)
        for i in tf.range(steps):
            h = tf.tanh(tf.matmul(h, w))
            for _ in tf.range(i):
                h = tf.tanh(tf.matmul(h, w_inner) + 0.5)
        return {"out": h}
    return serve, [tf.TensorSpec([], tf.int32, name="steps")], ["while body", ", in while body"]


def _unknown_ops_in_loop(rng):
    """String ops and a raw op the rewriter has no pattern for, beside a product, in the loop's body."""
    dense_in, w = _dense_in(rng), _contraction(rng)

    def serve(x, steps):
        h, log = dense_in(x), tf.constant("")
        for i in tf.range(steps):
            h = tf.raw_ops.CheckNumerics(tensor=tf.tanh(tf.matmul(h, w)), message="h")
            log = tf.strings.join([log, tf.strings.as_string(i * tf.strings.length(log))], separator=";")
        return {"out": h, "log": log}
    return serve, [tf.TensorSpec([], tf.int32, name="steps")], ["while body"]


@pytest.mark.parametrize("model", [_unbounded_loop, _cond_in_loop, _loop_in_loop, _unknown_ops_in_loop])
def test_the_products_in_loops_are_fused_and_outputs_kept(model, tmp_path, rng):
    serve, scalars, where = model(rng)
    module = tf.Module()
    module.serve = tf.function(serve, input_signature=[tf.TensorSpec([None, 16], tf.float32, name="x"), *scalars])
    tf.saved_model.save(module, str(tmp_path / "in"), signatures={"serving_default": module.serve})
    report = tf_dietcode.optimize(tmp_path / "in", tmp_path / "out", shape_ranges={"x": [(1, 9), 16]},
                                  tuning=TINY_TUNING, database=shared_database())
    assert report.fused == report.found and report.workloads, report.summary()  # the dense layer before the loop
    assert not [note for note in report.notes if "left to TF" in note], report.notes
    in_bodies = [layer["where"] for layer in report.layers if layer["where"]]
    assert in_bodies and all(any(text in w for w in in_bodies) for text in where), in_bodies
    optimized = tf.saved_model.load(str(tmp_path / "out")).signatures["serving_default"]
    for rows, steps in [(1, 3), (5, 0), (9, 5), (12, 2)]:
        inputs = {"x": rng.uniform(-1, 1, (rows, 16)).astype(np.float32)}
        inputs.update({"steps": tf.constant(steps)} if scalars else {})
        expected, actual = module.serve(**inputs), optimized(**inputs)
        for name, value in expected.items():
            if value.dtype.is_floating:
                np.testing.assert_allclose(actual[name], value, rtol=1e-5, atol=1e-5)
            else:
                np.testing.assert_array_equal(actual[name], value)


def test_finding_the_calls_left_running_leaves_the_graph_as_it_was():
    looped = tf.function(lambda x: {"out": tf.while_loop(lambda h: tf.reduce_sum(h) < 9.0,
                                                         lambda h: tf.matmul(h, h) + 1.0, [x])[0]})
    function = looped.get_concrete_function(tf.TensorSpec([2, 2], tf.float32, name="x"))
    graph = signature_graph.from_signature("serving_default", function)
    before = graph.graph_def.SerializeToString(deterministic=True)
    (call,) = signature_graph.calls_left_running(graph.graph_def, {"MatMul"})
    assert not call.xla and list(call.ops.values()) == [{"MatMul": 1}]
    assert graph.graph_def.SerializeToString(deterministic=True) == before


def test_convert_leaves_the_graphs_the_rewrite_starts_from_as_inlined(translator):
    """Every fusion kind and the shape analysis read the translator's graph (as inlined, its loop's
    invariant products moved out); none may write into it (an attr a lookup added once made the saved
    signature fail to run)."""
    path, _ = translator
    converter = tf_dietcode.Converter(path, shape_ranges=TOKEN_RANGES).convert()
    assert sum(converter.report.found.values()) == 10 + 16
    fresh = signature_graph.from_signature("serving_default", converter.loaded.signatures["serving_default"])
    resources = signature_graph.resources_of(converter.loaded)
    hoisted, _ = loop_invariants.hoist(fresh, signature_graph.captured_values(fresh, resources))
    assert converter.graphs[0].graph_def == hoisted.graph_def


@pytest.mark.parametrize("given, expected", [([20], [(20, 20)]), (20, [(20, 20)]), ([(1, 9)], [(1, 9)]), ([], [])])
def test_a_scalar_input_takes_a_range_of_values(translator, given, expected):
    """(bad ones: test_loop_ranges.py)"""
    path, _ = translator
    assert tf_dietcode.Converter(path, shape_ranges={**TOKEN_RANGES, "max_len": given}).convert().ranges[
        "serving_default"]["max_len"] == expected
