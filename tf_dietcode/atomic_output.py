"""Directories that appear whole or not at all (kernel bundles, optimized models).

Plain Python with no TensorFlow, so the tuner uses it too.
"""

import contextlib
import pathlib
import shutil
import tempfile
from collections.abc import Iterator


@contextlib.contextmanager
def atomic_directory(target: pathlib.Path) -> Iterator[pathlib.Path]:
    """Yields an empty staging directory beside `target`. When the block ends
    normally the staging directory takes `target`'s place; when it raises, the
    staging directory is removed and `target` is left as it was."""
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = pathlib.Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        yield staging
        _replace(target, staging)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


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
