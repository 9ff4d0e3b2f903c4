"""Tuning database: measurements as JSON lines keyed by workload and target.

Append-only, so an interrupted run loses at most its last line, and a later run
on the same workload and CPU resumes from what was measured. Each record names
the version of the kernel templates that made it: a measurement of code that
has since changed is not reused.
"""

import collections
import json
import math
import pathlib

from tf_dietcode.tuning.measure import Measurement
from tf_dietcode.tuning.micro_kernel import MicroKernel
from tf_dietcode.tuning.templates import TEMPLATES_VERSION
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

    def add(self, workload: Workload, target: str, measurements: list[Measurement]) -> None:
        records = [{"workload": workload.key(), "target": target, "templates": TEMPLATES_VERSION, **m.to_json()}
                   for m in measurements]
        self._records.extend(records)
        if self.path:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.path, "a") as f:
                f.writelines(json.dumps(r) + "\n" for r in records)

    def measurements(self, workload: Workload, target: str) -> list[Measurement]:
        """This workload's records on this target by these templates; records of another format are skipped."""
        key = workload.key()
        found = []
        for record in self._records:
            if (record.get("workload") == key and record.get("target") == target
                    and record.get("templates") == TEMPLATES_VERSION):
                try:
                    found.append(Measurement.from_json(record))
                except (KeyError, TypeError):
                    continue
        return found

    def best_kernels_elsewhere(self, workload: Workload, target: str, per_workload: int) -> list[MicroKernel]:
        """The fastest kernels (geometric mean GFLOP/s over their shapes) of each other
        workload of the same kind and operand layout on this target: where one tuning
        run or an earlier one already found good tiles for a similar product, a new
        workload's search starts from them instead of from scratch."""
        logs = collections.defaultdict(lambda: collections.defaultdict(list))
        for record in self._records:
            if record.get("target") != target or record.get("templates") != TEMPLATES_VERSION \
                    or record.get("workload") == workload.key() or not record.get("seconds"):
                continue
            try:
                other = Workload.from_key(record["workload"])
                measurement = Measurement.from_json(record)
            except (KeyError, TypeError, ValueError):
                continue
            if (other.kind, other.transpose_b, other.weight_layout) == \
                    (workload.kind, workload.transpose_b, workload.weight_layout):
                flops = other.flops(other.dims_at(measurement.shape))
                logs[other][measurement.kernel].append(math.log(flops / measurement.seconds))
        best = []
        for by_kernel in logs.values():
            ranked = sorted(by_kernel, key=lambda k: -sum(by_kernel[k]) / len(by_kernel[k]))
            best += ranked[:per_workload]
        return list(dict.fromkeys(best))
