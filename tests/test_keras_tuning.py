"""tf_dietcode.keras.tune: DietDense layers tuned for a model's input ranges run
tuned kernels (weights read in place), and their bundles travel with `.keras`
files and `model.export()` SavedModels into fresh processes."""

import json
import os
import shutil
import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest

from conftest import SEED, random_tensor
from tf_dietcode import bundle_store, ops
from tf_dietcode import keras as diet_keras
from tf_dietcode.tuning import search

QUICK = search.SearchOptions(trials=4, batch=4, samples=3, finalists=0, seed=SEED % 1000)


def _model():
    inputs = keras.Input((None, 24), name="tokens")
    hidden = keras.layers.Dense(48, activation="gelu")(inputs)
    hidden = keras.layers.Dense(32)(hidden)  # 48 and 32 split into whole 16-lane (AVX-512) column tiles
    return keras.Model(inputs, keras.layers.Dense(3, activation="softmax")(hidden))


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    """(Dense model, its tuned DietDense copy, tune()'s report), bundles in a private store."""
    store = tmp_path_factory.mktemp("store")
    old = os.environ.get("TF_DIETCODE_CACHE")
    os.environ["TF_DIETCODE_CACHE"] = str(store)
    keras.utils.set_random_seed(SEED % 1000)
    dense_model = _model()
    model = diet_keras.convert(dense_model)
    report = diet_keras.tune(model, [(1, 2), (1, 10), 24], tuning=QUICK, progress=False)
    yield dense_model, model, report
    if old is None:
        del os.environ["TF_DIETCODE_CACHE"]
    else:
        os.environ["TF_DIETCODE_CACHE"] = old


def _calls(path):
    stats = ops.bundle_stats(path)
    assert stats["problem"] == "", stats
    return sum(sum(w["calls"]) for w in stats["workloads"]), stats["generic_calls"]


def test_report_names_the_tuned_and_the_generic_layers(tuned):
    _, model, report = tuned
    names = [layer.path for layer in model.layers[1:]]
    assert list(report.tuned) == names[:2] and list(report.skipped) == names[2:]
    assert "3 output columns" in report.skipped[names[2]]
    first, second = report.tuned.values()
    assert (first.m.lo, first.m.hi, first.n.hi, first.k.hi, first.activation) == (1, 20, 48, 24, "gelu")
    assert (second.m.lo, second.m.hi, second.n.hi, second.bias) == (1, 20, 32, True)
    assert {w.weight_layout for w in report.tuned.values()} == {"in_place"}
    assert "tuned 2 DietDense layer(s)" in report.summary()


def test_tuned_layers_match_dense_and_run_their_kernels(tuned, rng):
    dense_model, model, _ = tuned
    first, second, head = model.layers[1:]
    assert first.bundle_path and second.bundle_path and not head.bundle_path
    for batch, t in [(1, 1), (2, 7), (2, 10), (1, 13), (2, 11), (3, 10)]:  # the last two: 22 and 30 rows
        x = random_tensor(rng, (batch, t, 24))
        before = [_calls(layer.bundle_path) for layer in (first, second)]
        np.testing.assert_allclose(model(x), dense_model(x), rtol=1e-5, atol=1e-6)
        after = [_calls(layer.bundle_path) for layer in (first, second)]
        in_range = batch * t <= 20
        for (tuned_before, generic_before), (tuned_after, generic_after) in zip(before, after):
            assert (tuned_after - tuned_before, generic_after - generic_before) == ((1, 0) if in_range else (0, 1))


def test_bundle_store_installs_each_bundle_once(tuned, tmp_path):
    _, model, _ = tuned
    stored = model.layers[1].bundle_path
    copy = tmp_path / "copy"
    copy.mkdir()
    for path in bundle_store.files(stored):
        shutil.copy(path, copy)
    assert str(bundle_store.install(copy / os.path.basename(stored))) == stored
    assert not [p for p in bundle_store.root().iterdir() if p.name.startswith(".staging-")]
    manifest = json.loads(open(stored).read())
    assert manifest["library"] == os.path.basename(stored).replace(".json", ".so")


FRESH_PROCESS = """
import json, os, sys
import numpy as np
import tf_dietcode
from tf_dietcode import ops
tf_dietcode.load_op_library()
kind, path, x_path, out_path = sys.argv[1:]
x = np.load(x_path)
if kind == "keras":
    import keras
    import tf_dietcode.keras  # registers DietDense
    model = keras.models.load_model(path)
    out = model(x).numpy()
    bundles = [layer.bundle_path for layer in model.layers if getattr(layer, "bundle_path", "")]
else:
    import glob
    import tensorflow as tf
    model = tf.saved_model.load(path)
    out = model.serve(x).numpy()
    bundles = sorted(glob.glob(os.path.join(path, "assets", "*.json")))
np.save(out_path, out)
print(json.dumps([[b, ops.bundle_stats(b)] for b in bundles]))
"""


def _run_fresh(kind, path, x, tmp_path, store):
    np.save(tmp_path / "x.npy", x)
    env = {**os.environ, "TF_DIETCODE_CACHE": str(store)}
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(FRESH_PROCESS), kind, str(path),
                             str(tmp_path / "x.npy"), str(tmp_path / "out.npy")],
                            capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    return np.load(tmp_path / "out.npy"), json.loads(result.stdout.strip().splitlines()[-1])


def _assert_tuned_calls(bundles, expected_bundles):
    assert len(bundles) == expected_bundles
    for path, stats in bundles:
        assert stats["problem"] == "" and stats["generic_calls"] == 0, (path, stats)
        assert sum(sum(w["calls"]) for w in stats["workloads"]) == 1, (path, stats)


def test_keras_file_carries_the_bundles_to_a_fresh_process(tuned, tmp_path, rng):
    _, model, _ = tuned
    x = random_tensor(rng, (2, 9, 24))
    model.save(tmp_path / "model.keras")
    (tmp_path / "moved").mkdir()
    shutil.move(tmp_path / "model.keras", tmp_path / "moved" / "model.keras")
    out, bundles = _run_fresh("keras", tmp_path / "moved" / "model.keras", x, tmp_path, tmp_path / "new_store")
    np.testing.assert_array_equal(out, model(x))
    _assert_tuned_calls(bundles, 2)
    assert all(path.startswith(str(tmp_path / "new_store")) for path, _ in bundles)

    loaded = keras.models.load_model(tmp_path / "moved" / "model.keras")  # and in this process
    assert [layer.bundle_path for layer in loaded.layers[1:]] == [layer.bundle_path for layer in model.layers[1:]]


def test_exported_saved_model_carries_the_bundles(tuned, tmp_path, rng):
    _, model, _ = tuned
    x = random_tensor(rng, (1, 17, 24))
    model.export(str(tmp_path / "exported"), verbose=False)
    shutil.move(tmp_path / "exported", tmp_path / "moved")  # no absolute paths inside
    assets = sorted(p.suffix for p in (tmp_path / "moved" / "assets").iterdir())
    assert assets == [".json", ".json", ".so", ".so"]
    out, bundles = _run_fresh("saved_model", tmp_path / "moved", x, tmp_path, tmp_path / "unused_store")
    np.testing.assert_array_equal(out, model(x))
    _assert_tuned_calls(bundles, 2)


def test_untuned_layers_save_no_assets(tmp_path, rng):
    model = diet_keras.convert(_model())
    model.save(tmp_path / "model.keras")
    loaded = keras.models.load_model(tmp_path / "model.keras")
    assert all(not layer.bundle_path for layer in loaded.layers[1:])
    x = random_tensor(rng, (2, 3, 24))
    np.testing.assert_array_equal(loaded(x), model(x))


def test_bad_shape_ranges_are_clear_errors():
    model = diet_keras.convert(_model())
    with pytest.raises(ValueError, match="rank 3"):
        diet_keras.tune(model, [(1, 2), 24], tuning=QUICK, progress=False)
    with pytest.raises(ValueError, match="is 24 in the signature"):
        diet_keras.tune(model, [1, 4, 16], tuning=QUICK, progress=False)
    with pytest.raises(ValueError, match="unknown input"):
        diet_keras.tune(model, {"other": [1, 4, 24]}, tuning=QUICK, progress=False)
    a, b = keras.Input((4,)), keras.Input((4,))
    two_inputs = keras.Model([a, b], diet_keras.DietDense(8)(keras.layers.Add()([a, b])))
    with pytest.raises(ValueError, match="as a dict by input name"):
        diet_keras.tune(two_inputs, [(1, 4), 4], tuning=QUICK, progress=False)


def test_loading_dietdense_needs_no_tuner():
    """Serving a model imports tf_dietcode.keras; the tuner's TVM and XGBoost stay out."""
    code = "import sys, tf_dietcode.keras; print(sorted({'tvm', 'xgboost'} & set(sys.modules)))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and result.stdout.strip().splitlines()[-1] == "[]", result.stderr[-2000:]
