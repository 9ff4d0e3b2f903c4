"""Runners measure micro-kernels on real hardware; the search only sees records.

Both have one method, run(workload, kernels, shapes, seed, best) -> [Measurement]
(best: the fastest time measured so far at each shape, so that clearly slower
kernels are not timed in full; see measure.measure_modules).
LocalRunner measures in a child process (tuning/runner_worker.py) so that a
candidate that hangs or crashes costs one timeout and is recorded as failed,
never the tuning run; the child gets the machine's cores through TVM's thread
pool, unpinned, and stays up between runs (starting one, mostly importing
TVM, took 1.8 s on a 2-core Zen 1: BERT-base's quick tuning started ten). A
child that hung or died is replaced at the next run. RPCRunner measures on
machines behind a TVM RPC tracker.
"""

import dataclasses
import json
import os
import pathlib
import selectors
import subprocess
import sys
import tempfile
import time
import weakref

import numpy as np
from tvm import rpc

from tf_dietcode.tuning import hardware, measure
from tf_dietcode.tuning.hardware import Hardware
from tf_dietcode.tuning.kernel_objects import KernelObjects
from tf_dietcode.tuning.measure import Measurement
from tf_dietcode.tuning.micro_kernel import MicroKernel
from tf_dietcode.tuning.workload import Workload


@dataclasses.dataclass
class LocalRunner:
    hw: Hardware
    repeats: int = 5
    min_repeat_ms: int = 20
    timeout_s: float = 60.0    # per step of a kernel's work: its compile, a warm-up or one timing
    objects: KernelObjects = dataclasses.field(default_factory=KernelObjects)  # where its compiled kernels are kept
    _worker: subprocess.Popen | None = dataclasses.field(default=None, init=False, repr=False, compare=False)
    _finalizer: weakref.finalize | None = dataclasses.field(default=None, init=False, repr=False, compare=False)

    def run(self, workload: Workload, kernels: list[MicroKernel], shapes: list[tuple[int, ...]],
            seed: int = 0, best: dict[tuple[int, ...], float] | None = None) -> list[Measurement]:
        """Measures every kernel at every shape; failures and timeouts come back as records."""
        results: list[Measurement] = []
        remaining = list(kernels)
        while remaining:
            hung = self._run_worker(workload, remaining, shapes, seed, best or {}, results)
            if hung is None:
                break
            results.extend(Measurement(remaining[hung], tuple(s), None, "timeout or crash") for s in shapes)
            remaining = remaining[:hung] + remaining[hung + 1:]  # the others are measured again, together
        return results

    def _run_worker(self, workload, kernels, shapes, seed, best, results) -> int | None:
        """Sends one job to the worker; returns None when it finished, else the index of the
        kernel that hung or killed the worker (the oldest one it last said it was busy with),
        which is then stopped."""
        job = {"workload": workload.key(), "kernels": [dataclasses.asdict(k) for k in kernels],
               "shapes": [list(s) for s in shapes], "seed": seed, "repeats": self.repeats,
               "min_repeat_ms": self.min_repeat_ms, "best": [[list(s), t] for s, t in best.items()],
               "objects": str(self.objects.directory)}
        worker = self._started_worker()
        busy = 0
        try:
            worker.stdin.write(json.dumps(job).encode() + b"\n")
            worker.stdin.flush()
            for record in _records(worker, self.timeout_s):
                if "done" in record:
                    return None
                if "busy" in record:
                    busy = record["busy"][0]  # the oldest kernel at work
                else:
                    results.append(Measurement.from_json(record))
        except BrokenPipeError:
            pass  # the worker died before reading the job
        self.close()
        return busy

    def _started_worker(self) -> subprocess.Popen:
        if self._worker is None:
            env = {**os.environ, "TVM_NUM_THREADS": str(self.hw.cores), "TVM_BIND_THREADS": "0"}
            # -P: the current directory is not put first on the worker's sys.path, where a folder named
            # tf_dietcode (the source tree's, which has no tuning/) would hide the installed package.
            self._worker = subprocess.Popen([sys.executable, "-P", "-m", "tf_dietcode.tuning.runner_worker"],
                                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                            stderr=subprocess.DEVNULL, env=env)
            self._finalizer = weakref.finalize(self, _stop, self._worker)
        return self._worker

    def close(self) -> None:
        """Stops the worker (a later run starts another)."""
        if self._worker is not None:
            self._finalizer()
            self._worker = None


def _records(worker: subprocess.Popen, timeout_s: float):
    """The worker's JSON lines until it stays silent for timeout_s or dies. Reads the pipe
    unbuffered: a line left in a Python buffer would not wake select() (the worker stays up)."""
    pending = b""
    with selectors.DefaultSelector() as selector:
        selector.register(worker.stdout, selectors.EVENT_READ)
        while True:
            deadline = time.monotonic() + timeout_s
            while b"\n" not in pending:
                if not selector.select(timeout=max(deadline - time.monotonic(), 0)):
                    return  # timed out
                chunk = os.read(worker.stdout.fileno(), 1 << 16)
                if not chunk:
                    return  # the worker died
                pending += chunk
            line, pending = pending.split(b"\n", 1)
            yield json.loads(line)


def _stop(worker: subprocess.Popen) -> None:
    worker.kill()
    worker.wait()
    for stream in (worker.stdin, worker.stdout):
        try:
            stream.close()
        except BrokenPipeError:
            pass


@dataclasses.dataclass
class RPCRunner:
    """Measures on a machine registered with a TVM RPC tracker under `key`.

    Kernels are compiled here for `hw` (the remote machine's limits and CPU),
    exported, uploaded and timed there, so tuning can use more machines or a
    remote target. A kernel that fails to build, upload or run is recorded.
    """

    hw: Hardware
    tracker_host: str
    tracker_port: int
    key: str
    repeats: int = 5
    min_repeat_ms: int = 20
    session_timeout_s: int = 600
    objects: KernelObjects = dataclasses.field(default_factory=KernelObjects)

    def run(self, workload: Workload, kernels: list[MicroKernel], shapes: list[tuple[int, ...]],
            seed: int = 0, best: dict[tuple[int, ...], float] | None = None) -> list[Measurement]:
        session = rpc.connect_tracker(self.tracker_host, self.tracker_port).request(
            self.key, session_timeout=self.session_timeout_s)
        results: list[Measurement] = []
        loaded = []
        with tempfile.TemporaryDirectory(prefix="tf-dietcode-rpc-") as scratch:
            exports = measure.in_threads(lambda kernel: self.objects.library(workload, kernel, self.hw,
                                                                             pathlib.Path(scratch)),
                                         kernels, hardware.detect().cores)  # built here
            for kernel, library in zip(kernels, exports):
                try:
                    if isinstance(library, Exception):
                        raise library
                    session.upload(str(library))
                    loaded.append((kernel, session.load_module(library.name)))
                except Exception as error:  # noqa: BLE001 - a failed candidate is data
                    results.extend(Measurement.failed(kernel, s, error) for s in shapes)
        return results + measure.measure_modules(loaded, session.cpu(), workload, shapes, np.random.default_rng(seed),
                                                 self.repeats, self.min_repeat_ms, best)
