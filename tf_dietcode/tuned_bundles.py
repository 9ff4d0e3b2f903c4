"""Workloads to an installed kernel bundle: the step optimize() and keras.tune() share.

Each workload is searched, its dispatch built and the bundle written and checked
(tuning.tune) in a scratch directory, then installed under its content's name in
a bundle store (bundle_store: the scratch directory goes, the bundle's path must
outlive it). Without a database of its own, the tuning reads and extends the
user's (user_cache), so a workload tuned once is not tuned again. The tuner
(TVM, XGBoost) is imported only here, when tuning runs.
"""

import dataclasses
import pathlib
import tempfile

from tf_dietcode import bundle_store, user_cache


@dataclasses.dataclass
class TunedBundle:
    manifest: pathlib.Path  # the installed manifest, the library beside it
    kernels: dict           # Workload -> its entry in the manifest (the weight layout its kernels read, ...)
    times: dict             # Workload -> tuning.progress.WorkloadTime of its search


def tune_and_install(workloads: list, store: pathlib.Path | None = None, *, options=None, database=None,
                     progress=True) -> TunedBundle:
    """One bundle with kernels for every workload, installed in `store` (default: bundle_store.root()).
    options: a tuning.search.SearchOptions or a budget's name (default: the full search); database: a
    tuning.database.Database (default: the user's); progress: a tuning.progress.TuningProgress of a job
    this is part of, or whether to show one."""
    from tf_dietcode.tuning.search import budget
    from tf_dietcode.tuning.tune import tune

    workloads = list(dict.fromkeys(workloads))
    with tempfile.TemporaryDirectory(prefix="tf_dietcode-") as scratch:
        directory = pathlib.Path(scratch) / "bundle"
        report = tune(workloads, directory, options=budget(options),
                      database=user_cache.tuning_database() if database is None else database, progress=progress)
        return TunedBundle(bundle_store.install(directory, store), dict(zip(workloads, report.manifest["workloads"])),
                           report.times)
