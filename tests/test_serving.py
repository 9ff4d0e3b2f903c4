"""The TF Serving path: an optimized model loaded by the C++ SavedModel loader
(through the C API, serving/run_saved_model.cc) from a copied directory gives
Python's outputs for every signature and several T, and its warm-up file
parses with the serving protos and runs."""

import os
import pathlib
import shutil
import subprocess

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.framework import tensor_pb2

import tf_dietcode
from tf_dietcode import serving_warmup
from tf_dietcode.op_library import LIBRARY_PATH
from tf_dietcode.tuning import search

from conftest import TEXT_MODELS, TINY_TUNING_OPTIONS, shared_database

RUNNER_SOURCE = pathlib.Path(__file__).resolve().parents[1] / "serving" / "run_saved_model.cc"
LENGTHS = [1, 5, 12, 13, 29]  # 13 and 29 lie outside the tuned range 1..12


@pytest.fixture(scope="module")
def runner(tmp_path_factory):
    """run_saved_model built against the pip wheel's libtensorflow_cc.so.2."""
    binary = tmp_path_factory.mktemp("runner") / "run_saved_model"
    lib = tf.sysconfig.get_lib()
    subprocess.run(["g++", "-O1", "-Wno-deprecated-declarations", *tf.sysconfig.get_compile_flags(),
                    str(RUNNER_SOURCE), "-o", str(binary), f"-L{lib}", "-l:libtensorflow_cc.so.2",
                    "-l:libtensorflow_framework.so.2", f"-Wl,-rpath,{lib}"], check=True)
    return binary


def write_request(directory: pathlib.Path, signature: str, inputs: dict[str, np.ndarray]) -> pathlib.Path:
    directory.mkdir(parents=True)
    (directory / "signature").write_text(signature)
    for name, value in inputs.items():
        (directory / f"{name}.pb").write_bytes(tf.make_tensor_proto(value).SerializeToString())
    return directory


def run_requests(runner, model_dir, requests) -> subprocess.CompletedProcess:
    """The runner on the requests; INFO logs on, so the bundle's load is seen."""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "0"}
    result = subprocess.run([str(runner), str(LIBRARY_PATH), str(model_dir), *map(str, requests)],
                            capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def read_tensor(path: pathlib.Path) -> np.ndarray:
    return tf.make_ndarray(tensor_pb2.TensorProto.FromString(path.read_bytes()))


@pytest.fixture(scope="module")
def served(optimized_encoder, tmp_path_factory):
    """The optimized model copied elsewhere, loaded as TF Serving would, and its signatures."""
    root, _ = optimized_encoder
    copy = tmp_path_factory.mktemp("serving") / "model" / "1"   # Serving's <model>/<version> layout
    shutil.copytree(root / "optimized", copy)
    return copy, tf.saved_model.load(str(copy)).signatures


def test_cpp_loader_outputs_equal_python_for_every_signature(runner, served, tmp_path, rng):
    model_dir, signatures = served
    requests = {(key, t): write_request(tmp_path / f"{key}_{t}", key,
                                        {"x": rng.uniform(-1, 1, (2, t, 32)).astype(np.float32)})
                for key in signatures for t in LENGTHS}
    result = run_requests(runner, model_dir, requests.values())
    # The bundle came from the copy's own assets: no absolute path to where the model was written.
    assert f"kernel bundle '{model_dir}/assets/" in result.stderr
    assert "is not used" not in result.stderr
    for (key, t), directory in requests.items():
        for output, expected in signatures[key](x=read_tensor(directory / "x.pb")).items():
            np.testing.assert_allclose(read_tensor(directory / f"{output}.out.pb"), expected.numpy(), rtol=1e-6, atol=1e-6,
                                       err_msg=f"{key} T={t} {output}")


def test_warmup_file_parses_and_its_requests_run(runner, optimized_encoder, served, tmp_path):
    root, report = optimized_encoder
    model_dir, signatures = served
    requests = serving_warmup.read(model_dir / serving_warmup.WARMUP_FILE)
    assert len(requests) == report.warmup_requests > 0
    shapes = {(r.model_spec.signature_name, tuple(tf.TensorShape(r.inputs["x"].tensor_shape).as_list()))
              for r in requests}
    # batch 1..2 and T 1..12: short and long sequences for every signature
    assert shapes == {(key, shape) for key in ("serve", "serving_default")
                      for shape in [(1, 1, 32), (1, 4, 32), (1, 8, 32), (2, 12, 32)]}
    original = tf.saved_model.load(str(root / "original")).signatures
    directories = []
    for i, request in enumerate(requests):
        key = request.model_spec.signature_name
        inputs = {name: tf.make_ndarray(proto) for name, proto in request.inputs.items()}
        for output, value in signatures[key](**inputs).items():
            np.testing.assert_allclose(value.numpy(), original[key](**inputs)[output].numpy(), rtol=1e-5, atol=1e-6)
        directories.append(write_request(tmp_path / str(i), key, inputs))
    run_requests(runner, model_dir, directories)   # the C++ loader takes them too
    assert all(any(d.glob("*.out.pb")) for d in directories)


@pytest.mark.parametrize("save_model", TEXT_MODELS)
def test_a_text_model_serves_from_its_own_copy_of_the_vocabulary(runner, tmp_path, rng, save_model):
    """The C++ loader fills the lookup table from the optimized model's own assets (for a TF1
    model by its init op, saved again): the original model and its vocabulary file are gone."""
    (tmp_path / "vocab.txt").write_text("\n".join(f"w{i}" for i in range(50)))
    save_model(tmp_path / "in", tmp_path / "vocab.txt", rng)
    tf_dietcode.optimize(tmp_path / "in", tmp_path / "out", tuning=search.SearchOptions(**TINY_TUNING_OPTIONS),
                         database=shared_database(), shape_ranges={"words": [(1, 2), (1, 9)]})
    original = tf.saved_model.load(str(tmp_path / "in")).signatures["serving_default"]
    model_dir = tmp_path / "serving" / "text" / "1"
    shutil.copytree(tmp_path / "out", model_dir)
    for path in (tmp_path / "in", tmp_path / "out", tmp_path / "vocab.txt"):
        shutil.rmtree(path) if path.is_dir() else path.unlink()
    texts = [np.array([f"w{i}" for i in rng.integers(0, 60, shape).ravel()], dtype=object).reshape(shape)
             for shape in [(1, 1), (2, 9), (3, 12)]]
    requests = [write_request(tmp_path / str(i), "serving_default", {"words": text}) for i, text in enumerate(texts)]
    run_requests(runner, model_dir, requests)
    for directory, text in zip(requests, texts):
        np.testing.assert_allclose(read_tensor(directory / "output_0.out.pb"),
                                   original(words=tf.constant(text))["output_0"].numpy(), rtol=1e-5, atol=1e-5)


def test_runner_reports_a_missing_op_library_clearly(runner, served):
    model_dir, _ = served
    result = subprocess.run([str(runner), "/nonexistent/libops.so", str(model_dir)], capture_output=True, text=True)
    assert result.returncode == 1 and "loading the op library /nonexistent/libops.so" in result.stderr


def test_without_the_ops_the_model_fails_as_serving_would(runner, served, tmp_path):
    """A binary without the ops (here: a library that registers none) cannot load the model:
    `Op type not registered`, as docs/serving.md explains."""
    model_dir, _ = served
    empty = tmp_path / "libempty.so"
    (tmp_path / "empty.cc").write_text("extern \"C\" int tf_dietcode_nothing() { return 0; }\n")
    subprocess.run(["g++", "-shared", "-fPIC", str(tmp_path / "empty.cc"), "-o", str(empty)], check=True)
    result = subprocess.run([str(runner), str(empty), str(model_dir)], capture_output=True, text=True)
    assert result.returncode == 1 and "Op type not registered 'Dietcode" in result.stderr
