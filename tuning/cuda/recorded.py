"""Measurements taken on a GPU, served to the search as its runner.

The GPU machine has no TVM, so the search cannot measure candidates there as it
goes; bench/cuda_kernels.py measures a whole kernel set once instead, and this
runner answers the search's requests from that record: a candidate's
"measurement" is the recorded time of that kernel at that shape (one recorded
with an error above tolerance, or never recorded, comes back as a failure,
which the search skips like any failed measurement).
"""

import csv
import pathlib
import statistics

from tf_dietcode.tuning.cuda.space import GpuKernel
from tf_dietcode.tuning.measure import Measurement
from tf_dietcode.tuning.workload import Workload

TOLERANCE = 1e-5  # as bench/cuda_kernels.py checks: max |error| / max |reference| against float64


def shape_of(workload: Workload, dims: dict[str, int]) -> tuple[int, ...]:
    """The workload's shape variables' values at these dims."""
    return tuple(dims[names[0]] for names, _ in workload.variables())


class RecordedRunner:
    """A runner over recorded GPU measurements: {workload key: {(kernel, shape): seconds or None}}."""

    def __init__(self, records: dict[str, dict[tuple[GpuKernel, tuple[int, ...]], float | None]]):
        self.records = records

    @classmethod
    def load(cls, workloads: list[Workload], measurements_csv: pathlib.Path) -> "RecordedRunner":
        """The symbolic kernels' records of these workloads from a GPU run's CSV."""
        by_name = {w.describe(): w for w in workloads}
        timings: dict[str, dict] = {w.key(): {} for w in workloads}
        with open(measurements_csv, newline="") as f:
            for row in csv.DictReader(f):
                workload = by_name.get(row["workload"])
                if workload is None or row["kernel"].startswith("cublas") or row["static"] == "True":
                    continue
                shape = shape_of(workload, {d: int(row[d]) for d in "bmnk"})
                good = float(row["error"]) <= TOLERANCE
                timings[workload.key()].setdefault((GpuKernel.from_name(row["kernel"]), shape), []).append(
                    float(row["seconds"]) if good else None)
        # a kernel timed in several rounds: the median; wrong in any: a failure
        return cls({key: {entry: None if None in times else statistics.median(times) for entry, times in table.items()}
                    for key, table in timings.items()})

    def run(self, workload: Workload, kernels: list[GpuKernel], shapes: list[tuple[int, ...]], seed: int = 0,
            best=None) -> list[Measurement]:
        del seed, best  # the record is what it is
        table = self.records[workload.key()]
        results = []
        for kernel in kernels:
            for shape in shapes:
                seconds = table.get((kernel, shape))
                error = None if seconds else ("not recorded" if (kernel, shape) not in table else "wrong result")
                results.append(Measurement(kernel, shape, seconds, error))
        return results
