"""Directories that appear whole or not at all (kernel bundles, optimized models).

Plain Python with no TensorFlow, so the tuner uses it too.
"""

import contextlib
import pathlib
import secrets
import shutil
from collections.abc import Iterator


@contextlib.contextmanager
def atomic_directory(target: pathlib.Path) -> Iterator[pathlib.Path]:
    """Yields an empty staging directory beside `target`. When the block ends
    normally the staging directory takes `target`'s place; when it raises, the
    staging directory is removed and `target` is left as it was."""
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = _new_directory(target.parent, f".{target.name}-")
    try:
        yield staging
        _replace(target, staging)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def _new_directory(parent: pathlib.Path, prefix: str) -> pathlib.Path:
    """A directory of a new name, with the mode the umask gives any other (as tf.saved_model.save's
    are): tempfile.mkdtemp's 0700 would keep out a server running as another user."""
    while True:
        path = parent / f"{prefix}{secrets.token_hex(6)}"
        try:
            path.mkdir()
            return path
        except FileExistsError:
            continue


def _replace(target: pathlib.Path, staging: pathlib.Path) -> None:
    """Renames `staging` to `target`. An old target is renamed aside first and
    removed last, never emptied in place: a process killed at any point leaves
    the old target whole, at `target` or (between the two renames) beside it
    as `<staging>-old`."""
    retired = staging.with_name(staging.name + "-old")
    if target.exists():
        target.rename(retired)
    try:
        staging.rename(target)
    except BaseException:
        if retired.exists():
            retired.rename(target)
        raise
    shutil.rmtree(retired, ignore_errors=True)
