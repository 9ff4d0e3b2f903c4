"""The accuracy gate: how many layers go back (k = 1, 2, 4, ... then bisection down to a few, tried
in order), even where the error does not fall steadily, and in which precision (the cheapest the
mode offers that meets the bound: int8's in bfloat16 where the CPU multiplies it natively, float32
last); the ranking by each layer's error alone; the error when not even float32 meets the bound,
and on a model built to have one layer int8 cannot serve (its input has a feature 1000 times the
others, on weights near zero: the op's per-row scale flattens the rest), that layer alone put
back, the bound held, nothing written where it cannot be."""

import json

import numpy as np
import pytest
import tensorflow as tf

import tf_dietcode
from tf_dietcode import output_check
from tf_dietcode.output_check import OutputCheck, OutputError
from tf_dietcode.precision import accuracy_gate, modes
from tf_dietcode.precision.accuracy_gate import BoundUnreachable
from tf_dietcode.precision.bf16_dense import Bfloat16
from tf_dietcode.precision.int8_dense import Int8
from tf_dietcode.tuning import search

import low_precision_paths
from conftest import TINY_TUNING_OPTIONS, shared_database

TINY_TUNING = search.SearchOptions(**TINY_TUNING_OPTIONS)


def _evaluate(errors: dict[int, float], bound: float, calls: list[int], bfloat16: dict[int, float] | None = None):
    """A gate's evaluate(k, precision): the model's error with the k most sensitive layers back in
    float32 (`errors`) or in bfloat16 (`bfloat16`); calls records k, and the precision where bfloat16 is given."""
    def evaluate(k: int, precision: str) -> OutputCheck:
        calls.append(k if bfloat16 is None else (k, precision))
        error = (bfloat16 if precision == "bfloat16" else errors)[k]
        return OutputCheck(3, [OutputError("serving_default", "out", error, "x [2, 16]", True)], [], bound)
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
    put_back, precision, ran = accuracy_gate.settle(layers, ("float32",), _evaluate(errors, 1e-2, calls))
    assert (put_back, precision) == (needed, "float32") and calls == rounds
    assert [(r.put_back, r.precision, r.error, r.output) for r in ran] == \
        [(k, "float32", errors[k], "serving_default.out") for k in rounds]


def test_layers_go_back_in_the_cheapest_precision_that_meets_the_bound():
    """bfloat16 first; float32 searched afresh only where not even every layer in bfloat16 holds."""
    calls = []
    bfloat16 = {k: 0.2 / (k + 1) if k < 3 else 5e-3 for k in range(11)}
    assert accuracy_gate.settle(10, ("bfloat16", "float32"), _evaluate({}, 1e-2, calls, bfloat16))[:2] == \
        (3, "bfloat16")
    assert calls == [(0, "bfloat16"), (1, "bfloat16"), (2, "bfloat16"), (4, "bfloat16"), (3, "bfloat16")]

    calls, errors = [], {k: 0.2 / (k + 1) if k < 2 else 1e-3 for k in range(11)}
    put_back, precision, ran = accuracy_gate.settle(10, ("bfloat16", "float32"),
                                                    _evaluate(errors, 1e-2, calls, {k: 0.02 for k in range(11)}))
    assert (put_back, precision) == (2, "float32")
    assert calls == [(0, "bfloat16"), (1, "bfloat16"), (2, "bfloat16"), (4, "bfloat16"), (8, "bfloat16"),
                     (10, "bfloat16"), (1, "float32"), (2, "float32")]
    assert [r.text for r in ran][:2] == ["none back: error 0.02 (serving_default.out)",
                                         "1 in bfloat16: error 0.02 (serving_default.out)"]


@pytest.mark.parametrize("errors, needed, rounds", [
    # one noisy failure (k = 6) between k that hold: the smallest that holds wins, not the next above the noise
    ({0: 0.2, 1: 0.15, 2: 0.12, 4: 0.011, 8: 1e-3, 5: 9e-3, 6: 0.012, 7: 8e-3}, 5, [0, 1, 2, 4, 8, 5]),
    ({0: 0.2, 1: 0.15, 2: 0.12, 4: 0.011, 8: 1e-3, 5: 0.013, 6: 9e-3, 7: 0.011}, 6, [0, 1, 2, 4, 8, 5, 6]),
    # the error rising as layers go back (0.15, 0.13, 0.17): the k chosen still held when run
    ({0: 0.15, 1: 0.13, 2: 0.17, 4: 0.02, 8: 5e-3, 5: 0.011, 6: 0.012, 7: 9e-3}, 7, [0, 1, 2, 4, 8, 5, 6, 7]),
])
def test_an_error_that_does_not_fall_steadily_costs_no_extra_layers_and_never_the_bound(errors, needed, rounds):
    calls = []
    put_back, _, _ = accuracy_gate.settle(20, ("float32",), _evaluate(errors, 1e-2, calls))
    assert (put_back, calls) == (needed, rounds) and errors[put_back] <= 1e-2


def test_layers_are_ranked_by_their_error_alone_in_the_precision():
    """rank() runs the model once per layer with the others put back; NaN ranks first."""
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


@pytest.mark.parametrize("put_back_in, rounds", [
    (("float32",), [0, 1, 2, 4, 5]),
    (("bfloat16", "float32"), [(0, "bfloat16"), (1, "bfloat16"), (2, "bfloat16"), (4, "bfloat16"), (5, "bfloat16"),
                               (1, "float32"), (2, "float32"), (4, "float32"), (5, "float32")]),
])
def test_a_bound_float32_cannot_meet_is_an_error_naming_it(put_back_in, rounds):
    calls = []
    errors = {k: 0.1 if k < 5 else 2e-7 for k in range(6)}
    bfloat16 = {k: 0.1 if k < 5 else 1e-3 for k in range(6)} if len(put_back_in) > 1 else None
    with pytest.raises(BoundUnreachable, match=r"max_error 1e-09 cannot be met: with all 5 dense layers back in "
                                               r"float32 the largest output error is 2e-07 \(serving_default\.out at "
                                               r"x \[2, 16\]\); nothing was written") as raised:
        accuracy_gate.settle(5, put_back_in, _evaluate(errors, 1e-9, calls, bfloat16))
    assert calls == rounds and isinstance(raised.value, output_check.OutputMismatch)


def test_each_kept_layer_names_the_error_of_the_last_round_that_failed_with_it_converted():
    errors = {0: 0.3, 1: 0.08, 2: 0.04, 4: 1e-3, 3: 2e-3}
    put_back, precision, rounds = accuracy_gate.settle(6, ("float32",), _evaluate(errors, 1e-2, []))
    gate = accuracy_gate.GateResult("int8", 1e-2, 6, [(f"d{i}", 0.1 / (i + 1)) for i in range(6)], rounds,
                                    put_back, precision)
    assert put_back == 3
    assert [gate.why_put_back(rank) for rank in range(3)] == [
        f"put back by the accuracy gate (output error {e} > max_error 0.01 with it in int8)" for e in (0.3, 0.08, 0.04)]
    assert gate.summary() == ["accuracy gate: 3 of 6 dense layers put back in float32 to meet max_error 0.01, most "
                              "sensitive first (5 rounds: none back: error 0.3 (serving_default.out); 1 in float32: "
                              "error 0.08 (serving_default.out); 2 in float32: error 0.04 (serving_default.out); 4 in "
                              "float32: error 0.001 (serving_default.out); 3 in float32: error 0.002 "
                              "(serving_default.out))"]
    assert gate.to_json()["put_back"] == 3 and gate.to_json()["put_back_in"] == "float32"


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


@pytest.mark.parametrize("put_back_in", [("float32",), ("bfloat16", "float32")])
def test_the_gate_puts_the_sensitive_layer_alone_back(tmp_path, rng, monkeypatch, put_back_in):
    """In float32 (then tuned) or in bfloat16 (the op's own kernels), as int8's put_back_in says."""
    monkeypatch.setattr(Int8, "put_back_in", lambda self: put_back_in)
    model, examples = _save_outlier_model(tmp_path / "in", rng)
    report = tf_dietcode.optimize(tmp_path / "in", tmp_path / "out", input_fn=lambda: iter(examples),
                                  precision="int8", max_error=2e-2, tuning=TINY_TUNING, database=shared_database())
    layers = {layer["node"].split("/")[-1]: layer for layer in json.loads(report.to_json())["layers"]}
    assert layers["second"]["precision"] == "int8" and layers["second"]["precision_why"] == ""
    assert layers["first"]["precision"] == put_back_in[0]
    assert layers["first"]["precision_why"].startswith("put back by the accuracy gate (output error ")
    assert layers["first"]["precision_why"].endswith(" > max_error 0.02 with it in int8)")
    gate = report.accuracy_gate
    assert [node.split("/")[-1] for node, _ in gate.ranked] == ["first", "second"]
    assert (gate.put_back, gate.put_back_in) == (1, put_back_in[0])
    assert gate.rounds[0].put_back == 0 and gate.rounds[0].error > 0.2  # the first layer in int8: far off
    # a layer back in float32 was then tuned, as float32 layers are; bfloat16's op picks its own kernels
    assert [(w.n.lo, w.k.lo) for w in report.workloads] == ([(32, 16)] if put_back_in[0] == "float32" else [])
    assert report.output_check.bound == 2e-2 and not report.output_check.beyond_bound
    optimized = tf.saved_model.load(str(tmp_path / "out")).signatures["serving_default"]
    for example in examples:
        expected = model.serve(example["x"])["out"].numpy()
        assert np.abs(optimized(**example)["out"].numpy() - expected).max() <= 2e-2 * np.abs(expected).max()
    ops = {n.op for f in optimized.graph.as_graph_def().library.function for n in f.node_def}
    back_op = {"float32": "DietcodeFusedMatMul", "bfloat16": "DietcodeFusedMatMulBf16"}[put_back_in[0]]
    assert {back_op, "DietcodeFusedMatMulInt8"} <= ops
    summary = report.summary()
    assert f"accuracy gate: 1 of 2 dense layers put back in {put_back_in[0]} to meet max_error 0.02" in summary
    assert f"  int8: {layers['second']['node']}\n" in summary
    # the group put back names its kernels where they differ from the mode's own (float32's are the tuned ones)
    kernels = json.loads(report.to_json())["precision"]["kernel_paths"]
    assert kernels["int8"] == Int8().kernel_path() and kernels[put_back_in[0]] == modes.get(put_back_in[0]).kernel_path()
    described = {"float32": "float32", "bfloat16": f"bfloat16 on {Bfloat16().kernel_path()} kernels"}[put_back_in[0]]
    assert f"  {described}: put back by the accuracy gate (output error " in summary


def test_int8_puts_layers_back_in_bfloat16_only_where_the_cpu_multiplies_it_natively():
    with low_precision_paths.disabled_isa(("amx_bf16", "avx512_bf16")):
        assert Int8().put_back_in() == ("float32",)
    assert Bfloat16().put_back_in() == ("float32",)
    with low_precision_paths.forced_path("bfloat16", "avx512_bf16"):
        assert Int8().put_back_in() == ("bfloat16", "float32")


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
