"""optimize() on a Keras 3 encoder block exported as a SavedModel: every dense
form is fused, outputs match the original in a fresh process (in and outside
the tuned range, every signature), and bad input fails clearly with nothing
written."""

import dataclasses
import json
import shutil
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf

import tf_dietcode
from tf_dietcode import serving_warmup
from tf_dietcode.tuning import hardware, search
from tf_dietcode.tuning.workload import DimRange

import tuned_calls
from conftest import ENCODER_RANGES, TEXT_MODELS, TINY_TUNING_OPTIONS, save_dense_model, shared_database

TINY_TUNING = search.SearchOptions(**TINY_TUNING_OPTIONS)
# Four dynamic dims: with 3 samples each a kernel is timed at 81 shapes (about 55 s a test); the
# range ends alone are 16, and the bundle is still checked at ends, samples and random shapes.
ENDS_TUNING = search.SearchOptions(**{**TINY_TUNING_OPTIONS, "samples": 2})


def test_every_dense_form_is_found_and_fused(optimized_encoder):
    _, report = optimized_encoder
    assert report.signatures == ["serve", "serving_default"]
    # per signature: 2 tensordot (Dense on 3-D), 4 einsum (Q, K, V, attention output), 1 matmul (Dense on
    # 2-D), attention's 2 products of computed operands (scores, context), its softmax and the layer norm
    assert dict(report.found) == {"tensordot": 4, "einsum": 8, "matmul": 2, "attention (einsum)": 4,
                                  "layer norm": 2, "softmax": 2}
    assert report.fused == report.found
    dense = [w for w in report.workloads if w.kind == "dense"]
    # Q/K/V read the same input: one GEMM over their weights side by side (N = 3 x 32)
    assert sorted((w.activation, w.n.lo, w.k.lo) for w in dense) == [
        ("gelu", 64, 32), ("none", 32, 32), ("none", 32, 64), ("none", 96, 32), ("relu", 8, 32)]
    assert report.merged == (6, 2) and "6 GEMMs sharing an input merged into 2" in report.summary()
    assert {w.m.hi for w in dense} == {24, 2}     # 2 x 12 rows, and 2 rows after the slice
    assert not any(w.cold_weight for w in dense)  # a few KiB of weights stay cached between calls
    # Attention's products over batch x heads = 2..4: scores [T, 16] x [T, 16]^T, context [T, T] x [T, 16]
    products = {(w.transpose_b, w.b, w.m, w.n, w.k, w.ties) for w in report.workloads if w.kind == "batch_matmul"}
    assert products == {(True, DimRange(2, 4), DimRange(1, 12), DimRange(1, 12), DimRange(16, 16), ("m", "n")),
                        (False, DimRange(2, 4), DimRange(1, 12), DimRange(16, 16), DimRange(1, 12), ("m", "k"))}
    assert "dense (einsum): 8 / 8" in report.summary() and "attention (einsum): 4 / 4" in report.summary()
    assert "  layer norm: 2 / 2" in report.summary() and "  softmax: 2 / 2" in report.summary()
    # every dim from the graph's own shapes (graph_rewrite.analysis.symbolic_shapes), none by running the model
    assert sorted(set(report.dims.values())) == ["B = 2*x[0], M = x[1], K = x[1]", "B = 2*x[0], M = x[1], N = x[1]",
                                                 "M = x[0]", "M = x[0]*x[1]"]
    assert set(report.dims) == set(report.workloads) and "(M = x[0]*x[1])" in report.summary()


FRESH_PROCESS = """
import json, sys
import keras
import numpy as np
import tensorflow as tf
tf.load_op_library(sys.argv[1])
model = tf.saved_model.load(sys.argv[2])
inputs = np.load(sys.argv[3])
print(json.dumps({key: {str(t): model.signatures[key](x=inputs[str(t)])["output_0"].numpy().tolist()
                        for t in json.loads(sys.argv[4])} for key in ("serve", "serving_default")}))
"""


def test_moved_output_in_a_fresh_process_matches_the_original(optimized_encoder, rng):
    root, _ = optimized_encoder
    moved = root / "moved"
    shutil.copytree(root / "optimized", moved)
    lengths = [1, 2, 7, 12, 13, 30]  # 13 and 30 are outside the tuned range: the generic kernel
    inputs = {str(t): rng.uniform(-1, 1, (2, t, 32)).astype(np.float32) for t in lengths}
    np.savez(root / "inputs.npz", **inputs)
    from tf_dietcode.op_library import LIBRARY_PATH

    result = subprocess.run([sys.executable, "-c", FRESH_PROCESS, str(LIBRARY_PATH), str(moved),
                             str(root / "inputs.npz"), json.dumps(lengths)],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    outputs = json.loads(result.stdout.strip().splitlines()[-1])
    original = tf.saved_model.load(str(root / "original"))
    for key in ("serve", "serving_default"):
        for t in lengths:
            expected = original.signatures[key](x=inputs[str(t)])["output_0"].numpy()
            np.testing.assert_allclose(outputs[key][str(t)], expected, rtol=1e-5, atol=1e-5 * np.abs(expected).max())


def test_the_optimized_model_runs_tuned_kernels(optimized_encoder):
    root, _ = optimized_encoder
    model = tf.saved_model.load(str(root / "optimized"))
    manifest = next((root / "optimized" / "assets").glob("*.json"))
    before, generic_before = tuned_calls.calls(manifest)   # also checks the bundle has no problem
    model.signatures["serving_default"](x=np.ones((2, 5, 32), np.float32))
    after, generic_after = tuned_calls.calls(manifest)
    assert generic_after == generic_before
    assert sum(after.values()) - sum(before.values()) == 7  # 4 dense GEMMs (Q/K/V as one), 2 products
    variables = {id(v): v for v in tf.train.TrackableView(model).descendants() if isinstance(v, tf.Variable)}
    # every weight in one float32 variable (graph_rewrite/weight_arena.py), shared by both signatures
    assert [v.name for v in variables.values() if v.name.startswith("dietcode_weight")] == ["dietcode_weights_float32:0"]
    for signature in (model.signatures[key] for key in ("serve", "serving_default")):
        assert len(signature.captured_inputs) <= 3  # the weights, the bundle, a vector of 8 floats


@pytest.mark.parametrize("arguments,error,match", [
    ({"shape_ranges": {"y": [1, 1, 32]}}, ValueError, "unknown input"),
    ({"shape_ranges": {"x": [1, (5, 2), 32]}}, ValueError, "min <= max"),
    ({"shape_ranges": {"x": [1, 2]}}, ValueError, "rank 3"),
    ({"shape_ranges": {"x": [1, 2, 16]}}, ValueError, "is 32 in the signature"),
    ({"signature_keys": ["nope"]}, ValueError, "unknown signature"),
    ({"tags": ["train"]}, ValueError, "cannot load"),
])
def test_bad_arguments_fail_clearly_and_write_nothing(optimized_encoder, tmp_path, arguments, error, match):
    root, _ = optimized_encoder
    before = sorted(p.name for p in (root / "original").rglob("*"))
    with pytest.raises(error, match=match):
        tf_dietcode.optimize(root / "original", tmp_path / "out", tuning=TINY_TUNING, **arguments)
    assert not (tmp_path / "out").exists() and list(tmp_path.iterdir()) == []
    assert sorted(p.name for p in (root / "original").rglob("*")) == before


def test_not_a_saved_model_and_existing_output(optimized_encoder, tmp_path, monkeypatch):
    """Both are refused before any work: a user who forgot overwrite=True does not wait for the tuning."""
    root, _ = optimized_encoder
    monkeypatch.setattr(tf_dietcode.Converter, "convert", lambda self: pytest.fail("converted before refusing"))
    with pytest.raises(ValueError, match="not a SavedModel"):
        tf_dietcode.optimize(tmp_path, tmp_path / "out")
    with pytest.raises(FileExistsError, match="overwrite=True"):
        tf_dietcode.optimize(root / "original", root / "optimized", shape_ranges=ENCODER_RANGES, tuning=TINY_TUNING)


def test_an_input_of_unknown_rank_takes_its_dims_from_shape_ranges(tmp_path, rng):
    weight = rng.uniform(-1, 1, (16, 8)).astype(np.float32)
    module = tf.Module()
    module.serve = tf.function(lambda x: {"out": tf.matmul(tf.reshape(x, [-1, 16]), weight)},
                               input_signature=[tf.TensorSpec(None, tf.float32, name="x")])
    tf.saved_model.save(module, str(tmp_path / "in"), signatures={"serving_default": module.serve})
    with pytest.raises(ValueError, match="'x' has unknown rank in the signature: give its dims in shape_ranges"):
        tf_dietcode.optimize(tmp_path / "in", tmp_path / "out", tuning=TINY_TUNING)
    report = tf_dietcode.optimize(tmp_path / "in", tmp_path / "out", tuning=TINY_TUNING, database=shared_database(),
                                  shape_ranges={"x": [(1, 9), 16]})
    assert [report.dims[w] for w in report.workloads] == ["M = x[0]"] and report.warmup_requests == 4
    optimized = tf.saved_model.load(str(tmp_path / "out")).signatures["serving_default"]
    for shape in [(1, 16), (9, 16), (12, 16), (0, 16)]:
        x = rng.uniform(-1, 1, shape).astype(np.float32)
        np.testing.assert_allclose(optimized(x=x)["out"], module.serve(x)["out"], rtol=1e-5, atol=1e-5)


def _operand_scaled(equation, a, b):
    return tf.einsum(equation, a * 0.125, b)


def _product_scaled(equation, a, b):  # Keras 3's MultiHeadAttention scales its scores so
    return tf.einsum(equation, a, b) * 0.125


T, S = (1, 8), (1, 8)  # attention's lengths


# Every dim is dynamic in the signatures. Attention's products are tuned for their lengths only (a quick tuning
# of all four dims times 16 corners and compiles K's small sizes: 74-93 s a case on a 2-core Zen 3); NN is tuned for
# its matrix dims, a dynamic reduction among them (all four dims took it 196 s on a 2-vCPU Xeon with AVX-512), and
# the transposed one for every dim.
@pytest.mark.parametrize("equation,lhs,rhs,product,ranges", [
    ("BTNH,BSNH->BNTS", (2, 5, 3, 4), (2, 6, 3, 4), _product_scaled,   # attention scores
     {"a": [2, T, 3, 4], "b": [2, S, 3, 4]}),
    ("BNTS,BSNH->BTNH", (2, 3, 5, 6), (2, 6, 3, 4), _operand_scaled,   # attention context
     {"a": [2, 3, T, S], "b": [2, S, 3, 4]}),
    ("bij,bjk->bik", (3, 4, 5), (3, 5, 6), _operand_scaled,            # NN
     {"a": [3, (1, 8), (1, 8)], "b": [3, (1, 8), (1, 8)]}),
    ("bkm,bnk->bnm", (3, 5, 4), (3, 6, 5), _product_scaled, None),     # both operands and the output transposed
])
def test_einsum_products_of_computed_operands(tmp_path, rng, equation, lhs, rhs, product, ranges):
    class Model(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None] * len(lhs), tf.float32, name="a"),
                                      tf.TensorSpec([None] * len(rhs), tf.float32, name="b")])
        def serve(self, a, b):
            return {"out": product(equation, a, b)}

    model = Model()
    tf.saved_model.save(model, str(tmp_path / "in"), signatures={"serving_default": model.serve})
    report = tf_dietcode.optimize(tmp_path / "in", tmp_path / "out", tuning=ENDS_TUNING, database=shared_database(),
                                  shape_ranges=ranges or {"a": [(1, 8)] * len(lhs), "b": [(1, 8)] * len(rhs)})
    assert report.fused["attention (einsum)"] == 1 and [w.kind for w in report.workloads] == ["batch_matmul"]
    a, b = rng.uniform(-1, 1, lhs).astype(np.float32), rng.uniform(-1, 1, rhs).astype(np.float32)
    optimized = tf.saved_model.load(str(tmp_path / "out")).signatures["serving_default"]
    np.testing.assert_allclose(optimized(a=a, b=b)["out"], np.einsum(equation, a * 0.125, b), rtol=1e-5, atol=1e-5)
    graph_ops = {n.op for f in optimized.graph.as_graph_def().library.function for n in f.node_def}
    assert "DietcodeFusedBatchMatMulTranspose" in graph_ops
    assert not {"Einsum", "Transpose", "Mul"} & graph_ops  # operands read in place, output written in place


def test_n_d_dense_layers_become_one_op_each(tmp_path, rng):
    """Dense on 3-D input (tf.tensordot's flatten / unflatten chain) and EinsumDense's two forms run
    as one op on the N-D input: no reshape or shape arithmetic stays on the layers' path."""
    keras.utils.set_random_seed(0)
    inputs = keras.Input((None, 16), name="x")
    hidden = keras.layers.Dense(24, activation="relu")(inputs)
    heads = keras.layers.EinsumDense("abc,cde->abde", (None, 4, 6), bias_axes="de")(hidden)
    outputs = keras.layers.EinsumDense("abcd,cde->abe", (None, 16), bias_axes="e")(heads)
    model = keras.Model(inputs, outputs)
    model.export(str(tmp_path / "in"), verbose=False)
    report = tf_dietcode.optimize(tmp_path / "in", tmp_path / "out", tuning=TINY_TUNING, database=shared_database(),
                                  shape_ranges={"x": [(1, 2), (1, 9), 16]})
    assert dict(report.fused) == {"tensordot": 2, "einsum": 4}  # per signature (serve, serving_default)
    optimized = tf.saved_model.load(str(tmp_path / "out")).signatures["serving_default"]
    x = rng.uniform(-1, 1, (2, 7, 16)).astype(np.float32)
    np.testing.assert_allclose(optimized(x=x)["output_0"], model(x), rtol=1e-5, atol=1e-5)
    nodes = [n for f in optimized.graph.as_graph_def().library.function for n in f.node_def]
    assert sum(n.op == "DietcodeFusedMatMul" for n in nodes) == 3
    # what is left: the 'de' bias [4, 6] read as a vector; no Shape, ConcatV2, Transpose or MatMul
    # (the weights' reads from their arena are reshapes too: weight_arena)
    assert [n.op for n in nodes if n.op in ("Reshape", "Shape", "ConcatV2", "Transpose", "MatMul", "Einsum")
            and not n.input[0].startswith("dietcode/weights_")] == ["Reshape"]


@pytest.mark.parametrize("transpose_b", [False, True])
def test_tf_matmul_of_an_n_d_input_by_a_matrix_is_a_dense_layer(tmp_path, rng, transpose_b):
    """tf.matmul([B, T, K], [K, N]) is a BatchMatMulV2 that broadcasts the weight: one fused op on
    the N-D input, with its bias and activation."""
    weight = rng.uniform(-1, 1, (8, 16) if transpose_b else (16, 8)).astype(np.float32)
    bias = rng.uniform(-1, 1, 8).astype(np.float32)

    def serve(x):
        return {"out": tf.nn.relu(tf.matmul(x, weight, transpose_b=transpose_b) + bias)}

    module = tf.Module()
    module.serve = tf.function(serve, input_signature=[tf.TensorSpec([None, None, 16], name="x")])
    tf.saved_model.save(module, str(tmp_path / "in"), signatures={"serving_default": module.serve})
    report = tf_dietcode.optimize(tmp_path / "in", tmp_path / "out", tuning=TINY_TUNING, database=shared_database(),
                                  shape_ranges={"x": [(1, 2), (1, 9), 16]})
    [workload] = report.workloads
    assert dict(report.fused) == {"matmul": 1} and report.dims[workload] == "M = x[0]*x[1]"
    assert workload.activation == "relu" and workload.bias
    optimized = tf.saved_model.load(str(tmp_path / "out")).signatures["serving_default"]
    for shape in [(2, 7, 16), (1, 1, 16), (3, 12, 16), (0, 4, 16)]:  # in range, its corner, outside, empty
        x = rng.uniform(-1, 1, shape).astype(np.float32)
        np.testing.assert_allclose(optimized(x=x)["out"], serve(x)["out"], rtol=1e-5, atol=1e-5)
    assert "BatchMatMulV2" not in {n.op for f in optimized.graph.as_graph_def().library.function for n in f.node_def}


STORED_WEIGHTS = {  # a [16, 24] weight as layers store it: (stored shape, the graph's way back to [16, 24])
    "as is": ((16, 24), lambda w: w),
    "transposed": ((24, 16), tf.transpose),  # PyTorch-style [N, K]
    "reshaped": ((1, 16, 24), lambda w: tf.reshape(w, [16, 24])),  # GPT-2's conv1d
    "squeezed": ((1, 16, 24), lambda w: tf.squeeze(w, 0)),
}


@pytest.mark.parametrize("stored", STORED_WEIGHTS)
def test_a_weight_variable_rearranged_in_the_graph_is_still_a_fixed_weight(tmp_path, rng, stored):
    shape, rearrange = STORED_WEIGHTS[stored]

    class Layer(tf.Module):
        def __init__(self):
            super().__init__()
            self.weight = tf.Variable(rng.uniform(-1, 1, shape).astype(np.float32))

        @tf.function(input_signature=[tf.TensorSpec([None, 16], name="x")])
        def serve(self, x):
            return {"out": tf.matmul(x, rearrange(self.weight))}

    layer = Layer()
    tf.saved_model.save(layer, str(tmp_path / "in"), signatures={"serving_default": layer.serve})
    report = tf_dietcode.optimize(tmp_path / "in", tmp_path / "out", tuning=TINY_TUNING, database=shared_database(),
                                  shape_ranges={"x": [(1, 9), 16]})
    assert dict(report.fused) == {"matmul": 1}
    x = rng.uniform(-1, 1, (7, 16)).astype(np.float32)
    optimized = tf.saved_model.load(str(tmp_path / "out")).signatures["serving_default"]
    np.testing.assert_allclose(optimized(x=x)["out"], layer.serve(x)["out"], rtol=1e-5, atol=1e-5)


def test_keras_lora_layers_run_with_their_adapters_merged_into_the_weight(tmp_path, rng):
    """Keras' Dense with LoRA enabled computes its kernel, W + (A @ B) * scale, on every call:
    the weight is fixed all the same (computed at optimize time), and A @ B is no dense layer."""
    x = keras.Input((None, 16), name="x")
    layers = [keras.layers.Dense(24, activation="gelu"), keras.layers.Dense(8)]
    model = keras.Model(x, layers[1](layers[0](x)))
    for layer in layers:
        layer.enable_lora(4)
        layer.lora_kernel_b.assign(rng.uniform(-1, 1, layer.lora_kernel_b.shape).astype(np.float32))
    model.export(str(tmp_path / "in"), verbose=False)
    report = tf_dietcode.optimize(tmp_path / "in", tmp_path / "out", tuning=TINY_TUNING, database=shared_database(),
                                  shape_ranges={"x": [(1, 2), (1, 9), 16]})
    assert [(w.n.hi, w.k.hi, w.activation, report.dims[w]) for w in report.workloads] == [
        (24, 16, "gelu", "M = x[0]*x[1]"), (8, 24, "none", "M = x[0]*x[1]")]
    optimized = tf.saved_model.load(str(tmp_path / "out")).signatures["serving_default"]
    for shape in [(1, 1, 16), (2, 9, 16), (3, 11, 16)]:
        inputs = rng.uniform(-1, 1, shape).astype(np.float32)
        np.testing.assert_allclose(optimized(x=inputs)["output_0"], model(inputs), rtol=1e-5, atol=1e-5)


def test_warmup_requests_leave_out_shapes_the_model_does_not_accept(tmp_path, rng):
    """shape_ranges up to T = 60 for a model that gathers T rows of a 40-row position table:
    TF Serving would fail the model's load on a warm-up request it cannot run, so those are
    left out, with a note; the rest run on the optimized model."""
    weight = rng.uniform(-1, 1, (8, 8)).astype(np.float32)

    class Model(tf.Module):
        def __init__(self):
            super().__init__()
            self.positions = tf.Variable(rng.uniform(-1, 1, (40, 8)).astype(np.float32))

        @tf.function(input_signature=[tf.TensorSpec([None, None, 8], name="x")])
        def serve(self, x):
            return {"out": tf.matmul(x + tf.gather(self.positions, tf.range(tf.shape(x)[1])), weight)}

    model = Model()
    tf.saved_model.save(model, str(tmp_path / "in"), signatures={"serving_default": model.serve})
    report = tf_dietcode.optimize(tmp_path / "in", tmp_path / "out", tuning=TINY_TUNING, database=shared_database(),
                                  shape_ranges={"x": [(1, 2), (1, 60), 8]})
    requests = serving_warmup.read(tmp_path / "out" / serving_warmup.WARMUP_FILE)
    lengths = [tf.TensorShape(r.inputs["x"].tensor_shape).as_list()[1] for r in requests]
    assert lengths == [1, 20, 40] and report.warmup_requests == 3  # 60 left out
    assert any("no warm-up request at x [2, 60, 8]: the original model fails there (indices[40] = 40 is not in"
               in note for note in report.notes)
    optimized = tf.saved_model.load(str(tmp_path / "out")).signatures["serving_default"]
    for request in requests:
        x = tf.make_ndarray(request.inputs["x"])
        np.testing.assert_allclose(optimized(x=x)["out"], model.serve(x)["out"], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("save_model", TEXT_MODELS)
def test_a_model_reading_text_through_a_vocabulary_file_is_optimized_whole(tmp_path, rng, save_model):
    """The output tracks the model's lookup table and carries its vocabulary file (an asset),
    the token ids' dims follow from the graph, and warm-up requests are empty strings."""
    (tmp_path / "vocab.txt").write_text("\n".join(f"w{i}" for i in range(50)))
    save_model(tmp_path / "in", tmp_path / "vocab.txt", rng)
    report = tf_dietcode.optimize(tmp_path / "in", tmp_path / "out", tuning=TINY_TUNING, database=shared_database(),
                                  shape_ranges={"words": [(1, 2), (1, 9)]})
    assert not any("do not follow from the graph" in note for note in report.notes)
    assert [report.dims[w] for w in report.workloads] == ["M = words[0]*words[1]"] * 2
    original = tf.saved_model.load(str(tmp_path / "in")).signatures["serving_default"]  # its table is filled now
    (tmp_path / "vocab.txt").unlink()  # the output reads its own copy
    shutil.rmtree(tmp_path / "in")
    optimized = tf.saved_model.load(str(tmp_path / "out")).signatures["serving_default"]
    for shape in [(1, 1), (2, 9), (3, 12), (0, 4)]:
        text = tf.constant([f"w{i}" for i in rng.integers(0, 60, shape).ravel()], tf.string, shape=shape)
        np.testing.assert_allclose(optimized(words=text)["output_0"], original(words=text)["output_0"],
                                   rtol=1e-5, atol=1e-5)
    requests = serving_warmup.read(tmp_path / "out" / serving_warmup.WARMUP_FILE)
    assert report.warmup_requests == len(requests) > 0
    assert all(set(tf.make_ndarray(r.inputs["words"]).ravel()) == {b""} for r in requests)


def test_dims_that_follow_the_inputs_values_are_sized_by_input_fn(tmp_path, rng):
    """TextVectorization splits text into words: the dense layers' rows follow the number of
    words, which zero inputs (empty strings) do not show. Without input_fn the report says so;
    with it, the layers are sized by running the model on its inputs."""
    words = keras.Input((), dtype="string", name="text")
    ids = keras.layers.TextVectorization(vocabulary=[f"w{i}" for i in range(50)])(words)
    model = keras.Model(words, keras.layers.Dense(8)(keras.layers.Embedding(52, 16)(ids)))
    model.export(str(tmp_path / "in"), verbose=False)

    def sentences(count, most=30):
        return np.array([" ".join(f"w{i}" for i in rng.integers(0, 60, rng.integers(1, most))) for _ in range(count)])

    converter = tf_dietcode.Converter(tmp_path / "in", tuning=TINY_TUNING, database=shared_database()).build()
    assert [(w.m.lo, w.m.hi) for w in converter.report.workloads] == [(1, 1)]
    assert sum("at the same size on zero inputs at both corners" in n for n in converter.report.notes) == 1
    converter = tf_dietcode.Converter(tmp_path / "in", tuning=TINY_TUNING, database=shared_database())
    converter.build(lambda: ({"text": sentences(count)} for count in (1, 3, 6)))
    (workload,) = converter.report.workloads
    assert workload.m.lo >= 1 and workload.m.hi > 30 and converter.report.ranges["serve"] == {"text": [(1, 6)]}
    assert not any("no range given" in n or "same size on zero inputs" in n for n in converter.report.notes)
    converter.save(tmp_path / "out")
    optimized = tf.saved_model.load(str(tmp_path / "out")).signatures["serve"]
    for count in (1, 4, 9):
        text = sentences(count, most=45)
        np.testing.assert_allclose(optimized(text=text)["output_0"], model(text), rtol=1e-5, atol=1e-5)


def test_a_model_optimized_again_carries_the_files_it_reads(tmp_path, rng):
    """The input's assets go with the output, captured or not: an optimized model's bundle (its
    manifest is captured, its library found beside it), optimized again and moved, still runs
    its tuned kernels; a file the model reads by its asset path is read from the output."""
    save_dense_model(tmp_path / "in", rng)
    tf_dietcode.optimize(tmp_path / "in", tmp_path / "first", tuning=TINY_TUNING, database=shared_database(),
                         shape_ranges={"x": [(1, 9), 16]})
    first = tf.saved_model.load(str(tmp_path / "first"))
    (tmp_path / "offset.txt").write_text("3.5")
    module = tf.Module()
    module.offset = tf.saved_model.Asset(str(tmp_path / "offset.txt"))
    module.first = first
    module.serve = tf.function(
        lambda x: {"out": first.signatures["serving_default"](x=x)["out"]
                   + tf.strings.to_number(tf.io.read_file(module.offset.asset_path))},
        input_signature=[tf.TensorSpec([None, 16], name="x")])
    tf.saved_model.save(module, str(tmp_path / "second_in"), signatures={"serving_default": module.serve})
    tf_dietcode.optimize(tmp_path / "second_in", tmp_path / "second", tuning=TINY_TUNING,
                         database=shared_database(), shape_ranges={"x": [(1, 9), 16]})
    x = rng.uniform(-1, 1, (7, 16)).astype(np.float32)
    expected = module.serve(x)["out"].numpy()
    shutil.move(tmp_path / "second", tmp_path / "moved")
    for path in ("in", "first", "second_in", "offset.txt"):
        shutil.rmtree(tmp_path / path) if (tmp_path / path).is_dir() else (tmp_path / path).unlink()
    optimized = tf.saved_model.load(str(tmp_path / "moved")).signatures["serving_default"]
    (manifest,) = (tmp_path / "moved" / "assets").glob("*.json")
    before, generic_before = tuned_calls.calls(manifest)
    np.testing.assert_allclose(optimized(x=x)["out"], expected, rtol=1e-5, atol=1e-5)
    after, generic_after = tuned_calls.calls(manifest)
    assert sum(after.values()) == sum(before.values()) + 1 and generic_after == generic_before


def test_a_keras_export_keeps_its_serve_function(tmp_path, rng):
    """Keras documents calling an exported model as `tf.saved_model.load(path).serve(...)`: the
    optimized model has `serve` too, taking the model's inputs and returning its outputs as the
    original's does (here two inputs and a list of two outputs), over the fused layers."""
    x, y = keras.Input((None, 16), name="x"), keras.Input((None, 8), name="y")
    hidden = keras.layers.Dense(24, activation="relu")(x)
    model = keras.Model([x, y], [keras.layers.Dense(8)(hidden), keras.layers.Dense(4)(y)])
    model.export(str(tmp_path / "in"), verbose=False)
    report = tf_dietcode.optimize(tmp_path / "in", tmp_path / "out", tuning=TINY_TUNING, database=shared_database(),
                                  shape_ranges={"x": [(1, 2), (1, 9), 16], "y": [(1, 2), (1, 9), 8]})
    assert report.fused["tensordot"] == 6  # three layers, in each of serve and serving_default
    original, optimized = (tf.saved_model.load(str(tmp_path / path)) for path in ("in", "out"))
    inputs = [rng.uniform(-1, 1, (2, 7, 16)).astype(np.float32), rng.uniform(-1, 1, (2, 5, 8)).astype(np.float32)]
    outputs, expected = optimized.serve(inputs), original.serve(inputs)  # Keras' serve takes the inputs' list
    assert isinstance(outputs, list) and len(outputs) == len(expected) == 2
    for output, reference in zip(outputs, expected):
        np.testing.assert_allclose(output, reference, rtol=1e-5, atol=1e-5)
    graph = optimized.serve.get_concrete_function(inputs).graph.as_graph_def()
    assert "DietcodeFusedMatMul" in {n.op for f in graph.library.function for n in f.node_def}


@pytest.mark.parametrize("activation,expected", [
    (lambda x: tf.nn.gelu(x, approximate=True), "gelu_tanh"),
    (lambda x: tf.nn.gelu(x, approximate=False), "gelu"),
    (lambda x: keras.activations.gelu(x, approximate=True), "gelu_tanh"),
    (tf.nn.relu, "relu"),
    (tf.nn.silu, "silu"),  # a tf.custom_gradient: x * sigmoid(1.0 * x) returned through an IdentityN
    (keras.activations.swish, "silu"),
    (lambda x: x * tf.sigmoid(x), "silu"),
    (lambda x: tf.nn.gelu(x) + x, "none"),  # the activation's input read elsewhere: not fused
])
def test_activations_in_the_forms_tf_emits(tmp_path, rng, activation, expected):
    model = save_dense_model(tmp_path / "in", rng, activation)
    report = tf_dietcode.optimize(tmp_path / "in", tmp_path / "out", tuning=TINY_TUNING, database=shared_database(),
                                  shape_ranges={"x": [(1, 9), 16]})
    assert [w.activation for w in report.workloads] == [expected]
    x = rng.uniform(-3, 3, (7, 16)).astype(np.float32)
    optimized = tf.saved_model.load(str(tmp_path / "out")).signatures["serving_default"]
    np.testing.assert_allclose(optimized(x=x)["out"], model.serve(x)["out"], rtol=1e-5, atol=1e-5)


@tf.custom_gradient
def _clip_with_its_own_gradient(x):
    def gradient(dy):
        return dy * tf.cast(tf.abs(x) <= 1.0, dy.dtype)  # captures the forward graph's x
    return tf.clip_by_value(x, -1.0, 1.0), gradient


def test_a_custom_gradient_between_layers_is_sized_by_the_graph_and_saved_without_its_gradient(tmp_path, rng):
    """A tf.custom_gradient puts an IdentityN after its result; this one's gradient captured a
    tensor of the original function, which TF cannot save with the rewritten graph. The layer
    after it is still sized from the graph's shapes, the model is saved without custom
    gradients, and the report says so."""
    w1, w2 = rng.uniform(-1, 1, (16, 24)).astype(np.float32), rng.uniform(-1, 1, (24, 8)).astype(np.float32)

    def serve(x):
        return {"out": tf.matmul(_clip_with_its_own_gradient(tf.matmul(x, w1)), w2)}

    module = tf.Module()
    module.serve = tf.function(serve, input_signature=[tf.TensorSpec([None, None, 16], name="x")])
    tf.saved_model.save(module, str(tmp_path / "in"), signatures={"serving_default": module.serve})
    report = tf_dietcode.optimize(tmp_path / "in", tmp_path / "out", tuning=TINY_TUNING, database=shared_database(),
                                  shape_ranges={"x": [(1, 2), (1, 9), 16]})
    assert not any("do not follow from the graph" in note for note in report.notes)
    assert all(report.dims.get(w) == "M = x[0]*x[1]" for w in report.workloads) and len(report.workloads) == 2
    assert any("custom gradients (tf.custom_gradient) could not be saved" in note for note in report.notes)
    x = rng.uniform(-3, 3, (2, 7, 16)).astype(np.float32)
    optimized = tf.saved_model.load(str(tmp_path / "out")).signatures["serving_default"]
    np.testing.assert_allclose(optimized(x=x)["out"], serve(x)["out"], rtol=1e-5, atol=1e-5)


def test_products_in_loops_and_conds_are_fused_and_those_xla_compiles_named_in_the_report(tmp_path, rng):
    """A while loop's and a cond's bodies have their products fused (graph_rewrite.bodies); a
    function XLA compiles keeps its own, and the report says where and why.
    The saved model runs as the original (reading the graph for those notes once added an unset
    attr to the loop's node, and the saved signature then failed to bind its inputs)."""
    weight = rng.uniform(-1, 1, (8, 8)).astype(np.float32)

    @tf.function(jit_compile=True)
    def compiled(x):
        return tf.matmul(x, weight)

    def serve(x, steps):
        looped = tf.while_loop(lambda i, h: i < steps, lambda i, h: (i + 1, tf.matmul(h, weight)), (0, x))[1]
        chosen = tf.cond(steps > 2, lambda: tf.matmul(x, weight), lambda: x)
        return {"out": compiled(looped) + chosen + tf.tanh(x)}

    module = tf.Module()
    module.serve = tf.function(serve, input_signature=[tf.TensorSpec([None, 8], name="x"),
                                                       tf.TensorSpec([], tf.int32, name="steps")])
    tf.saved_model.save(module, str(tmp_path / "in"), signatures={"serving_default": module.serve})
    converter = tf_dietcode.Converter(tmp_path / "in").convert()
    notes = [note for note in converter.report.notes if "products in" in note]
    assert len(notes) == 1 and "left to XLA (jit_compile=True)" in notes[0], notes
    assert converter.report.found["matmul"] == 2  # in the loop's body and the cond's true branch
    assert "serving_default.steps: scalar" in converter.summary()
    report = converter.save(tmp_path / "out")
    assert sorted(layer["where"].rsplit(" ", 1)[0] for layer in report.layers) == ["cond true branch", "while body"]
    optimized = tf.saved_model.load(str(tmp_path / "out")).signatures["serving_default"]
    for rows, steps in [(1, 0), (4, 3), (9, 5)]:
        x = rng.uniform(-1, 1, (rows, 8)).astype(np.float32)
        np.testing.assert_allclose(optimized(x=x, steps=tf.constant(steps))["out"],
                                   module.serve(x, tf.constant(steps))["out"], rtol=1e-5, atol=1e-5)


def test_a_layer_left_alone_is_listed_once_for_signatures_of_one_computation(tmp_path):
    model = keras.Sequential([keras.Input((16,), name="x"), keras.layers.Dense(8, dtype="float64")])
    model.export(str(tmp_path / "in"), verbose=False)  # serve and serving_default: one graph
    summary = tf_dietcode.Converter(tmp_path / "in").convert().summary()
    assert len([line for line in summary.splitlines() if "left alone: matmul" in line and "not float32" in line]) == 1


def test_weights_beyond_the_last_level_cache_are_tuned_cold(tmp_path, rng, monkeypatch):
    """Where one call's dense weights outgrow the last-level cache, every call reads them
    from DRAM: the dense workloads are tuned so, and the report says why."""
    monkeypatch.setattr(hardware, "detect", lambda cache=dataclasses.replace(hardware.detect(), l3_bytes=1024): cache)
    model = save_dense_model(tmp_path / "in", rng)
    report = tf_dietcode.optimize(tmp_path / "in", tmp_path / "out", tuning=TINY_TUNING, database=shared_database(),
                                  shape_ranges={"x": [(1, 9), 16]})
    assert [w.cold_weight for w in report.workloads] == [True]
    assert "last-level cache: kernels are timed with their weights read from DRAM" in report.summary()
    x = rng.uniform(-3, 3, (7, 16)).astype(np.float32)
    optimized = tf.saved_model.load(str(tmp_path / "out")).signatures["serving_default"]
    np.testing.assert_allclose(optimized(x=x)["out"], model.serve(x)["out"], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name,attention", [
    ("scores + mask", lambda q, k, mask: tf.matmul(q * 0.125, k, transpose_b=True) + mask),
    ("transposed key", lambda q, k, mask: tf.matmul(q, tf.transpose(k, [0, 1, 3, 2])) * 1.0 + mask),
    ("scaled scores + mask", lambda q, k, mask: tf.matmul(q, k, transpose_b=True) * 0.125 + mask),
    ("context transposed", lambda q, k, mask: tf.transpose(tf.matmul(q, k, adjoint_b=True), [0, 2, 1, 3])),
    ("plain", lambda q, k, mask: tf.matmul(q, k, transpose_b=True)),
    ("divided scores + mask", lambda q, k, mask: tf.divide(tf.matmul(q, k, transpose_b=True), 2.828427) + mask),
    ("divided query", lambda q, k, mask: tf.matmul(q / 2.828427, k, transpose_b=True)),
])
def test_batch_matmul_attention_forms(tmp_path, rng, name, attention):
    class Model(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None, 3, None, 8], tf.float32, name="q"),
                                      tf.TensorSpec([None, 3, None, 8], tf.float32, name="k"),
                                      tf.TensorSpec([None, 1, 1, None], tf.float32, name="mask")])
        def serve(self, q, k, mask):
            return {"out": attention(q, k, mask)}

    model = Model()
    tf.saved_model.save(model, str(tmp_path / "in"), signatures={"serving_default": model.serve})
    report = tf_dietcode.optimize(tmp_path / "in", tmp_path / "out", tuning=TINY_TUNING, database=shared_database(),
                                  shape_ranges={"q": [2, 3, (1, 9), 8], "k": [2, 3, (1, 9), 8],
                                                "mask": [2, 1, 1, (1, 9)]})
    assert report.fused["attention (BatchMatMulV2)"] == 1, name
    q, k = rng.uniform(-1, 1, (2, 3, 6, 8)).astype(np.float32), rng.uniform(-1, 1, (2, 3, 6, 8)).astype(np.float32)
    mask = rng.uniform(-1, 1, (2, 1, 1, 6)).astype(np.float32)
    optimized = tf.saved_model.load(str(tmp_path / "out")).signatures["serving_default"]
    np.testing.assert_allclose(optimized(q=q, k=k, mask=mask)["out"], model.serve(q, k, mask)["out"],
                               rtol=1e-5, atol=1e-5)
    library = optimized.graph.as_graph_def().library.function
    assert not {"BatchMatMulV2", "Transpose", "Mul", "RealDiv", "AddV2"} & {n.op for f in library for n in f.node_def}


def test_keras_attention_scaled_by_a_trainable_scalar(tmp_path, rng):
    """Keras' Attention(use_scale=True) multiplies the scores by a scalar variable: TF's shape
    inference knows no variable's shape, so the scores lost their rank, and the product read
    after the softmax was not matched. Both products fuse, the scale as alpha."""
    x = keras.Input((None, 16), name="x")
    attention = keras.layers.Attention(use_scale=True)
    model = keras.Model(x, attention([keras.layers.Dense(16)(x), keras.layers.Dense(16)(x)]))
    attention.scale.assign(0.3)
    model.export(str(tmp_path / "in"), verbose=False)
    report = tf_dietcode.optimize(tmp_path / "in", tmp_path / "out", tuning=TINY_TUNING, database=shared_database(),
                                  shape_ranges={"x": [(1, 2), (1, 9), 16]})
    assert report.fused["attention (BatchMatMulV2)"] == 4  # scores and context, in serve and serving_default
    optimized = tf.saved_model.load(str(tmp_path / "out")).signatures["serving_default"]
    for shape in [(1, 1, 16), (2, 9, 16), (2, 12, 16)]:
        inputs = rng.uniform(-1, 1, shape).astype(np.float32)
        np.testing.assert_allclose(optimized(x=inputs)["output_0"], model(inputs), rtol=1e-5, atol=1e-5)


def test_signatures_of_one_computation_are_sized_and_rewritten_once(tmp_path, rng, monkeypatch):
    """Keras exports "serve" and "serving_default" as the same graph (but for cosmetic attrs):
    where the graph's shapes cannot size a layer, the model runs at the range corners for one
    of them only, and one rewritten function serves both, each still counted as fused and
    matching the original."""
    from tf_dietcode.graph_rewrite.analysis import shape_ranges, symbolic_shapes

    model = keras.Sequential([keras.Input((16,), name="x"), keras.layers.Dense(8)])
    model.export(str(tmp_path / "in"), verbose=False)
    corner_runs = []
    observed_shapes = shape_ranges.observed_shapes
    monkeypatch.setattr(shape_ranges, "observed_shapes", lambda *a: corner_runs.append(a) or observed_shapes(*a))
    monkeypatch.setattr(symbolic_shapes.SymbolicShapes, "range_of", lambda *a: None)
    converter = tf_dietcode.Converter(tmp_path / "in", shape_ranges={"x": [(1, 9), 16]},
                                      tuning=TINY_TUNING, database=shared_database()).build()
    assert sorted(g.key for g in converter.graphs) == ["serve", "serving_default"] and len(corner_runs) == 1
    assert len(converter.report.workloads) == 1
    rewrites = []
    rewrite = tf_dietcode.Converter._rewrite
    monkeypatch.setattr(tf_dietcode.Converter, "_rewrite", lambda *a: rewrites.append(a) or rewrite(*a))
    report = converter.save(tmp_path / "out")
    assert len(rewrites) == 1 and sum(report.fused.values()) == 2  # the layer, in each signature
    optimized = tf.saved_model.load(str(tmp_path / "out"))
    x = rng.uniform(-1, 1, (5, 16)).astype(np.float32)
    for key in ("serve", "serving_default"):
        (output,) = optimized.signatures[key](x=x).values()
        np.testing.assert_allclose(output, model(x), rtol=1e-5, atol=1e-5)
