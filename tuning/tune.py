"""The tuning entry point: search each workload, build its dispatch, write one bundle."""

import dataclasses
import pathlib

from tf_dietcode.tuning import bundle, hardware
from tf_dietcode.tuning.database import Database
from tf_dietcode.tuning.dispatch import Dispatch, build_dispatch
from tf_dietcode.tuning.runner import LocalRunner
from tf_dietcode.tuning.search import SearchOptions, SearchResult, search
from tf_dietcode.tuning.workload import Workload


@dataclasses.dataclass
class TuningReport:
    results: list[SearchResult]
    dispatches: list[Dispatch]
    manifest: dict


def tune(workloads: list[Workload], bundle_dir: str | pathlib.Path, *,
         options: SearchOptions = SearchOptions(), database: Database | None = None,
         runner=None, progress: bool = True) -> TuningReport:
    """Tunes every workload for its whole range and writes their kernel bundle."""
    hw = hardware.detect()
    database = database or Database()
    objects = database.kernel_objects()  # the runner's compiled kernels are the bundle's
    runner = runner or LocalRunner(hw, objects=objects)
    results = [search(w, hw, runner, options, database, progress) for w in dict.fromkeys(workloads)]
    dispatches = [build_dispatch(r) for r in results]
    manifest = bundle.build_bundle(dispatches, hw, bundle_dir, [r.sample_shapes for r in results],
                                   options.seed, objects)
    return TuningReport(results, dispatches, manifest)
