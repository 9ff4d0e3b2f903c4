"""The accuracy gate: how many layers go back in float32 (k = 1, 2, 4, ... then bisection down to
a few, tried in order), even where the error does not fall steadily; the ranking by each layer's
error alone; the error when not even float32 meets the bound, and on a model built to have one layer int8 cannot
serve (its input has a feature 1000 times the others, on weights near zero: the op's per-row
scale flattens the rest), that layer alone kept in float32, the bound held, nothing written
where it cannot be."""

import json

import numpy as np
import pytest
import tensorflow as tf

import tf_dietcode
from tf_dietcode import output_check
from tf_dietcode.output_check import OutputCheck, OutputError
from tf_dietcode.precision import accuracy_gate
from tf_dietcode.precision.accuracy_gate import BoundUnreachable
from tf_dietcode.tuning import search

from conftest import TINY_TUNING_OPTIONS, shared_database

TINY_TUNING = search.SearchOptions(**TINY_TUNING_OPTIONS)


def _evaluate(errors: dict[int, float], bound: float, calls: list[int]):
    """A gate's evaluate(k): the model's error with the k most sensitive layers in float32."""
    def evaluate(k: int) -> OutputCheck:
        calls.append(k)
        return OutputCheck(3, [OutputError("serving_default", "out", errors[k], "x [2, 16]", True)], [], bound)
    return evaluate


@pytest.mark.parametrize("layers,needed,rounds", [
    (10, 0, [0]),
    (10, 1, [0, 1]),
    (10, 3, [0, 1, 2, 4, 3]),        # up in powers of two to the first that holds, then the few between
    (10, 5, [0, 1, 2, 4, 8, 5]),
    (10, 10, [0, 1, 2, 4, 8, 10, 9]),
    (3, 3, [0, 1, 2, 3]),
    (40, 13, [0, 1, 2, 4, 8, 16, 12, 13]),  # bisection down to 4 candidates
])
def test_the_fewest_layers_back_in_float32_in_a_few_rounds(layers, needed, rounds):
    errors = {k: 0.2 / (k + 1) if k < needed else 1e-3 for k in range(layers + 1)}
    calls = []
    in_float32, ran = accuracy_gate.settle(layers, _evaluate(errors, 1e-2, calls))
    assert in_float32 == needed and calls == rounds
    assert [(r.in_float32, r.error, r.output) for r in ran] == [(k, errors[k], "serving_default.out") for k in rounds]


@pytest.mark.parametrize("errors, needed, rounds", [
    # one noisy failure (k = 6) between k that hold: the smallest that holds wins, not the next above the noise
    ({0: 0.2, 1: 0.15, 2: 0.12, 4: 0.011, 8: 1e-3, 5: 9e-3, 6: 0.012, 7: 8e-3}, 5, [0, 1, 2, 4, 8, 5]),
    ({0: 0.2, 1: 0.15, 2: 0.12, 4: 0.011, 8: 1e-3, 5: 0.013, 6: 9e-3, 7: 0.011}, 6, [0, 1, 2, 4, 8, 5, 6]),
    # the error rising as layers go back (0.15, 0.13, 0.17): the k chosen still held when run
    ({0: 0.15, 1: 0.13, 2: 0.17, 4: 0.02, 8: 5e-3, 5: 0.011, 6: 0.012, 7: 9e-3}, 7, [0, 1, 2, 4, 8, 5, 6, 7]),
])
def test_an_error_that_does_not_fall_steadily_costs_no_extra_layers_and_never_the_bound(errors, needed, rounds):
    calls = []
    in_float32, ran = accuracy_gate.settle(20, _evaluate(errors, 1e-2, calls))
    assert (in_float32, calls) == (needed, rounds) and errors[in_float32] <= 1e-2


def test_layers_are_ranked_by_their_error_alone_in_the_precision():
    """rank() runs the model once per layer with the others in float32; NaN ranks first."""
    effect = {"a": 0.01, "b": 0.3, "c": float("nan"), "d": 0.05}
    runs = []

    def evaluate(kept):
        runs.append(sorted(kept))
        (alone,) = set(effect) - set(kept)
        return OutputCheck(1, [OutputError("serving_default", "out", effect[alone], "x [2, 16]", True)], [], 1e-2)

    ranked = accuracy_gate.rank(list(effect), evaluate)
    assert [layer for layer, _ in ranked] == ["c", "b", "d", "a"]
    assert [error for _, error in ranked][1:] == [0.3, 0.05, 0.01]
    assert runs == [["b", "c", "d"], ["a", "c", "d"], ["a", "b", "d"], ["a", "b", "c"]]


def test_a_bound_float32_cannot_meet_is_an_error_naming_it():
    calls = []
    with pytest.raises(BoundUnreachable, match=r"max_error 1e-09 cannot be met: with all 5 dense layers back in "
                                               r"float32 the largest output error is 2e-07 \(serving_default\.out at "
                                               r"x \[2, 16\]\); nothing was written") as raised:
        accuracy_gate.settle(5, _evaluate({k: 0.1 if k < 5 else 2e-7 for k in range(6)}, 1e-9, calls))
    assert calls == [0, 1, 2, 4, 5] and isinstance(raised.value, output_check.OutputMismatch)


def test_each_kept_layer_names_the_error_of_the_last_round_that_failed_with_it_converted():
    errors = {0: 0.3, 1: 0.08, 2: 0.04, 4: 1e-3, 3: 2e-3}
    in_float32, rounds = accuracy_gate.settle(6, _evaluate(errors, 1e-2, []))
    gate = accuracy_gate.GateResult("int8", 1e-2, 6, [(f"d{i}", 0.1 / (i + 1)) for i in range(6)], rounds,
                                    in_float32)
    assert in_float32 == 3
    assert [gate.why_float32(rank) for rank in range(3)] == [
        f"kept by the accuracy gate (output error {e} > max_error 0.01 with it in int8)" for e in (0.3, 0.08, 0.04)]
    assert gate.summary() == ["accuracy gate: 3 of 6 dense layers kept in float32 to meet max_error 0.01, most "
                              "sensitive first (5 rounds: 0 in float32: error 0.3 (serving_default.out); 1 in float32: "
                              "error 0.08 (serving_default.out); 2 in float32: error 0.04 (serving_default.out); 4 in "
                              "float32: error 0.001 (serving_default.out); 3 in float32: error 0.002 "
                              "(serving_default.out))"]


OUTLIER = 1000.0  # feature 0 of every input


def _save_outlier_model(path, rng) -> tuple[tf.Module, list[dict]]:
    """x[?, 16] -> relu(x @ w1 + b1) @ w2, w1's row 0 near zero, and inputs whose feature 0 is
    OUTLIER: the first layer's int8 product loses every other feature, the second's is fine.
    Returns the module and the examples (input_fn's)."""
    w1 = rng.uniform(-1, 1, (16, 32)).astype(np.float32)
    w1[0] = rng.uniform(-1e-5, 1e-5, 32)
    b1, w2 = rng.uniform(-1, 1, 32).astype(np.float32), rng.uniform(-1, 1, (32, 8)).astype(np.float32)

    class Model(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None, 16], tf.float32, name="x")])
        def serve(self, x):
            return {"out": tf.matmul(tf.nn.relu(tf.matmul(x, w1, name="first") + b1), w2, name="second")}

    model = Model()
    tf.saved_model.save(model, str(path), signatures={"serving_default": model.serve})
    examples = []
    for rows in (1, 5, 9):
        x = rng.uniform(-1, 1, (rows, 16)).astype(np.float32)
        x[:, 0] = OUTLIER
        examples.append({"x": x})
    return model, examples


def test_the_gate_keeps_the_sensitive_layer_alone_in_float32(tmp_path, rng):
    model, examples = _save_outlier_model(tmp_path / "in", rng)
    report = tf_dietcode.optimize(tmp_path / "in", tmp_path / "out", input_fn=lambda: iter(examples),
                                  precision="int8", max_error=2e-2, tuning=TINY_TUNING, database=shared_database())
    layers = {layer["node"].split("/")[-1]: layer for layer in json.loads(report.to_json())["layers"]}
    assert layers["second"]["precision"] == "int8" and layers["second"]["precision_why"] == ""
    assert layers["first"]["precision"] == "float32"
    assert layers["first"]["precision_why"].startswith("kept by the accuracy gate (output error ")
    assert layers["first"]["precision_why"].endswith(" > max_error 0.02 with it in int8)")
    gate = report.accuracy_gate
    assert [node.split("/")[-1] for node, _ in gate.ranked] == ["first", "second"] and gate.in_float32 == 1
    assert gate.rounds[0].in_float32 == 0 and gate.rounds[0].error > 0.2  # the first layer in int8: far off
    # the layer back in float32 was then tuned, as float32 layers are
    assert [(w.n.lo, w.k.lo) for w in report.workloads] == [(32, 16)]
    assert report.output_check.bound == 2e-2 and not report.output_check.beyond_bound
    optimized = tf.saved_model.load(str(tmp_path / "out")).signatures["serving_default"]
    for example in examples:
        expected = model.serve(example["x"])["out"].numpy()
        assert np.abs(optimized(**example)["out"].numpy() - expected).max() <= 2e-2 * np.abs(expected).max()
    ops = {n.op for f in optimized.graph.as_graph_def().library.function for n in f.node_def}
    assert {"DietcodeFusedMatMul", "DietcodeFusedMatMulInt8"} <= ops
    summary = report.summary()
    assert "accuracy gate: 1 of 2 dense layers kept in float32 to meet max_error 0.02" in summary
    assert f"  int8: {layers['second']['node']}\n" in summary


def test_an_unreachable_bound_raises_and_writes_nothing(tmp_path, rng):
    _, examples = _save_outlier_model(tmp_path / "in", rng)
    with pytest.raises(BoundUnreachable, match=r"max_error 1e-09 cannot be met: with all 2 dense layers back in "
                                               r"float32 the largest output error is .*; nothing was written"):
        tf_dietcode.optimize(tmp_path / "in", tmp_path / "out", input_fn=lambda: iter(examples), precision="int8",
                             max_error=1e-9, tuning=TINY_TUNING, database=shared_database())
    assert [p.name for p in tmp_path.iterdir()] == ["in"]  # neither the output nor its staging directory


def test_without_validation_no_bound_is_enforced(tmp_path, rng):
    _, examples = _save_outlier_model(tmp_path / "in", rng)
    report = tf_dietcode.optimize(tmp_path / "in", tmp_path / "out", input_fn=lambda: iter(examples),
                                  precision="int8", max_error=1e-9, validate=False, database=shared_database())
    assert report.accuracy_gate is None and report.output_check is None
    assert {layer["precision"] for layer in report.layers} == {"int8"} and not report.workloads
    assert "max_error 1e-09 not enforced (validate=False)" in report.summary()
