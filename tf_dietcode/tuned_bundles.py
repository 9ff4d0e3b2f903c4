"""Workloads to an installed kernel bundle: the step optimize() and keras.tune() share.

Each workload is searched, its dispatch built and the bundle written and checked
(tuning.tune) in a scratch directory, then installed under its content's name in
a bundle store (bundle_store: the scratch directory goes, the bundle's path must
outlive it). The tuner (TVM, XGBoost) is imported only here, when tuning runs.
"""

import dataclasses
import pathlib
import tempfile

from tf_dietcode import bundle_store


@dataclasses.dataclass
class TunedBundle:
    manifest: pathlib.Path  # the installed manifest, the library beside it
    kernels: dict           # Workload -> its entry in the manifest (the weight layout its kernels read, ...)


def tune_and_install(workloads: list, store: pathlib.Path | None = None, *, options=None, database=None,
                     progress: bool = True) -> TunedBundle:
    """One bundle with kernels for every workload, installed in `store` (default: bundle_store.root()).
    options: a tuning.search.SearchOptions (default: the full search); database: a tuning.database.Database."""
    from tf_dietcode.tuning.search import SearchOptions
    from tf_dietcode.tuning.tune import tune

    workloads = list(dict.fromkeys(workloads))
    with tempfile.TemporaryDirectory(prefix="tf_dietcode-") as scratch:
        directory = pathlib.Path(scratch) / "bundle"
        manifest = tune(workloads, directory, options=options or SearchOptions(), database=database,
                        progress=progress).manifest
        return TunedBundle(bundle_store.install(directory, store), dict(zip(workloads, manifest["workloads"])))
