"""optimize() under faults never loses a model. With the disk full or an
interrupt while the output is written, an unwritable output location, an
output overlapping the input, or the process killed mid-write: the input is
byte-identical, the output is absent or still the previous one (a
half-written directory never takes its name), and a later optimize() works. A
model optimized over an output this process has already loaded runs its own
bundle."""

import dataclasses
import errno
import hashlib
import pathlib
import shutil
import signal
import subprocess

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.lib.io import file_io

import tf_dietcode
from conftest import TINY_TUNING_OPTIONS, save_dense_model
from file_modes import python_command
import tuned_calls
from tf_dietcode.tuning import search
from tf_dietcode.tuning.database import Database

RANGES = {"x": [(1, 8), 16]}


@dataclasses.dataclass
class Model:
    input: pathlib.Path
    database: pathlib.Path            # children reuse its measurements instead of tuning again
    converter: tf_dietcode.Converter  # built once
    layer: tf.Module

    def optimize(self, output, ranges=RANGES):
        return tf_dietcode.optimize(self.input, output, shape_ranges=ranges, overwrite=True,
                                    tuning=search.SearchOptions(**TINY_TUNING_OPTIONS), database=Database(self.database))

    def assert_serves(self, output, rows=5):
        """Loads the optimized model and checks it at x[rows, 16]; returns the model."""
        x = np.random.default_rng(1).uniform(-1, 1, (rows, 16)).astype(np.float32)
        loaded = tf.saved_model.load(str(output))
        served = loaded.signatures["serving_default"](x=x)["out"]
        np.testing.assert_allclose(served, self.layer.serve(x)["out"], rtol=1e-5, atol=1e-5)
        return loaded


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    """A one-layer SavedModel (dense + bias + relu) and its Converter, tuned quickly."""
    root = tmp_path_factory.mktemp("faults")
    layer = save_dense_model(root / "input", np.random.default_rng(0))
    converter = tf_dietcode.Converter(root / "input", shape_ranges=RANGES,
                                      tuning=search.SearchOptions(**TINY_TUNING_OPTIONS),
                                      database=Database(root / "tuning.jsonl"))
    return Model(root / "input", root / "tuning.jsonl", converter.convert().build(), layer)


def digest(path: pathlib.Path) -> dict[str, str]:
    """Every file under `path` with its SHA-256: equal digests mean byte-identical trees."""
    return {str(p.relative_to(path)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(path.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("error", [OSError(errno.ENOSPC, "No space left on device"), KeyboardInterrupt()],
                         ids=["disk full", "interrupted"])
@pytest.mark.parametrize("replacing", [False, True], ids=["new output", "replacing an output"])
def test_a_failed_write_leaves_no_output_or_the_previous_one(model, tmp_path, monkeypatch, error, replacing):
    output = tmp_path / "optimized"
    if replacing:
        model.converter.save(output)
    previous, before = digest(output), digest(model.input)
    half_written = []

    def fail(path, *args, **kwargs):  # saved_model.pb, written after the variables
        half_written.extend(p.name for p in pathlib.Path(path).parent.iterdir())
        raise error

    monkeypatch.setattr(file_io, "atomic_write_string_to_file", fail)
    with pytest.raises(type(error)):
        model.converter.save(output, overwrite=True)
    assert "variables" in half_written  # it failed mid-write
    assert digest(model.input) == before
    assert [p.name for p in tmp_path.iterdir()] == (["optimized"] if replacing else [])
    assert digest(output) == previous
    monkeypatch.undo()
    model.converter.save(output, overwrite=True)
    model.assert_serves(output)


OPTIMIZE = """
import sys
from tensorflow.python.lib.io import file_io
from tf_dietcode.tuning.database import Database
sys.path.insert(0, sys.argv[3])
from test_optimize_faults import RANGES, Model

def stall(path, *args, **kwargs):
    print("writing", path, flush=True)
    sys.stdin.read()   # until killed

if sys.argv[4] == "stall":
    file_io.atomic_write_string_to_file = stall
try:
    Model(sys.argv[1], sys.argv[5], None, None).optimize(sys.argv[2])
except PermissionError as error:
    print("refused:", error)
"""


def optimize_in_child(model, output, *, stall=False):
    """optimize() in a fresh process that file modes apply to; with stall, it stops when
    it is about to write saved_model.pb (the variables written) until stdin closes."""
    arguments = [str(model.input), str(output), str(pathlib.Path(__file__).parent),
                 "stall" if stall else "run", str(model.database)]
    return subprocess.Popen([*python_command(), "-c", OPTIMIZE, *arguments], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.parametrize("replacing", [False, True], ids=["new output", "replacing an output"])
def test_killed_mid_write_leaves_the_input_and_no_output_or_the_previous_one(model, tmp_path, replacing):
    output = tmp_path / "optimized"
    if replacing:
        model.converter.save(output)
    previous, before = digest(output), digest(model.input)
    child = optimize_in_child(model, output, stall=True)
    try:
        line = child.stdout.readline()
        assert line.startswith("writing"), child.stderr.read()[-3000:]
        child.send_signal(signal.SIGKILL)
    finally:
        child.kill()
        child.communicate()
    assert digest(model.input) == before
    assert digest(output) == previous
    leftovers = [p for p in tmp_path.iterdir() if p.name != "optimized"]
    assert leftovers and all(p.name.startswith(".optimized-") for p in leftovers)  # killed mid-write
    assert not any(tf.saved_model.contains_saved_model(str(p)) for p in leftovers)
    model.optimize(output)
    model.assert_serves(output)


def test_unwritable_output_location_fails_clearly_and_writes_nothing(model, tmp_path):
    """A read-only parent (in a child that file modes apply to) and a parent that is a file."""
    read_only = tmp_path / "read_only"
    read_only.mkdir(mode=0o555)
    try:
        child = optimize_in_child(model, read_only / "optimized")
        out, err = child.communicate(timeout=600)
        assert child.returncode == 0 and "refused: [Errno 13] Permission denied" in out, err[-3000:]
        assert list(read_only.iterdir()) == []
    finally:
        read_only.chmod(0o755)
    (tmp_path / "file").write_text("not a directory")
    with pytest.raises(OSError):
        model.converter.save(tmp_path / "file" / "optimized")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file", "read_only"]


@pytest.mark.parametrize("output", ["input", "input/optimized", "."])
def test_an_output_overlapping_the_input_is_refused(model, tmp_path, output):
    """Replacing a directory that holds the input would delete it; writing inside it would change it."""
    shutil.copytree(model.input, tmp_path / "input")
    before = digest(tmp_path)
    with pytest.raises(ValueError, match="must neither be, hold nor sit inside the input"):
        tf_dietcode.Converter(tmp_path / "input").save(tmp_path / output, overwrite=True)
    assert digest(tmp_path) == before


def test_an_output_replaced_in_one_process_runs_its_own_bundle(model, tmp_path):
    """A process keeps every bundle it loads, so the bundle of a model optimized over one it has
    loaded must not be taken for the one loaded before (it was, when both had the same file name:
    20 rows, outside the first model's tuned rows 1..8, then ran the generic kernel)."""
    output = tmp_path / "optimized"
    model.optimize(output)
    first = model.assert_serves(output)
    model.optimize(output, ranges={"x": [(1, 32), 16]})
    [manifest] = (output / "assets").glob("*.json")
    before, generic_before = tuned_calls.calls(manifest)
    model.assert_serves(output, rows=20)
    after, generic_after = tuned_calls.calls(manifest)
    assert (generic_after, sum(after.values())) == (generic_before, sum(before.values()) + 1)
    x = np.ones((5, 16), np.float32)  # the model loaded first still serves, its library gone from disk
    np.testing.assert_allclose(first.signatures["serving_default"](x=x)["out"], model.layer.serve(x)["out"],
                               rtol=1e-5, atol=1e-5)
