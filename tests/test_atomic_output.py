"""Bundles and optimized models appear whole or not at all."""

import pytest

from tf_dietcode.atomic_output import atomic_directory


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
