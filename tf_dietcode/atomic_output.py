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
    normally the staging directory replaces `target` with one rename; when it
    raises, the staging directory is removed and `target` is left as it was."""
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = pathlib.Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        yield staging
        if target.exists():
            shutil.rmtree(target)
        staging.rename(target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
