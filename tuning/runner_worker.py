"""Child process of LocalRunner: compiles and measures the kernels of each job it is sent.

Reads one JSON job per line on stdin until it closes; writes one JSON line per
(kernel, shape) measurement and a {"done": ...} line after each kernel,
flushing as it goes so the parent keeps what finished before a hang.
"""

import json
import sys

import numpy as np

from tf_dietcode.tuning import hardware, measure
from tf_dietcode.tuning.micro_kernel import MicroKernel
from tf_dietcode.tuning.workload import Workload


def _emit(record: dict) -> None:
    sys.stdout.write(json.dumps(record) + "\n")
    sys.stdout.flush()


def run_job(job: dict) -> None:
    workload = Workload.from_key(job["workload"])
    hw = hardware.detect()
    rng = np.random.default_rng(job["seed"])
    for fields in job["kernels"]:
        kernel = MicroKernel(**fields)
        try:
            executable = measure.compile_kernel(workload, kernel, hw)
            shapes = [tuple(shape) for shape in job["shapes"]]
            records = measure.measure(executable, workload, kernel, shapes, rng, job["repeats"], job["min_repeat_ms"],
                                      {tuple(shape): seconds for shape, seconds in job["best"]})
        except Exception as error:  # noqa: BLE001 - a kernel that fails to build is a record
            records = [measure.Measurement(kernel, tuple(shape), None, f"{type(error).__name__}: {error}")
                       for shape in job["shapes"]]
        for record in records:
            _emit(record.to_json())
        _emit({"done": fields})


def main() -> None:
    for line in sys.stdin:
        run_job(json.loads(line))


if __name__ == "__main__":
    main()
