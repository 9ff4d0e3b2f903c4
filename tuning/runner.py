"""Runners measure micro-kernels on real hardware; the search only sees records.

Both have one method, run(workload, kernels, shapes, seed) -> [Measurement].
LocalRunner measures in a child process (tuning/runner_worker.py) so that a
candidate that hangs or crashes costs one timeout and is recorded as failed,
never the tuning run; the child gets the machine's cores through TVM's thread
pool, unpinned. RPCRunner measures on machines behind a TVM RPC tracker.
"""

import dataclasses
import json
import os
import selectors
import subprocess
import sys
import tempfile
import time

import numpy as np
from tvm import rpc

from tf_dietcode.tuning.hardware import Hardware
from tf_dietcode.tuning import measure
from tf_dietcode.tuning.measure import Measurement
from tf_dietcode.tuning.micro_kernel import MicroKernel
from tf_dietcode.tuning.workload import Workload


@dataclasses.dataclass
class LocalRunner:
    hw: Hardware
    repeats: int = 5
    min_repeat_ms: int = 20
    timeout_s: float = 60.0    # per micro-kernel: compile plus every shape

    def run(self, workload: Workload, kernels: list[MicroKernel], shapes: list[tuple[int, ...]],
            seed: int = 0) -> list[Measurement]:
        """Measures every kernel at every shape; failures and timeouts come back as records."""
        results: list[Measurement] = []
        remaining = list(kernels)
        while remaining:
            done = self._run_worker(workload, remaining, shapes, seed, results)
            remaining = remaining[done:]
            if remaining:  # the kernel being measured hung or killed the worker
                measured = {r.shape for r in results if r.kernel == remaining[0]}
                results.extend(Measurement(remaining[0], tuple(s), None, "timeout or crash")
                               for s in shapes if tuple(s) not in measured)
                remaining = remaining[1:]
        return results

    def _run_worker(self, workload, kernels, shapes, seed, results) -> int:
        """Runs one worker over `kernels`; returns how many it finished."""
        job = {"workload": workload.key(), "kernels": [dataclasses.asdict(k) for k in kernels],
               "shapes": [list(s) for s in shapes], "seed": seed, "repeats": self.repeats,
               "min_repeat_ms": self.min_repeat_ms}
        env = {**os.environ, "TVM_NUM_THREADS": str(self.hw.cores), "TVM_BIND_THREADS": "0"}
        worker = subprocess.Popen([sys.executable, "-m", "tf_dietcode.tuning.runner_worker"],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                  env=env, text=True)
        worker.stdin.write(json.dumps(job))
        worker.stdin.close()
        selector = selectors.DefaultSelector()
        selector.register(worker.stdout, selectors.EVENT_READ)
        finished, deadline = 0, time.monotonic() + self.timeout_s
        try:
            while finished < len(kernels):
                if not selector.select(timeout=max(deadline - time.monotonic(), 0)):
                    break  # timed out
                line = worker.stdout.readline()
                if not line:
                    break  # the worker died
                record = json.loads(line)
                if "done" in record:
                    finished += 1
                    deadline = time.monotonic() + self.timeout_s
                else:
                    results.append(Measurement.from_json(record))
        finally:
            worker.kill()
            worker.wait()
            selector.close()
        return finished


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

    def run(self, workload: Workload, kernels: list[MicroKernel], shapes: list[tuple[int, ...]],
            seed: int = 0) -> list[Measurement]:
        session = rpc.connect_tracker(self.tracker_host, self.tracker_port).request(
            self.key, session_timeout=self.session_timeout_s)
        rng = np.random.default_rng(seed)
        results: list[Measurement] = []
        with tempfile.TemporaryDirectory(prefix="tf-dietcode-rpc-") as scratch:
            for index, kernel in enumerate(kernels):
                try:
                    library = f"{scratch}/kernel{index}.so"
                    measure.compile_kernel(workload, kernel, self.hw).export_library(library)
                    session.upload(library)
                    module = session.load_module(f"kernel{index}.so")
                    results.extend(measure.measure_module(module, session.cpu(), workload, kernel, shapes, rng,
                                                          self.repeats, self.min_repeat_ms))
                except Exception as error:  # noqa: BLE001 - a failed candidate is data
                    results.extend(Measurement(kernel, tuple(s), None, f"{type(error).__name__}: {error}")
                                   for s in shapes)
        return results
