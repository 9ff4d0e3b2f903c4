"""Products inside loops' bodies, fused and tuned: the tutorial-style greedy translator (a
TensorArray loop re-running the decoder on the prefix) sized from its bound, max_len ranging over
input_fn's values, a loop with shape invariants sized from its bounds (more loops without input_fn:
test_loop_ranges.py), a weight whose variable cannot be followed out of the loop; the written model's functions hold the fused ops and no copies of the
weights, and it serves in a fresh process that loads only the op library."""

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.protobuf import saved_model_pb2

import tf_dietcode
from bench import decoders
from tf_dietcode import op_library

from conftest import shared_database
from test_control_flow import END, START, TINY_TUNING, TOKEN_RANGES, VOCAB, Translator

PRODUCTS = {"MatMul", "BatchMatMulV2", "Einsum"}


class ScoringTranslator(Translator):
    """The translator returning each step's logits too (a float TensorArray beside the ids')."""

    @tf.function(input_signature=[tf.TensorSpec([None, None], tf.int32, name="tokens"),
                                  tf.TensorSpec([], tf.int32, name="max_len")])
    def translate(self, tokens, max_len):
        return decoders.greedy_decoding(self._decode, self._encode(tokens), max_len, VOCAB, START, END)


def _inputs(rng, shapes_and_lengths):
    return [{"tokens": rng.integers(3, VOCAB, shape).astype(np.int32), "max_len": np.int32(max_len)}
            for shape, max_len in shapes_and_lengths]


@pytest.fixture(scope="module")
def optimized_translator(tmp_path_factory):
    """(original module, optimized directory, report): optimized with input_fn's inputs, on which the loop runs."""
    directory = tmp_path_factory.mktemp("scoring_translator")
    module = ScoringTranslator()
    tf.saved_model.save(module, str(directory / "original"), signatures={"serving_default": module.translate})
    examples = _inputs(np.random.default_rng(1), [((1, 1), 1), ((8, 64), 12), ((3, 17), 6), ((8, 1), 12)])
    report = tf_dietcode.optimize(directory / "original", directory / "optimized", shape_ranges=TOKEN_RANGES,
                                  input_fn=lambda: iter(examples), tuning=TINY_TUNING, database=shared_database())
    return module, directory / "optimized", report


def test_every_product_in_the_translators_loop_is_fused_and_tuned(optimized_translator):
    _, _, report = optimized_translator
    assert report.fused == report.found, report.summary()
    in_body = [layer for layer in report.layers if layer["where"]]
    products = [layer for layer in in_body if layer["kind"] in ("dense", "attention")]
    assert len(products) == 12 and all(layer["where"].startswith("while body ") for layer in in_body)
    assert all(layer["workload"] for layer in products), [layer for layer in products if not layer["workload"]]
    # the decoder runs on a prefix one token longer each step: 1..12 tokens (max_len 12) for 1..8 sentences
    assert any("dense M=1..96 N=32 K=16 bias=True relu" == layer["workload"] for layer in products), products
    assert any(layer["workload"].startswith("batch matmul NT B=2..16 M=1..12 N=1..12") for layer in products)
    # the cross-attention's keys and values: the encoder's output, B x S rows, the same in every step: computed
    # once before the loop, as layers of the signature's graph
    hoisted = [layer for layer in report.layers if not layer["where"] and "/hoisted/" in layer["node"]]
    assert [layer["workload"] for layer in hoisted] == ["dense M=1..512 N=16 K=16 bias=True none"] * 2, hoisted
    assert not [note for note in report.notes if "left to TF" in note or "did not run" in note], report.notes
    assert report.coverage.share == 1.0 and report.coverage.not_counted == [], report.coverage
    # sized from the loop: its bound max_len ranges over input_fn's values, 1..12
    assert f"(derived in {in_body[0]['where']}: " in report.summary() and "max_len in 1..12" in report.summary()


def _saved_functions(directory):
    saved = saved_model_pb2.SavedModel()
    saved.ParseFromString((directory / "saved_model.pb").read_bytes())
    return {f.signature.name: f for f in saved.meta_graphs[0].graph_def.library.function}


def test_the_written_loop_body_runs_the_fused_ops_and_holds_no_weights(optimized_translator):
    _, directory, _ = optimized_translator
    functions = _saved_functions(directory)
    loops = [node for f in functions.values() for node in f.node_def if node.op in ("While", "StatelessWhile")]
    bodies = {node.attr["body"].func.name for node in loops}
    assert bodies, sorted(functions)
    for name in bodies:
        ops = {node.op for node in functions[name].node_def}
        assert {"DietcodeFusedMatMul", "DietcodeSoftmax"} <= ops and ops & {"DietcodeFusedBatchMatMulAdd",
                                                                           "DietcodeFusedBatchMatMulTranspose"}
        assert not ops & PRODUCTS, ops & PRODUCTS
        sizes = [np.prod([d.size for d in node.attr["value"].tensor.tensor_shape.dim])
                 for node in functions[name].node_def if node.op == "Const"]
        assert max(sizes, default=0) < 64  # packed weights are variables threaded in, not constants


def test_the_optimized_translator_translates_as_the_original(optimized_translator, rng):
    module, directory, _ = optimized_translator
    optimized = tf.saved_model.load(str(directory)).signatures["serving_default"]
    for example in _inputs(rng, [((1, 1), 4), ((2, 5), 13), ((3, 17), 2), ((8, 64), 12), ((1, 64), 20),
                                 ((5, 33), 1), ((8, 8), 7)]):
        expected = module.translate(**example)
        actual = optimized(tokens=example["tokens"], max_len=tf.constant(example["max_len"]))
        np.testing.assert_array_equal(actual["ids"], expected["ids"])
        np.testing.assert_allclose(actual["logits"], expected["logits"], rtol=1e-4, atol=1e-5)


LOADER = textwrap.dedent("""
    import sys
    import numpy as np
    import tensorflow as tf
    tf.load_op_library(sys.argv[1])
    serve = tf.saved_model.load(sys.argv[2]).signatures["serving_default"]
    inputs = np.load(sys.argv[3])
    outputs = {}
    for i in range(len(inputs.files) // 2):
        result = serve(tokens=tf.constant(inputs[f"tokens{i}"]), max_len=tf.constant(inputs[f"max_len{i}"]))
        outputs.update({f"{key}{i}": value.numpy() for key, value in result.items()})
    np.savez(sys.argv[4], **outputs)
""")


def test_the_optimized_translator_serves_in_a_fresh_process(optimized_translator, rng, tmp_path):
    module, directory, _ = optimized_translator
    inputs, expected = {}, {}
    for i, example in enumerate(_inputs(rng, [((1, 3), 5), ((8, 40), 12), ((2, 64), 9)])):
        inputs.update({f"{name}{i}": value for name, value in example.items()})
        expected.update({f"{key}{i}": value.numpy() for key, value in module.translate(**example).items()})
    np.savez(tmp_path / "inputs.npz", **inputs)
    subprocess.run([sys.executable, "-c", LOADER, str(op_library.LIBRARY_PATH), str(directory),
                    str(tmp_path / "inputs.npz"), str(tmp_path / "outputs.npz")],
                   check=True, timeout=300, cwd=tmp_path, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    outputs = np.load(tmp_path / "outputs.npz")
    for key, value in expected.items():
        if key.startswith("ids"):
            np.testing.assert_array_equal(outputs[key], value)
        else:
            np.testing.assert_allclose(outputs[key], value, rtol=1e-4, atol=1e-5)


def test_a_loop_with_shape_invariants_is_tuned_from_the_corners(tmp_path, rng):
    """A loop growing a tensor one row per step (shape invariants [None, 24], at most 12 steps and
    as many as x has rows, 3 in parallel): its dense layer is sized from the loop's bounds, as the
    runs at the corners saw it too."""
    weight, bias = rng.uniform(-0.3, 0.3, (24, 24)).astype(np.float32), rng.uniform(-1, 1, 24).astype(np.float32)
    first = rng.uniform(-1, 1, (16, 24)).astype(np.float32)

    def serve(x):
        def body(i, grown):
            return i + 1, tf.concat([grown, tf.nn.relu(tf.matmul(grown, weight) + bias)[-1:]], 0)
        _, grown = tf.while_loop(lambda i, grown: i < tf.shape(x)[0], body, (0, tf.matmul(x[:1], first)),
                                 shape_invariants=(tf.TensorShape([]), tf.TensorShape([None, 24])),
                                 maximum_iterations=12, parallel_iterations=3)
        return {"out": grown}

    module = tf.Module()
    module.serve = tf.function(serve, input_signature=[tf.TensorSpec([None, 16], tf.float32, name="x")])
    tf.saved_model.save(module, str(tmp_path / "in"), signatures={"serving_default": module.serve})
    report = tf_dietcode.optimize(tmp_path / "in", tmp_path / "out", shape_ranges={"x": [(1, 9), 16]},
                                  tuning=TINY_TUNING, database=shared_database())
    (looped,) = [layer for layer in report.layers if layer["where"]]
    assert looped["workload"] == "dense M=1..9 N=24 K=24 bias=True relu", report.summary()
    assert "at most 9 iterations" in report.summary() and "outside the" not in report.summary()
    loops = [node for f in _saved_functions(tmp_path / "out").values() for node in f.node_def
             if node.op in ("While", "StatelessWhile")]
    assert loops and all(node.attr["parallel_iterations"].i == 3 for node in loops)
    optimized = tf.saved_model.load(str(tmp_path / "out")).signatures["serving_default"]
    for rows in (1, 2, 9, 13, 20):  # beyond 12 rows the loop stops at maximum_iterations
        x = rng.uniform(-1, 1, (rows, 16)).astype(np.float32)
        np.testing.assert_allclose(optimized(x=x)["out"], module.serve(x)["out"], rtol=1e-5, atol=1e-5)


def test_a_weight_whose_variable_cannot_be_followed_out_of_the_loop_is_left_to_tf(tmp_path, rng):
    """The loop reads whichever of two variables a cond picks: its value is not known at optimize
    time, so that product stays TF's, named in the report; the rest is fused."""
    module = tf.Module()
    module.first = tf.Variable(rng.uniform(-0.3, 0.3, (8, 8)).astype(np.float32))
    module.second = tf.Variable(rng.uniform(-0.3, 0.3, (8, 8)).astype(np.float32))
    fixed = rng.uniform(-0.3, 0.3, (8, 8)).astype(np.float32)

    def serve(x, steps):
        handle = tf.cond(steps > 2, lambda: module.first.handle, lambda: module.second.handle)
        for _ in tf.range(steps):
            weight = tf.raw_ops.ReadVariableOp(resource=handle, dtype=tf.float32)
            weight.set_shape([8, 8])
            x = tf.tanh(tf.matmul(tf.matmul(x, weight), fixed))
        return {"out": x}

    module.serve = tf.function(serve, input_signature=[tf.TensorSpec([None, 8], tf.float32, name="x"),
                                                       tf.TensorSpec([], tf.int32, name="steps")])
    tf.saved_model.save(module, str(tmp_path / "in"), signatures={"serving_default": module.serve})
    report = tf_dietcode.optimize(tmp_path / "in", tmp_path / "out", shape_ranges={"x": [(1, 9), 8]},
                                  tuning=TINY_TUNING, database=shared_database())
    (left,) = [p for p in report.left_alone if "does not lead to a variable the signature captures" in p.reason]
    assert "while body" in left.node, left
    assert report.fused["matmul"] == 1 and any("left to TF" in note and "1 MatMul" in note for note in report.notes)
    optimized = tf.saved_model.load(str(tmp_path / "out")).signatures["serving_default"]
    for rows, steps in [(1, 1), (4, 3), (9, 5)]:
        x = rng.uniform(-1, 1, (rows, 8)).astype(np.float32)
        np.testing.assert_allclose(optimized(x=x, steps=tf.constant(steps))["out"],
                                   module.serve(x, tf.constant(steps))["out"], rtol=1e-5, atol=1e-5)
