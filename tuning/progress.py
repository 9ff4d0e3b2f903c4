"""One progress display over a tuning job, and what each of its workloads took.

A job tunes its workloads one after another (tune(), or keras.tune's one bundle
per workload), and the user waits for all of them: the display shows which
workload is searched (k of n) and its name, the kernels measured against those
the job has left to measure, the elapsed time and tqdm's remaining time. That
estimate assumes each workload not started yet measures its whole budget; one
resumed from the tuning database measures less, so it shrinks as the job goes.
"""

import contextlib
import dataclasses
import time
from collections.abc import Iterator

from tqdm import tqdm


@dataclasses.dataclass(frozen=True)
class WorkloadTime:
    seconds: float         # its search, from the first batch to the finalists timed again
    kernels_measured: int  # in this job (0: all it needed was in the database)


class TuningProgress:
    def __init__(self, workloads: int, budget: int, enabled: bool = True):
        """workloads: how many the job tunes; budget: the kernels each measures at most
        (its trials and finalists)."""
        self._workloads, self._budget, self._started = workloads, budget, 0
        self._bar = tqdm(total=workloads * budget, desc="tuning", unit="kernel", disable=not enabled,
                         dynamic_ncols=True)
        self._current: tuple | None = None  # (workload, start time, kernels planned, measured so far)
        self.times: dict = {}               # Workload -> WorkloadTime, once its search is done

    def start(self, workload, kernels: int) -> None:
        """The next workload's search begins; it plans to measure `kernels` (its budget less
        what the database holds)."""
        self._started += 1
        self._current = (workload, time.perf_counter(), kernels, 0)
        self._bar.total += kernels - self._budget
        self._bar.set_description(f"workload {self._started}/{self._workloads} {workload.describe()}")
        self._bar.set_postfix_str("" if kernels else "all in the tuning database")

    def measured(self, kernels: int) -> None:
        workload, started, planned, done = self._current
        self._current = (workload, started, planned, done + kernels)
        self._bar.update(kernels)

    def status(self, text: str) -> None:
        """What runs besides measuring (finalists timed again, the bundle built)."""
        self._bar.set_postfix_str(text)

    def finish(self) -> None:
        """The workload's search is done (it may have measured fewer finalists than planned)."""
        workload, started, planned, done = self._current
        self._bar.total -= planned - done
        self._bar.refresh()
        self.times[workload] = WorkloadTime(time.perf_counter() - started, done)

    def close(self) -> None:
        self._bar.close()


@contextlib.contextmanager
def display_for(progress: "bool | TuningProgress", workloads: int, budget: int) -> Iterator[TuningProgress]:
    """`progress` where it is a job's display already (its owner closes it), else a display of
    its own for these workloads, shown if `progress` is true (and there are any), closed at the end."""
    if isinstance(progress, TuningProgress):
        yield progress
        return
    display = TuningProgress(workloads, budget, enabled=progress and workloads > 0)
    try:
        yield display
    finally:
        display.close()
