"""What optimize() remembers and reports: a second run reuses the user's tuning database,
report.to_json() agrees with a model's real counts (its fused layers, their ops and FLOPs),
and the output check refuses a deliberately broken rewrite with nothing written."""

import collections
import json

import numpy as np
import pytest
import tensorflow as tf

import tf_dietcode
from tf_dietcode import optimizer, output_check
from tf_dietcode.tuning import search

from conftest import TINY_TUNING_OPTIONS, save_dense_model, shared_database

TINY_TUNING = search.SearchOptions(**TINY_TUNING_OPTIONS)
RANGES = {"x": [(1, 9), 16]}


def test_a_second_optimize_tunes_nothing_from_the_users_tuning_database(tmp_path, rng, monkeypatch):
    monkeypatch.setenv("TF_DIETCODE_CACHE", str(tmp_path / "cache"))
    save_dense_model(tmp_path / "in", rng)
    first = tf_dietcode.optimize(tmp_path / "in", tmp_path / "first", shape_ranges=RANGES, tuning=TINY_TUNING)
    database = tmp_path / "cache" / "tuning.jsonl"
    records = database.read_text().count("\n")
    second = tf_dietcode.optimize(tmp_path / "in", tmp_path / "second", shape_ranges=RANGES, tuning=TINY_TUNING)
    assert [t.kernels_measured for t in first.tuning_times.values()] == [TINY_TUNING.trials]
    assert [t.kernels_measured for t in second.tuning_times.values()] == [0]
    assert database.read_text().count("\n") == records > 0  # nothing measured again
    assert any((tmp_path / "cache" / "tuning.kernels").iterdir())  # the kernels it links, kept compiled
    assert second.timings["build"] < first.timings["build"] / 2
    assert "1 of 1 workloads needed no new measurement" in second.summary()
    assert "0 of 1 workloads needed no new measurement" in first.summary()


def test_a_budget_by_name():
    assert search.budget("quick") == search.QUICK and search.budget(None) == search.SearchOptions()
    with pytest.raises(ValueError, match=r"unknown tuning budget 'fastest': give one of \['default', 'quick'\]"):
        tf_dietcode.optimize("nowhere", "out", tuning="fastest")


def _library_ops(function) -> collections.Counter:
    return collections.Counter(n.op for f in function.graph.as_graph_def().library.function for n in f.node_def
                               if n.op.startswith("Dietcode"))


def test_report_json_lists_every_fused_layer_with_its_op_workload_and_kernels(optimized_encoder):
    root, report = optimized_encoder
    data = json.loads(report.to_json())
    assert {form: counts["fused"] for form, counts in data["patterns"].items()} == dict(report.fused)
    layers = data["layers"]
    assert sum(len(layer["forms"]) for layer in layers) == sum(report.fused.values())  # every pattern, once
    assert {layer["precision"] for layer in layers} == {"float32"}
    optimized = tf.saved_model.load(str(root / "optimized"))
    for key in report.signatures:  # the fused ops the written signature runs, each of one layer
        assert collections.Counter(op for layer in layers if layer["signature"] == key for op in layer["ops"]) == \
            _library_ops(optimized.signatures[key])
    assert {len(layer["ops"]) for layer in layers} == {1}
    tuned = [layer for layer in layers if layer["workload"]]
    assert {layer["workload"] for layer in tuned} == {w.describe() for w in report.workloads}
    assert all(layer["kernels"] for layer in tuned)
    assert {layer["kind"] for layer in tuned} == {"dense", "attention"}
    assert all("packed" in layer["weight_layout"] if layer["kind"] == "dense" else layer["weight_layout"] is None
               for layer in tuned)  # the weight's layout, which dense layers alone have
    assert {w["workload"] for w in data["workloads"]} == {w.describe() for w in report.workloads}
    assert all(w["seconds"] >= 0 and w["kernels_measured"] >= 0 for w in data["workloads"])
    # every product fused; at the middle of the ranges x is [1, 6, 32]: Dense 32->64 and 64->32, Q, K, V and
    # the attention output (32 -> 2 heads x 16 and back), scores and context (2 heads, 6 x 6 x 16), and the
    # last Dense on one row, 32 -> 8; counted once for serve and serving_default, which compute alike
    rows = 6
    flops = 2 * (rows * 32 * 64 * 2 + rows * 32 * 32 * 4 + 2 * 2 * rows * rows * 16 + 32 * 8)
    assert data["coverage"] == {"reference": "zero inputs at the middle of the shape ranges", "share": 1.0,
                                "fused_flops": flops, "total_flops": flops, "not_counted": []}
    check = data["output_check"]
    assert check["bound"] == output_check.BOUND and check["inputs"] == 3  # lowest corner, middle, highest
    assert [(o["signature"], o["output"]) for o in check["outputs"]] == [("serve", "output_0"),
                                                                      ("serving_default", "output_0")]
    assert all(o["checked"] and o["error"] <= output_check.BOUND for o in check["outputs"])
    assert set(data["timings"]) == {"convert", "build", "save", "total", "output_check"}
    steps = ("convert", "build", "save")
    assert data["timings"]["total"] == pytest.approx(sum(data["timings"][step] for step in steps))


def test_coverage_counts_the_products_left_to_tf(tmp_path, rng):
    weight = rng.uniform(-1, 1, (16, 24)).astype(np.float32)
    module = tf.Module()
    module.serve = tf.function(lambda x: {"dense": tf.matmul(x, weight), "gram": tf.matmul(x, x, transpose_a=True)},
                               input_signature=[tf.TensorSpec([None, 16], tf.float32, name="x")])
    tf.saved_model.save(module, str(tmp_path / "in"), signatures={"serving_default": module.serve})
    report = tf_dietcode.optimize(tmp_path / "in", tmp_path / "out", shape_ranges=RANGES, tuning=TINY_TUNING,
                                  database=shared_database())
    # at the middle of the ranges x is [5, 16]: the dense layer, 2 x 5 x 16 x 24 FLOPs, is fused; x^T x,
    # 2 x 16 x 16 x 5, stays TF's MatMul
    coverage = json.loads(report.to_json())["coverage"]
    assert (coverage["fused_flops"], coverage["total_flops"], coverage["share"]) == (3840, 6400, 0.6)
    assert "coverage: 60.0% of matmul FLOPs fused (zero inputs at the middle of the shape ranges)" in report.summary()
    errors = {e.output: e for e in report.output_check.errors}
    assert set(errors) == {"dense", "gram"} and errors["gram"].error == 0.0
    assert 0.0 < errors["dense"].error <= output_check.BOUND


def test_the_output_check_refuses_a_broken_rewrite_and_writes_nothing(tmp_path, rng, monkeypatch):
    """The dense layer's weight stored 1% too large in the output: the written model is wrong and
    nothing is written; with validate=False it is written unchecked."""
    save_dense_model(tmp_path / "in", rng)
    variable = optimizer._Binding.variable
    monkeypatch.setattr(optimizer._Binding, "variable", lambda binding, value: variable(binding, value * 1.01))
    with pytest.raises(output_check.OutputMismatch, match=r"serving_default\.out: 0\.0\d+ at x \[\d+, 16\]") as error:
        tf_dietcode.optimize(tmp_path / "in", tmp_path / "out", shape_ranges=RANGES, tuning=TINY_TUNING,
                             database=shared_database())
    assert "nothing was written" in str(error.value)
    assert [p.name for p in tmp_path.iterdir()] == ["in"]  # neither the output nor its staging directory
    report = tf_dietcode.optimize(tmp_path / "in", tmp_path / "out", shape_ranges=RANGES, tuning=TINY_TUNING,
                                  database=shared_database(), validate=False)
    assert report.output_check is None and (tmp_path / "out" / "saved_model.pb").exists()
    assert "output check" not in report.summary()
