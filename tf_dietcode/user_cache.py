"""The user's tf_dietcode cache: one directory for what tuning keeps between runs.

`$TF_DIETCODE_CACHE`, else `$XDG_CACHE_HOME/tf_dietcode`, else `~/.cache/tf_dietcode`:

    tuning.jsonl      the default tuning database, reused and extended by every optimize() and tune()
    tuning.kernels/   the kernels it measured, kept compiled (Database.kernel_objects)
    bundles/          installed kernel bundles (bundle_store)

Read at each use, not at import, so a process (a test session) can point it elsewhere.
"""

import os
import pathlib

TUNING_DATABASE = "tuning.jsonl"


def directory() -> pathlib.Path:
    if "TF_DIETCODE_CACHE" in os.environ:
        return pathlib.Path(os.environ["TF_DIETCODE_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or pathlib.Path.home() / ".cache"
    return pathlib.Path(base) / "tf_dietcode"


def tuning_database():
    """The default tuning database (a tuning.database.Database; the tuner is imported only here)."""
    from tf_dietcode.tuning.database import Database

    return Database(directory() / TUNING_DATABASE)
