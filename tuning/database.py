"""Tuning database: measurements as JSON lines keyed by workload and target.

Append-only, so an interrupted run loses at most its last line, and a later run
on the same workload and CPU resumes from what was measured. Each record names
the version of the kernel templates that made it: a measurement of code that
has since changed is not reused.
"""

import json
import pathlib

from tf_dietcode.tuning.measure import Measurement
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
