"""Tuning database: measurements as JSON lines keyed by workload and target.

Append-only, so an interrupted run loses at most its last line, and a later run
on the same workload and CPU resumes from what was measured. Each record names
the version of the kernel templates that made it: a measurement of code that
has since changed is not reused. A record of kernels built with TIR passes left
out (TF_DIETCODE_DISABLE_PASSES) names them, and is used only by runs leaving out
the same ones: an A/B tuning never reuses the other side's measurements.
"""

import collections
import json
import math
import pathlib

from tf_dietcode.tuning.cost_model import observed_gflops
from tf_dietcode.tuning.kernel_objects import KernelObjects
from tf_dietcode.tuning.measure import Measurement, latest
from tf_dietcode.tuning.micro_kernel import MicroKernel
from tf_dietcode.tuning.templates import TEMPLATES_VERSION
from tf_dietcode.tuning.tir_passes import pipeline
from tf_dietcode.tuning.workload import Workload


class Database:
    def __init__(self, path: str | pathlib.Path | None = None):
        """path=None keeps records in memory only."""
        self.path = pathlib.Path(path) if path else None
        self._records: list[dict] = []
        if self.path and self.path.exists():
            for line in self.path.read_text().splitlines():
                try:
                    self._records.append(json.loads(line))
                except json.JSONDecodeError:
                    continue  # a line cut short by an interrupted run

    def kernel_objects(self) -> KernelObjects:
        """Where the kernels measured into this database are kept compiled: beside its file
        (<name>.kernels/), or for the process when it has none."""
        return KernelObjects(self.path.with_suffix(".kernels")) if self.path else KernelObjects()

    def add(self, workload: Workload, target: str, measurements: list[Measurement]) -> None:
        disabled = pipeline.disabled_passes()
        records = [{"workload": workload.key(), "target": target, "templates": TEMPLATES_VERSION,
                    **({"disabled_passes": list(disabled)} if disabled else {}), **m.to_json()}
                   for m in measurements]
        self._records.extend(records)
        if self.path:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.path, "a") as f:
                f.writelines(json.dumps(r) + "\n" for r in records)

    def _usable(self, target: str, kernel_type: type):
        """(workload key, measurement) of every record on this target by these templates and these
        TIR passes, its kernel a `kernel_type` (the target's); records of another format are skipped."""
        disabled = list(pipeline.disabled_passes())
        for record in self._records:
            if record.get("target") == target and record.get("templates") == TEMPLATES_VERSION \
                    and record.get("disabled_passes", []) == disabled:
                try:
                    yield record["workload"], Measurement.from_json(record, kernel_type)
                except (KeyError, TypeError):
                    continue

    def measurements(self, workload: Workload, target: str, kernel_type: type = MicroKernel) -> list[Measurement]:
        """This workload's records on this target by these templates, the latest of each (kernel, shape)."""
        key = workload.key()
        return latest([measurement for record_key, measurement in self._usable(target, kernel_type)
                       if record_key == key])

    def best_kernels_elsewhere(self, workload: Workload, target: str, per_workload: int,
                               kernel_type: type = MicroKernel) -> list:
        """The fastest kernels (geometric mean GFLOP/s over the shapes most of them were measured at:
        the samples, not the finalists' shapes between them) of each other workload of the same kind,
        operand layout and cache state on this target: where one tuning run or an earlier one already
        found good tiles for a similar product, a new workload's search starts from them instead of
        from scratch."""
        own_key, by_workload = workload.key(), collections.defaultdict(list)
        for key, measurement in self._usable(target, kernel_type):
            if key != own_key and measurement.seconds:
                by_workload[key].append(measurement)
        best = []
        for key, found in by_workload.items():
            found = latest(found)  # a kernel timed again (the finalists) counts by that timing alone
            try:
                other = Workload.from_key(key)
            except (TypeError, ValueError):
                continue
            if (other.kind, other.transpose_b, other.weight_layout, other.cold_weight) != \
                    (workload.kind, workload.transpose_b, workload.weight_layout, workload.cold_weight):
                continue
            kernels_at = collections.Counter(measurement.shape for measurement in found)
            kernels = len({measurement.kernel for measurement in found})
            logs = collections.defaultdict(list)
            for measurement in found:
                if 2 * kernels_at[measurement.shape] > kernels:
                    logs[measurement.kernel].append(math.log(observed_gflops(other, measurement)))
            best += sorted(logs, key=lambda k: -sum(logs[k]) / len(logs[k]))[:per_workload]
        return list(dict.fromkeys(best))
