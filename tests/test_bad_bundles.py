"""A kernel bundle that is missing, corrupted, or built for another machine
or TVM never crashes and never returns garbage: the op says why once (a
warning) and computes through the generic kernel. A kernel that fails at run
time becomes a TF error status."""

import hashlib
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

import file_modes
from conftest import random_tensor
from tf_dietcode import cpu_features, ops
from tf_dietcode.tuning import bundle
from tf_dietcode.tuning.templates import dense


def edit_manifest(change):
    def edit(directory):
        path = directory / bundle.MANIFEST
        manifest = json.loads(path.read_text())
        change(manifest)
        path.write_text(json.dumps(manifest))
    return edit


def truncate_library(directory):
    library = directory / bundle.LIBRARY
    library.write_bytes(library.read_bytes()[: library.stat().st_size // 2])


def truncate_manifest(directory):
    manifest = directory / bundle.MANIFEST
    manifest.write_text(manifest.read_text()[: manifest.stat().st_size // 2])


def lacking_feature():
    """A flag this CPU lacks: one the tuner records, or where it has them all (a Xeon with
    AVX-512 and AMX), Arm's SVE, which no x86 /proc/cpuinfo lists."""
    missing = sorted(cpu_features.SIMD_FLAGS - set(cpu_features.simd_features()))
    return missing[0] if missing else "sve"


CORRUPTIONS = {
    "missing bundle": (lambda d: shutil.rmtree(d), "cannot read"),
    "manifest not JSON": (lambda d: (d / bundle.MANIFEST).write_text("{\"format\": 1,"), "not JSON"),
    "manifest not an object": (lambda d: (d / bundle.MANIFEST).write_text("[1, 2]"), ""),
    "another format": (edit_manifest(lambda m: m.update(format=99)), "format 99"),
    "another target": (edit_manifest(lambda m: m["target"].update(kind="cuda")), "target 'cuda'"),
    "another CPU": (edit_manifest(lambda m: m["cpu_features"].append(lacking_feature())), "which this CPU lacks"),
    "another TVM": (edit_manifest(lambda m: m.update(tvm="0.19.0")), "TVM 0.19.0"),
    "truncated library": (truncate_library, "SHA-256"),
    "wrong checksum": (edit_manifest(lambda m: m.update(sha256="0" * 64)), "SHA-256"),
    "missing field": (edit_manifest(lambda m: m.pop("sha256")), "lacks 'sha256'"),
    "missing kernel": (edit_manifest(lambda m: m["workloads"][0]["kernels"][0].update(symbol="nope")),
                       "lacks kernel nope"),
    "missing library": (lambda d: (d / bundle.LIBRARY).unlink(), "cannot read"),
    "truncated manifest": (truncate_manifest, "not JSON"),
    "field of another type": (edit_manifest(lambda m: m.update(workloads="all")), "manifest field 'workloads'"),
    "missing dispatch": (edit_manifest(lambda m: m["workloads"][1].update(dispatch="nope")),
                         "lacks dispatch function nope"),
}


@pytest.mark.parametrize("case", sorted(CORRUPTIONS))
def test_bad_bundle_computes_generically_and_says_why(case, tuned_bundle, tmp_path, rng):
    source, report = tuned_bundle
    corrupt, reason = CORRUPTIONS[case]
    path = tmp_path / "bundle"
    shutil.copytree(source, path)
    corrupt(path)
    w, bias = random_tensor(rng, (40, 24)), random_tensor(rng, (40,))
    wp, _ = dense.weight_operand(w, report.manifest["workloads"][0]["weight_layout"])
    for m in (3, 17):
        x = random_tensor(rng, (m, 24))
        out = ops.fused_matmul(x, wp, bias, activation="relu", packed_n=40, bundle=str(path)).numpy()
        np.testing.assert_allclose(out, np.maximum(x @ w.T + bias, 0), rtol=1e-4, atol=1e-4)
    stats = ops.bundle_stats(str(path))
    assert reason in stats["problem"] and stats["problem"], stats
    assert stats["generic_calls"] == 0 and stats["workloads"] == []  # not even looked at


WARNS_ONCE = """
import sys
import numpy as np
from tf_dietcode import ops

q = np.ones((3, 5, 8), np.float32)
for _ in range(3):
    ops.fused_batch_matmul_transpose(q, q, [0, 1, 2], adj_y=True, bundle=sys.argv[1]).numpy()
"""


def test_a_bad_bundle_is_reported_once_per_process(tuned_bundle, tmp_path):
    """In a fresh process with TF's warnings on (the suite may run with them off)."""
    source, _ = tuned_bundle
    path = tmp_path / "bundle"
    shutil.copytree(source, path)
    truncate_library(path)
    result = subprocess.run([sys.executable, "-c", WARNS_ONCE, str(path)], capture_output=True, text=True,
                            timeout=300, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "0"})
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stderr.count(f"kernel bundle '{path}' is not used") == 1, result.stderr[-3000:]
    assert "SHA-256" in result.stderr


THROUGH_BUNDLES = """
import json, sys
import numpy as np
from tf_dietcode import ops

q = np.ones((3, 5, 8), np.float32)
for path in sys.argv[1:]:
    out = ops.fused_batch_matmul_transpose(q, q, [0, 1, 2], adj_y=True, bundle=path).numpy()
    assert np.allclose(out, 8.0), out
print(json.dumps([ops.bundle_stats(path)["problem"] for path in sys.argv[1:]]))
"""


def problems_in_child(paths, python=(sys.executable,)):
    """Runs a tuned-range product through each bundle in a fresh process, so that a crash
    fails this test alone; returns why each bundle is not used."""
    result = subprocess.run([*python, "-c", THROUGH_BUNDLES, *map(str, paths)], capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_unreadable_bundles_are_warnings(tuned_bundle, tmp_path):
    """Library, manifest or directory unreadable, in a child that file modes apply to (as root too)."""
    source, _ = tuned_bundle
    library, manifest, directory = (tmp_path / name for name in ("library", "manifest", "directory"))
    for path in (library, manifest, directory):
        shutil.copytree(source, path)
    os.chmod(library / bundle.LIBRARY, 0)
    os.chmod(manifest / bundle.MANIFEST, 0)
    os.chmod(directory, 0o600)
    try:
        problems = problems_in_child([library, manifest, directory], file_modes.python_command())
    finally:
        os.chmod(directory, 0o700)
    assert problems == [f"cannot read {library / bundle.LIBRARY}", f"cannot read {manifest / bundle.MANIFEST}",
                        f"cannot read {directory / bundle.MANIFEST}"]


def test_a_library_cut_short_after_its_checksum_is_rejected_not_run(tuned_bundle, tmp_path):
    """Its first 4 KiB (ELF and program headers) with a matching SHA-256: dlopen would map it,
    and running a kernel past its end would kill the process with SIGBUS."""
    source, _ = tuned_bundle
    path = tmp_path / "bundle"
    shutil.copytree(source, path)
    (path / bundle.LIBRARY).write_bytes((path / bundle.LIBRARY).read_bytes()[:4096])
    sha256 = hashlib.sha256((path / bundle.LIBRARY).read_bytes()).hexdigest()
    edit_manifest(lambda m: m.update(sha256=sha256))(path)
    [problem] = problems_in_child([path])
    assert problem.startswith(f"{path / bundle.LIBRARY} is truncated"), problem


FAILING_KERNEL = """
import sys
import numpy as np
import tensorflow as tf
from tf_dietcode import ops

path, blocks, tile_n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
wp = np.zeros((blocks, 24, tile_n), np.float32)
try:
    ops.fused_matmul(np.ones((5, 24), np.float32), wp, np.ones(40, np.float32), activation="relu",
                     packed_n=40, bundle=path).numpy()
except tf.errors.InternalError as error:
    assert "tuned kernel" in str(error) and "failed" in str(error), error
    q = np.ones((3, 5, 8), np.float32)
    out = ops.fused_batch_matmul_transpose(q, q, [0, 1, 2], adj_y=True, bundle=path).numpy()
    assert np.allclose(out, 8.0)
    print("survived")
"""


def test_a_failing_kernel_is_an_error_status_not_a_crash(tuned_bundle, tmp_path):
    """The manifest lies about the packed weight's layout, so the kernel gets
    an operand of the wrong shape and raises inside TVM code. Run in a fresh
    process that never imports TVM's Python package, which would make
    libtvm_ffi global and hide the RTLD_LOCAL pitfall."""
    source, report = tuned_bundle
    path = tmp_path / "bundle"
    shutil.copytree(source, path)
    layout = report.manifest["workloads"][0]["weight_layout"]
    edit_manifest(lambda m: m["workloads"][0]["weight_layout"].update(blocks=layout["blocks"] + 1))(path)
    result = subprocess.run([sys.executable, "-c", FAILING_KERNEL, str(path), str(layout["blocks"] + 1),
                             str(layout["tile_n"])], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0 and "survived" in result.stdout, result.stderr[-3000:]
