"""Horizontal fusion in optimize(): dense layers of one width that read the same tensor run
as one GEMM over their concatenated weights, written group-major and unstacked per layer;
outputs equal the unfused model's and the original's, every signature, in and outside the
tuned range; in int8 and bfloat16 too."""

import json

import keras
import numpy as np
import pytest
import tensorflow as tf

import tf_dietcode
from tf_dietcode import output_check
from tf_dietcode.graph_rewrite.fusions.dense import Dense
from tf_dietcode.graph_rewrite.fusions.dense_patterns import DenseMatch
from tf_dietcode.graph_rewrite.fusions.horizontal_fusion import DenseGroup
from tf_dietcode.precision import modes
from tf_dietcode.tuning import search

import tuned_calls
from conftest import TINY_TUNING_OPTIONS, shared_database


def shared_input_model():
    """On one hidden tensor h: Dense relu (bias) and Dense relu (no bias) -> grouped; Dense linear
    and attention's Q/K/V einsums (linear, 2 heads x 8) -> grouped across forms; Dense tanh and
    a narrower Dense linear -> alone."""
    keras.utils.set_random_seed(1)
    x = keras.Input((None, 16), name="x")
    h = keras.layers.Dense(16)(x)
    a = keras.layers.Dense(16, activation="relu")(h)
    b = keras.layers.Dense(16, activation="relu", use_bias=False)(h)
    c = keras.layers.Dense(16)(h)
    d = keras.layers.Dense(4, activation="tanh")(h)
    e = keras.layers.Dense(8)(h)
    attended = keras.layers.MultiHeadAttention(num_heads=2, key_dim=8)(h, h)
    joined = keras.layers.Concatenate()([a, b, c, d, e, attended])
    return keras.Model(x, joined)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("horizontal")
    shared_input_model().export(str(root / "original"), verbose=False)
    tuning = search.SearchOptions(**TINY_TUNING_OPTIONS)
    # the model without the pass is optimize()'s default: horizontal fusion is off unless asked for
    reports = {fuse: tf_dietcode.optimize(root / "original", root / f"fused_{fuse}", **switch,
                                          shape_ranges={"x": [(1, 2), (1, 9), 16]}, tuning=tuning,
                                          database=shared_database())
               for fuse, switch in ((True, {"horizontal_fusion": True}), (False, {}))}
    return root, reports


def test_layers_sharing_an_input_are_merged_per_activation(models):
    _, reports = models
    fused, unfused = reports[True], reports[False]
    assert fused.found == unfused.found and fused.fused == fused.found == unfused.fused
    # per signature: {a, b} (relu) and {c, q, k, v} (linear) merge; d (tanh) and h stay alone
    assert fused.merged == (12, 4) and unfused.merged == (0, 0)
    dense = sorted((w.activation, w.n.lo, w.groups, w.k.lo, w.bias) for w in fused.workloads if w.kind == "dense")
    assert ("relu", 32, 2, 16, True) in dense  # a and b; b's missing bias is zeros
    assert ("none", 64, 4, 16, True) in dense  # c, and Q, K, V with 2 heads x 8
    assert ("tanh", 4, 1, 16, True) in dense
    assert ("none", 8, 1, 16, True) in dense   # e: linear too, but narrower
    assert "horizontal fusion: 12 GEMMs sharing an input merged into 4" in fused.summary()
    assert "horizontal fusion: off" in unfused.summary()


def test_outputs_equal_with_and_without_fusion_every_signature(models, rng):
    root, _ = models
    loaded = {name: tf.saved_model.load(str(root / name)).signatures
              for name in ("original", "fused_True", "fused_False")}
    for key in ("serve", "serving_default"):
        for batch, t in [(1, 1), (2, 5), (2, 9), (1, 10), (3, 23)]:  # the last two outside the range
            x = rng.uniform(-1, 1, (batch, t, 16)).astype(np.float32)
            outputs = {name: signatures[key](x=x)["output_0"].numpy() for name, signatures in loaded.items()}
            scale = np.abs(outputs["original"]).max()
            for name in ("fused_True", "fused_False"):
                np.testing.assert_allclose(outputs[name], outputs["original"], rtol=1e-5, atol=1e-5 * scale,
                                           err_msg=f"{name} {key} {batch}x{t}")
            np.testing.assert_allclose(outputs["fused_True"], outputs["fused_False"], rtol=1e-5,
                                       atol=1e-5 * scale)


def test_fused_model_runs_fewer_gemms(models):
    root, _ = models
    calls = {}
    for fuse in (True, False):
        model = tf.saved_model.load(str(root / f"fused_{fuse}"))
        manifest = next((root / f"fused_{fuse}" / "assets").glob("*.json"))
        before, generic_before = tuned_calls.calls(manifest)
        model.signatures["serving_default"](x=np.ones((1, 4, 16), np.float32))
        after, generic_after = tuned_calls.calls(manifest)
        calls[fuse] = sum(after.values()) - sum(before.values()) + generic_after - generic_before
        assert generic_after == generic_before  # in range: every GEMM, merged ones too, ran a tuned kernel
    # dense GEMMs: h, {a, b}, {c, q, k, v}, d, e, attention output = 6 fused vs 10; plus 2 attention products
    assert calls == {True: 8, False: 12}


@pytest.mark.parametrize("precision", ["int8", "bfloat16"])
def test_reduced_precision_ops_run_merged_layers(tmp_path, rng, precision):
    """In int8 and bfloat16, each merged group is one op of that precision writing group-major."""
    shared_input_model().export(str(tmp_path / "original"), verbose=False)
    report = tf_dietcode.optimize(tmp_path / "original", tmp_path / "optimized", horizontal_fusion=True,
                                  precision=precision, shape_ranges={"x": [(1, 2), (1, 9), 16]},
                                  tuning=search.SearchOptions(**TINY_TUNING_OPTIONS), database=shared_database())
    assert report.merged == (12, 4)
    dense = [layer for layer in json.loads(report.to_json())["layers"] if layer["kind"] == "dense"]
    assert {(layer["precision"], layer["precision_why"]) for layer in dense} == {(precision, "")}
    op = {"int8": "DietcodeFusedMatMulInt8", "bfloat16": "DietcodeFusedMatMulBf16"}[precision]
    graph = tf.saved_model.load(str(tmp_path / "optimized")).signatures["serving_default"].graph.as_graph_def()
    groups = sorted(node.attr["groups"].i for function in graph.library.function for node in function.node_def
                    if node.op == op)
    assert groups == [1, 1, 1, 1, 2, 4]  # h, d, e, attention output; {a, b}; {c, q, k, v}
    original, optimized = (tf.saved_model.load(str(tmp_path / name)).signatures["serving_default"]
                           for name in ("original", "optimized"))
    for batch, t in [(1, 1), (2, 9), (3, 23)]:
        x = rng.uniform(-1, 1, (batch, t, 16)).astype(np.float32)
        expected, actual = original(x=x)["output_0"].numpy(), optimized(x=x)["output_0"].numpy()
        assert output_check.row_error(expected, actual) <= modes.get(precision).max_error


def test_merged_layers_not_of_whole_blocks_stay_float32_in_reduced_precision():
    """An AVX2 machine merges 8-column layers; the int8 and bfloat16 ops take whole 16-column blocks."""
    def member(n, core):
        return DenseMatch("matmul", core, "h:0", 1, np.zeros((16, n), np.float32), [n])

    assert Dense().kept_float32(DenseGroup((member(16, "a"), member(16, "b")))) is None
    assert Dense().kept_float32(DenseGroup((member(24, "a"),))) is None
    why = Dense().kept_float32(DenseGroup((member(8, "a"), member(8, "b"))))
    assert why == ("horizontal fusion merged it with 1 other layer(s) into one GEMM of 8-column layers; the int8 "
                   "and bfloat16 ops merge only layers of whole 16-column blocks")
