"""Bundles and optimized models appear whole or not at all, readable as any other output."""

import contextlib
import json
import os
import signal
import stat
import subprocess
import sys

import pytest

from tf_dietcode import bundle_store
from tf_dietcode.atomic_output import atomic_directory


@contextlib.contextmanager
def umask(mask):
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


def mode(path):
    return stat.S_IMODE(path.stat().st_mode)


def test_a_failure_leaves_the_old_output_and_no_staging(tmp_path):
    target = tmp_path / "model"
    target.mkdir()
    (target / "old").write_text("kept")
    with pytest.raises(RuntimeError):
        with atomic_directory(target) as staging:
            (staging / "half").write_text("written")
            raise RuntimeError("disk full")
    assert [p.name for p in tmp_path.iterdir()] == ["model"]
    assert [p.name for p in target.iterdir()] == ["old"]


def test_success_replaces_the_output_in_one_step(tmp_path):
    target = tmp_path / "model"
    target.mkdir()
    (target / "old").write_text("replaced")
    with atomic_directory(target) as staging:
        assert not target.samefile(staging) and staging.parent == tmp_path
        (staging / "new").write_text("whole")
    assert [p.name for p in tmp_path.iterdir()] == ["model"]
    assert [p.name for p in target.iterdir()] == ["new"]


def test_the_output_and_stored_bundles_have_the_modes_the_umask_gives(tmp_path):
    """As tf.saved_model.save's output does: a server running as another user reads them."""
    (tmp_path / "bundle").mkdir()
    (tmp_path / "bundle" / "kernels.so").write_bytes(b"library")
    (tmp_path / "bundle" / "manifest.json").write_text(json.dumps({"library": "kernels.so"}))
    with umask(0o022):
        with atomic_directory(tmp_path / "model") as staging:
            (staging / "saved_model.pb").write_text("new")
        stored = bundle_store.install(tmp_path / "bundle" / "manifest.json", store=tmp_path / "store")
    assert mode(tmp_path / "model") == 0o755
    assert [mode(path) for path in bundle_store.files(stored)] == [0o644, 0o644]


KILLED_AT_STEP = """
import os, pathlib, signal, sys
from tf_dietcode.atomic_output import atomic_directory

target, step = pathlib.Path(sys.argv[1]), int(sys.argv[2])
steps = 0

def killing(change):
    def counted(*args, **kwargs):
        global steps
        steps += 1
        if steps == step:
            os.kill(os.getpid(), signal.SIGKILL)
        return change(*args, **kwargs)
    return counted

with atomic_directory(target) as staging:
    for name, text in {"saved_model.pb": "new", "variables/data": "new", "assets/kernels.so": "new"}.items():
        (staging / name).parent.mkdir(exist_ok=True)
        (staging / name).write_text(text)
    for name in ("rename", "replace", "unlink", "rmdir", "remove"):
        setattr(os, name, killing(getattr(os, name)))
"""


def tree(path):
    return {str(p.relative_to(path)): p.read_text() for p in path.rglob("*") if p.is_file()}


def test_killed_at_any_step_of_a_replacement_the_old_output_survives_whole(tmp_path):
    """The process is killed at its first, second, ... change to the file system after the
    staging directory is written, until one run completes: at every step the output is the old
    one or the new one, whole, or (between two renames) absent with the old one whole beside it."""
    old = {"saved_model.pb": "old", "variables/data": "old", "assets/kernels.so": "old"}
    new = dict.fromkeys(old, "new")
    for step in range(1, 50):
        root = tmp_path / str(step)
        for name, text in old.items():
            (root / "model" / name).parent.mkdir(parents=True, exist_ok=True)
            (root / "model" / name).write_text(text)
        result = subprocess.run([sys.executable, "-c", KILLED_AT_STEP, str(root / "model"), str(step)],
                                capture_output=True, text=True, timeout=60)
        trees = [tree(p) for p in root.iterdir()]
        if result.returncode == 0:
            assert trees == [new] and step > 2, (step, trees)
            return
        assert result.returncode == -signal.SIGKILL, result.stderr
        if (root / "model").exists():
            assert tree(root / "model") in (old, new), (step, trees)
        else:
            assert old in trees, (step, trees)
    pytest.fail("the replacement never completed")
