"""tf-dietcode tune and optimize: bundles, optimized models and readable tables; bad input exits 2 with a message."""

import json

import keras
import numpy as np
import pytest
import tensorflow as tf

import tf_dietcode
from tf_dietcode import cli
from tf_dietcode.tuning import bundle


def test_version_names_what_the_op_library_was_built_for(capsys):
    with pytest.raises(SystemExit) as exited:
        cli.main(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out.startswith(
        f"tf-dietcode {tf_dietcode.__version__} (op library built for TensorFlow {tf.__version__}, TVM ")


def test_tune_from_a_spec_file_writes_a_bundle(tmp_path, capsys):
    spec = tmp_path / "workloads.json"
    spec.write_text(json.dumps([{"kind": "dense", "m": [1, 24], "n": 16, "k": 8, "activation": "tanh"}]))
    assert cli.main(["tune", "--spec", str(spec), "--out", str(tmp_path / "bundle"), "--trials", "3",
                     "--quick", "--db", str(tmp_path / "db.jsonl")]) == 0
    manifest = json.loads((tmp_path / "bundle" / bundle.MANIFEST).read_text())
    assert len(manifest["workloads"]) == 1
    out = capsys.readouterr().out
    assert "dense M=1..24 N=16 K=8 bias=False tanh" in out and "M     1.." in out
    assert (tmp_path / "db.jsonl").read_text().count("\n") >= 3


def test_bad_input_is_a_clear_error(tmp_path, capsys):
    assert cli.main(["tune", "--m", "1:8", "--out", str(tmp_path / "b")]) == 2
    assert "give --spec FILE, or --m LO:HI with --n and --k" in capsys.readouterr().err
    assert cli.main(["tune", "--m", "9:1", "--n", "8", "--k", "8", "--out", str(tmp_path / "b")]) == 2
    assert "lo <= hi" in capsys.readouterr().err
    assert not (tmp_path / "b").exists()


def test_optimize_a_saved_model(tmp_path, capsys):
    # relu layers on one input: two of width 16 merge; two of width 10 (a whole number of SIMD
    # vectors nowhere) stay separate GEMMs, as the kernels' tasks must not straddle two layers
    inputs = keras.Input((None, 16), name="x")
    outputs = keras.layers.Concatenate()([keras.layers.Dense(n, activation="relu")(inputs) for n in (16, 16, 10, 10)])
    keras.Model(inputs, outputs).export(str(tmp_path / "in"), verbose=False)
    arguments = ["optimize", "--dir", str(tmp_path / "in"), "--output_dir", str(tmp_path / "out"),
                 "--shape_range", "x=1:2,1:10,16", "--signature_def", "serving_default", "--trials", "3", "--quick",
                 "--horizontal_fusion"]
    assert cli.main(arguments) == 0
    summary = capsys.readouterr().out
    assert "dense (tensordot): 4 / 4" in summary and "2 GEMMs sharing an input merged into 1" in summary
    x = np.ones((2, 7, 16), np.float32)
    np.testing.assert_allclose(tf.saved_model.load(str(tmp_path / "out")).signatures["serving_default"](x=x)["output_0"],
                               tf.saved_model.load(str(tmp_path / "in")).signatures["serving_default"](x=x)["output_0"],
                               rtol=1e-5, atol=1e-5)
    assert cli.main(arguments) == 2                      # the output exists
    assert "overwrite" in capsys.readouterr().err
    assert cli.main([*arguments[:5], "--shape_range", "x=1:2,9:1,16", "--overwrite"]) == 2
    assert "min <= max" in capsys.readouterr().err
    assert cli.main([*arguments[:5], "--shape_range", "x:1", "--overwrite"]) == 2
    assert "NAME=DIM" in capsys.readouterr().err


def test_optimize_sized_by_example_inputs(tmp_path, capsys):
    """--example files stand for input_fn: a model that splits text into words has its dense
    layer sized by the examples' words (zero inputs, empty strings, have none)."""
    text = keras.Input((), dtype="string", name="text")
    ids = keras.layers.TextVectorization(vocabulary=[f"w{i}" for i in range(20)])(text)
    keras.Model(text, keras.layers.Dense(8)(keras.layers.Embedding(22, 16)(ids))).export(str(tmp_path / "in"),
                                                                                         verbose=False)
    np.savez(tmp_path / "short.npz", text=np.array(["w1 w2", "w3"]))
    np.savez(tmp_path / "long.npz", text=np.array([" ".join(["w4"] * 30)] * 3))
    np.savez(tmp_path / "pickled.npz", text=np.array(["w1", None], dtype=object))
    arguments = ["optimize", "--dir", str(tmp_path / "in"), "--output_dir", str(tmp_path / "out"),
                 "--signature_def", "serving_default", "--trials", "3", "--quick"]
    assert cli.main([*arguments, "--example", str(tmp_path / "pickled.npz")]) == 2
    assert "--example" in capsys.readouterr().err and not (tmp_path / "out").exists()
    assert cli.main([*arguments, "--example", str(tmp_path / "short.npz"), "--example", str(tmp_path / "long.npz")]) == 0
    summary = capsys.readouterr().out
    assert "serving_default.text: 2..3" in summary and "dense M=1..90 N=8 K=16" in summary


def test_a_bad_flag_value_names_the_flag_and_the_form_it_wants(tmp_path, capsys):
    arguments = ["optimize", "--dir", str(tmp_path), "--output_dir", str(tmp_path / "out")]
    assert cli.main([*arguments, "--shape_range", "token_ids=1,abc"]) == 2
    assert "--shape_range 'token_ids=1,abc': expected NAME=DIM,DIM,... (a size or LO:HI each), e.g. " \
           "--shape_range input_ids=1,1:128 (invalid literal for int() with base 10: 'abc')" in capsys.readouterr().err
    assert cli.main(["tune", "--m", "1:x", "--n", "8", "--k", "8", "--out", str(tmp_path / "b")]) == 2
    assert "--m '1:x': expected LO:HI, e.g. --m 1:128" in capsys.readouterr().err
    (tmp_path / "spec.json").write_text('[{"kind": "dense", "rows": [1, 8]}]')
    assert cli.main(["tune", "--spec", str(tmp_path / "spec.json"), "--out", str(tmp_path / "b")]) == 2
    assert "--spec '" in capsys.readouterr().err and not (tmp_path / "b").exists()
