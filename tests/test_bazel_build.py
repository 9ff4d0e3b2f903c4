"""The BUILD file's targets, built by Debian's bazel-bootstrap offline against
the pip wheels (serving/bazel/build_offline.py): the alwayslink library that
TF Serving links registers every op and its CPU kernel in a binary that names
none of them, and the loadable library passes the op tests.

Needs `bazel` (Bazel 4, `apt-get install bazel-bootstrap`, which `make test`
installs when it runs as root); without it the tests skip, except in CI."""

import importlib.util
import os
import pathlib
import re
import shutil
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(shutil.which("bazel") is None and not os.environ.get("CI"),
                                reason="bazel (Debian's bazel-bootstrap) is not installed")


@pytest.fixture(scope="module")
def bazel_build():
    spec = importlib.util.spec_from_file_location("build_offline", REPO / "serving" / "bazel" / "build_offline.py")
    build_offline = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(build_offline)
    return build_offline.build(REPO / "build" / "bazel")


def registered_in_source() -> set[str]:
    return {name for source in (REPO / "ops").glob("*.cc")
            for name in re.findall(r'REGISTER_OP\("(\w+)"\)', source.read_text())}


def test_alwayslink_library_registers_every_op_with_its_cpu_kernel(bazel_build):
    result = subprocess.run([str(bazel_build["registered_ops"])], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    kernels = dict(line.split(" ", 1) for line in result.stdout.splitlines())
    # 3 fused ops, bundle stats, layer norm, softmax, the int8 and bfloat16 dense ops and their ISA report,
    # the beam cache's reorder-append
    assert set(kernels) == registered_in_source() and len(kernels) == 10
    assert all("device='CPU'" in devices for devices in kernels.values()), kernels


def test_bazel_built_op_library_passes_the_op_tests(bazel_build):
    env = {**os.environ, "TF_DIETCODE_OP_LIBRARY": str(bazel_build["op_library"])}
    tests = [str(REPO / "tests" / name) for name in ("test_fused_matmul.py", "test_fused_batch_matmul.py",
                                                     "test_tuned_ops.py", "test_bad_input.py", "test_layer_norm.py",
                                                     "test_int8_matmul.py", "test_bf16_matmul.py")]
    result = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *tests],
                            capture_output=True, text=True, env=env, timeout=900)
    assert result.returncode == 0, result.stdout[-4000:]
    assert f"tf_dietcode op library: {bazel_build['op_library']}" in result.stdout
    assert re.search(r"\d+ passed", result.stdout)
