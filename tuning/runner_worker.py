"""Child process of LocalRunner: compiles and measures the kernels of each job it is sent.

Reads one JSON job per line on stdin until it closes. Compiles every kernel of the
job, one per core at a time, then measures them together (measure.measure_modules:
repeats interleaved across kernels). Whenever the kernels at work change it writes
{"busy": [index, ...]} (in the order they started; one at a time while measuring), so
that the parent knows which kernel hung or crashed; then one JSON line per
(kernel, shape) record and {"done": count}, flushing as it goes.
"""

import json
import pathlib
import sys
import threading
from collections.abc import Callable

import numpy as np
import tvm

from tf_dietcode.tuning import hardware, measure
from tf_dietcode.tuning.kernel_objects import KernelObjects
from tf_dietcode.tuning.micro_kernel import MicroKernel
from tf_dietcode.tuning.workload import Workload


_EMITTING = threading.Lock()  # one line at a time from the compiling threads


def _emit(record: dict) -> None:
    with _EMITTING:
        sys.stdout.write(json.dumps(record) + "\n")
        sys.stdout.flush()


def compile_all(count: int, build: Callable[[int], object], threads: int,
                emit: Callable[[dict], None] = _emit) -> list:
    """build(i) for i < count on `threads` threads: each result or exception. Emits the kernels
    being compiled whenever they change, so a hung compile ends up the only one named. A crash
    names the oldest one at work, which may be an innocent neighbour: the runner drops that one
    and compiles the rest again, and the culprit crashes again until it is the one named."""
    at_work: list[int] = []
    lock = threading.Lock()

    def tracked(index: int):
        with lock:
            at_work.append(index)
            emit({"busy": list(at_work)})
        try:
            return build(index)
        finally:
            with lock:
                at_work.remove(index)
                if at_work:
                    emit({"busy": list(at_work)})

    return measure.in_threads(tracked, range(count), threads)


def run_job(job: dict) -> None:
    workload = Workload.from_key(job["workload"])
    hw = hardware.detect()
    shapes = [tuple(shape) for shape in job["shapes"]]
    kernels = [MicroKernel(**fields) for fields in job["kernels"]]
    compiled, records = [], []
    objects = KernelObjects(pathlib.Path(job["objects"]))
    builds = compile_all(len(kernels), lambda i: objects.load(workload, kernels[i], hw), hw.cores)
    for index, (kernel, build) in enumerate(zip(kernels, builds)):
        if isinstance(build, Exception):  # a kernel that fails to build is a record
            records += [measure.Measurement.failed(kernel, shape, build) for shape in shapes]
        else:
            compiled.append((index, kernel, build))
    records += measure.measure_modules(
        [(kernel, module) for _, kernel, module in compiled], tvm.cpu(), workload, shapes,
        np.random.default_rng(job["seed"]), job["repeats"], job["min_repeat_ms"],
        {tuple(shape): seconds for shape, seconds in job["best"]},
        on_step=lambda position: _emit({"busy": [compiled[position][0]]}))
    for record in records:
        _emit(record.to_json())
    _emit({"done": len(kernels)})


def main() -> None:
    for line in sys.stdin:
        run_job(json.loads(line))


if __name__ == "__main__":
    main()
