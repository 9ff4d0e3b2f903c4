"""The tuning entry point: search each workload, build its dispatch, write one bundle."""

import dataclasses
import logging
import pathlib

from tf_dietcode.tuning import bundle, hardware
from tf_dietcode.tuning.database import Database
from tf_dietcode.tuning.dispatch import Dispatch, build_dispatch
from tf_dietcode.tuning.progress import TuningProgress, WorkloadTime, display_for
from tf_dietcode.tuning.runner import LocalRunner
from tf_dietcode.tuning.search import SearchOptions, SearchResult, search
from tf_dietcode.tuning.workload import Workload

_log = logging.getLogger(__name__)


@dataclasses.dataclass
class TuningReport:
    results: list[SearchResult]
    dispatches: list[Dispatch]
    manifest: dict
    times: dict[Workload, WorkloadTime] = dataclasses.field(default_factory=dict)  # each workload's search


def tune(workloads: list[Workload], bundle_dir: str | pathlib.Path, *,
         options: SearchOptions = SearchOptions(), database: Database | None = None,
         runner=None, progress: bool | TuningProgress = True) -> TuningReport:
    """Tunes every workload for its whole range and writes their kernel bundle. `progress`: the
    display of a job this tuning is part of, or whether to show one over these workloads."""
    hw = hardware.detect()
    database = database or Database()
    objects = database.kernel_objects()  # the runner's compiled kernels are the bundle's
    runner = runner or LocalRunner(hw, objects=objects)
    workloads = list(dict.fromkeys(workloads))
    _log.info("tuning %d workload(s), tuning database %s", len(workloads), database.path or "in memory")
    with display_for(progress, len(workloads), options.trials + options.finalists) as display:
        results = [search(w, hw, runner, options, database, display) for w in workloads]
        display.status("building the bundle")
        dispatches = [build_dispatch(r) for r in results]
        manifest = bundle.build_bundle(dispatches, hw, bundle_dir, [r.sample_shapes for r in results],
                                       options.seed, objects)
    return TuningReport(results, dispatches, manifest, {w: display.times[w] for w in workloads})
