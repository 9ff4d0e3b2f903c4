"""Child process of LocalRunner: compiles and measures the kernels of each job it is sent.

Reads one JSON job per line on stdin until it closes. Compiles every kernel of the
job, then measures them together (measure.measure_modules: repeats interleaved
across kernels). Before each step of a kernel's work it writes {"busy": index}, so
that the parent knows which kernel hung or crashed; then one JSON line per
(kernel, shape) record and {"done": count}, flushing as it goes.
"""

import json
import sys

import numpy as np
import tvm

from tf_dietcode.tuning import hardware, measure
from tf_dietcode.tuning.micro_kernel import MicroKernel
from tf_dietcode.tuning.workload import Workload


def _emit(record: dict) -> None:
    sys.stdout.write(json.dumps(record) + "\n")
    sys.stdout.flush()


def run_job(job: dict) -> None:
    workload = Workload.from_key(job["workload"])
    hw = hardware.detect()
    shapes = [tuple(shape) for shape in job["shapes"]]
    kernels = [MicroKernel(**fields) for fields in job["kernels"]]
    compiled, records = [], []
    for index, kernel in enumerate(kernels):
        _emit({"busy": index})
        try:
            compiled.append((index, kernel, measure.symbolic_kernel(workload, kernel, hw).mod))
        except Exception as error:  # noqa: BLE001 - a kernel that fails to build is a record
            records += [measure.Measurement.failed(kernel, shape, error) for shape in shapes]
    records += measure.measure_modules(
        [(kernel, module) for _, kernel, module in compiled], tvm.cpu(), workload, shapes,
        np.random.default_rng(job["seed"]), job["repeats"], job["min_repeat_ms"],
        {tuple(shape): seconds for shape, seconds in job["best"]},
        on_step=lambda position: _emit({"busy": compiled[position][0]}))
    for record in records:
        _emit(record.to_json())
    _emit({"done": len(kernels)})


def main() -> None:
    for line in sys.stdin:
        run_job(json.loads(line))


if __name__ == "__main__":
    main()
