"""optimize(precision=...): dense layers of the tests' encoder block run in bfloat16 or int8 over
weights converted once (the written model holds them, and no float32 copy), attention, layer
norm and softmax stay float32, the outputs stay close to the original's, the report says which
layer runs in what and why; the CLI's flags; an unknown precision is a clear error."""

import json

import numpy as np
import pytest
import tensorflow as tf

import tf_dietcode
from tf_dietcode import cli, ops, output_check
from tf_dietcode.precision import modes
from tf_dietcode.tuning import search

from conftest import TINY_TUNING_OPTIONS, encoder_block, save_dense_model, shared_database

TINY_TUNING = search.SearchOptions(**TINY_TUNING_OPTIONS)


@pytest.fixture(scope="module", params=["bfloat16", "int8"])
def optimized(request, tmp_path_factory):
    """The encoder block optimized in a precision (int8 with horizontal fusion: Q, K and V as one GEMM),
    on representative inputs: batch 2, T 3..12 (at one row of 8 ReLU outputs, the lowest corner of
    ENCODER_RANGES, its error reads 4.9e-2 in bfloat16: docs/decisions.md).
    Returns (precision, root, report)."""
    root = tmp_path_factory.mktemp(request.param)
    encoder_block().export(str(root / "original"), verbose=False)
    rng = np.random.default_rng(0)
    examples = [{"x": rng.uniform(-1, 1, (2, t, 32)).astype(np.float32)} for t in (3, 7, 12)]
    report = tf_dietcode.optimize(root / "original", root / "optimized", input_fn=lambda: iter(examples),
                                  precision=request.param, horizontal_fusion=request.param == "int8",
                                  tuning=TINY_TUNING, database=shared_database())
    return request.param, root, report


def test_outputs_stay_close_to_the_original(optimized, rng):
    precision, root, _ = optimized
    original, written = (tf.saved_model.load(str(root / name)).signatures["serving_default"]
                         for name in ("original", "optimized"))
    for t in (2, 7, 12, 20):  # 20: beyond the range, as the ops take any shape
        x = rng.uniform(-1, 1, (2, t, 32)).astype(np.float32)
        expected, actual = original(x=x)["output_0"].numpy(), written(x=x)["output_0"].numpy()
        assert output_check.row_error(expected, actual) <= modes.get(precision).max_error
        assert not np.array_equal(actual, expected)  # not float32 after all


def test_the_report_says_what_runs_in_which_precision_and_why(optimized):
    precision, _, report = optimized
    data = json.loads(report.to_json())
    by_kind = {}
    for layer in data["layers"]:
        by_kind.setdefault(layer["kind"], set()).add((layer["precision"], layer["precision_why"]))
    assert by_kind["dense"] == {(precision, "")}  # int8's merged Q/K/V too
    assert by_kind["attention"] == {("float32", "attention runs in float32: only dense layers have "
                                                "reduced-precision ops")}
    assert by_kind["layer_norm"] == {("float32", "layer norm runs in float32: only dense layers have "
                                                 "reduced-precision ops")}
    low_ops = {"bfloat16": "DietcodeFusedMatMulBf16", "int8": "DietcodeFusedMatMulInt8"}
    assert {op for layer in data["layers"] if layer["precision"] == precision for op in layer["ops"]} == \
        {low_ops[precision]}
    isa = ops.low_precision_isa()[precision]
    assert data["precision"]["precision"] == precision and data["precision"]["kernel_path"] == isa
    assert data["precision"]["max_error"] == modes.get(precision).max_error
    # only float32 ops are tuned: attention's products
    assert {w.kind for w in report.workloads} == {"batch_matmul"}
    # int8's Q, K and V: one op of three layers per signature, in int8 (bfloat16 runs them apart)
    merged = [layer for layer in data["layers"] if layer["kind"] == "dense" and len(layer["forms"]) > 1]
    assert bool(merged) == (precision == "int8")
    assert all(len(layer["forms"]) == 3 and layer["precision"] == precision for layer in merged)
    summary = report.summary()
    assert f"precision: {precision} for dense layers, on {isa} kernels the op chooses (not tuned)" in summary
    assert data["precision"]["accuracy_gate"]["put_back"] == 0
    assert "accuracy gate: error " in summary and report.output_check.bound == modes.get(precision).max_error


def _variables(model) -> list[tf.Variable]:
    return list({id(v): v for v in tf.train.TrackableView(model).descendants() if isinstance(v, tf.Variable)}.values())


def test_the_written_model_holds_converted_weights_and_no_float32_copy(optimized):
    precision, root, _ = optimized
    written, original = (tf.saved_model.load(str(root / name)) for name in ("optimized", "original"))
    variables = _variables(written)
    # the weights packed one variable per dtype (graph_rewrite/weight_arena.py): the converted
    # weights, int8's per-column scales (float32) and column sums (int32), the biases and layer norms
    arenas = {v.dtype.name: v.numpy() for v in variables if v.name.startswith("dietcode_weights_")}
    low = "int8" if precision == "int8" else "bfloat16"
    assert set(arenas) == ({"int8", "int32", "float32"} if precision == "int8" else {"bfloat16", "float32"})
    # two dense layers of 32 x 64 and 64 x 32, Q/K/V and the attention output of 32 x 32 each, the
    # last of 32 x 8 (its 8 columns in a block of 16)
    assert arenas[low].size == 2 * 32 * 64 + 4 * 32 * 32 + 32 * 16
    if precision == "int8":  # per output column, the int32 sum of its weights (the last layer's 32
        assert arenas["int32"].size == 64 + 32 + 3 * 32 + 32  # bytes stay a variable of their own)
    kernels = [v.numpy().ravel() for v in _variables(original) if "kernel" in v.name]
    for variable in variables:  # not one of the dense layers' float32 kernels is kept
        values = variable.numpy().ravel()
        for kernel in kernels:
            assert not any(np.array_equal(values[start:start + kernel.size], kernel)
                           for start in range(0, values.size - kernel.size + 1, 16)), variable.name


def test_an_unknown_precision_is_a_clear_error(tmp_path, rng):
    save_dense_model(tmp_path / "in", rng)
    choices = r"unknown precision 'int4': give one of \['float32', 'bfloat16', 'int8'\]"
    with pytest.raises(ValueError, match=choices):
        tf_dietcode.optimize(tmp_path / "in", tmp_path / "out", precision="int4")
    with pytest.raises(ValueError, match=choices):
        tf_dietcode.Converter(tmp_path / "in", precision="int4")
    with pytest.raises(ValueError, match="max_error must be a positive number"):
        tf_dietcode.optimize(tmp_path / "in", tmp_path / "out", precision="int8", max_error=0)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in"]


def test_the_command_line_takes_precision_and_max_error(tmp_path, rng, capsys):
    save_dense_model(tmp_path / "in", rng)
    arguments = ["optimize", "--dir", str(tmp_path / "in"), "--output_dir", str(tmp_path / "out"),
                 "--shape_range", "x=1:9,16", "--precision", "bfloat16", "--max_error", "0.03",
                 "--report_json", str(tmp_path / "report.json")]
    assert cli.main(arguments) == 0
    assert "precision: bfloat16 for dense layers" in capsys.readouterr().out
    data = json.loads((tmp_path / "report.json").read_text())
    assert data["precision"]["max_error"] == 0.03 and data["output_check"]["bound"] == 0.03
    assert [layer["precision"] for layer in data["layers"]] == ["bfloat16"]
    assert cli.main(arguments[:-6] + ["--precision", "int4", "--overwrite"]) == 2
    assert "unknown precision 'int4': give one of ['float32', 'bfloat16', 'int8']" in capsys.readouterr().err


def test_float32_is_the_default_and_reported_so(tmp_path, rng):
    save_dense_model(tmp_path / "in", rng)
    report = tf_dietcode.optimize(tmp_path / "in", tmp_path / "out", shape_ranges={"x": [(1, 9), 16]},
                                  tuning=TINY_TUNING, database=shared_database())
    assert [(layer["precision"], layer["precision_why"]) for layer in report.layers] == \
        [("float32", "precision='float32'")]
    assert report.accuracy_gate is None and report.output_check.bound == 1e-4
    assert "precision: float32 (precision='float32'): every fused op" in report.summary()
    assert len(report.workloads) == 1
