"""Compiling micro-kernels and measuring them with real runs on this machine.

A measurement is one micro-kernel at one shape (the values of the workload's
shape variables): median seconds over repeats after a warm-up, the repeats
interleaved with those of the other kernels measured with it (measure_modules
says why), or the error that stopped it (recorded, never raised).

A dense workload with `cold_weight` is timed cold, as MetaSchedule times CPU
kernels: before each run every operand but x (the weight, bias and output) is
flushed from the caches. A model whose weights outgrow the last-level cache
reads each from DRAM at every call (BERT-base: 340 MB), and at small M that
decides which kernel is fastest: at M = 1 the kernels tuned warm for BERT-base's
3072x768 and 768x3072 layers ran at 16-18 GB/s cold, others at 22 GB/s. x is
the previous op's output, cached in a model too.
"""

import dataclasses
import math
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import tvm

from tf_dietcode.tuning import templates
from tf_dietcode.tuning.hardware import Hardware
from tf_dietcode.tuning.micro_kernel import MicroKernel
from tf_dietcode.tuning.tir_passes import pipeline
from tf_dietcode.tuning.workload import Workload


@dataclasses.dataclass(frozen=True)
class Measurement:
    kernel: MicroKernel        # or the target's kernel type (a GpuKernel on CUDA)
    shape: tuple[int, ...]     # values of workload.variables()
    seconds: float | None      # median seconds per call; None when it failed
    error: str | None = None

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, record: dict, kernel_type: type = MicroKernel) -> "Measurement":
        return cls(kernel_type(**record["kernel"]), tuple(record["shape"]), record["seconds"], record["error"])

    @classmethod
    def failed(cls, kernel, shape: tuple[int, ...], error: Exception) -> "Measurement":
        """The record of a kernel that could not be built, run or timed at `shape`."""
        return cls(kernel, tuple(shape), None, f"{type(error).__name__}: {error}")


def latest(measurements: list[Measurement]) -> list[Measurement]:
    """One record per (kernel, shape), the last one: a kernel measured again (the search's
    finalists) is judged by that timing alone, taken beside its rivals."""
    return list({(record.kernel, record.shape): record for record in measurements}.values())


def build(mod: tvm.IRModule, hw: Hardware, disabled: Iterable[str] | None = None):
    """Kernels compiled for this machine, as every kernel is (tuning, bundles, benchmarks), by
    tir_passes.pipeline less the passes `disabled` (None: those TF_DIETCODE_DISABLE_PASSES lists)."""
    with tvm.transform.PassContext(config=pipeline.PASS_CONFIG):
        return tvm.compile(mod, target=hw.target(), tir_pipeline=pipeline.register(disabled))


def compile_kernel(workload: Workload, kernel: MicroKernel, hw: Hardware, dims: dict[str, int] | None = None):
    """One compiled micro-kernel: symbolic in the dynamic dims (dims=None) or for fixed dims."""
    return build(templates.for_workload(workload).schedule(workload, kernel, dims), hw)


def in_threads(function: Callable, items: Iterable, threads: int, strict: bool = False) -> list:
    """function(item) for each item, on up to `threads` threads: its result, or the exception it raised
    (strict: the first such exception is raised, once every call has returned).

    Compiling kernels this way uses every core: TVM's passes and LLVM run in C++, which
    releases the GIL. 24 kernels of NN, NT and dense took 15.6 s on 2 threads against 32.9 s
    one after another, with the same assembly (2-core Zen 3). Never while timing.
    """
    def attempt(item):
        try:
            return function(item)
        except Exception as error:  # noqa: BLE001 - each caller decides what a failure means
            return error

    with ThreadPoolExecutor(max(1, threads)) as pool:
        results = list(pool.map(attempt, items))
    if strict:
        for result in results:
            if isinstance(result, Exception):
                raise result
    return results


def run(executable, arguments) -> None:
    executable.mod["main"](*arguments)


COLD_REPEATS = 15  # single runs, each after a flush: noisier than warm repeats, so more of them
COLD_SECONDS = 0.3  # ... but no more runs than fill this: a 0.2 s run varies by a few %, not a 0.2 ms one


def cold_repeats(repeats: int, warm_up_seconds: float) -> int:
    """Runs of a cold timing: COLD_REPEATS for short kernels, down to `repeats` for long ones.

    BERT-base's quick tuning spent three quarters of its measuring time on 16
    cold runs of each candidate at M = 2048 (0.1-1 s each), where the spread
    between runs is far below what tells candidates apart.
    """
    return max(repeats, min(COLD_REPEATS, int(COLD_SECONDS / max(warm_up_seconds, 1e-9))))


ABANDON_FACTOR = 2.0  # a probe this many times slower than the best kernel at a shape ends the timing there
PROBE_MS = 5  # a warm probe's length: long enough that a 20 us kernel is not judged on one run


def _timer(module, device, workload: Workload, repeats: int, min_repeat_ms: int, warm_up_seconds: float):
    """A timer of one repeat, and how many rounds to call it. A warm timer keeps the call count
    it settled on in its first repeat (min_repeat_ms), so later rounds do not search for it again.

    Each call of a timer first makes one untimed run (time_evaluator does). Where a repeat is
    a single run (cold timings, and warm kernels that fill min_repeat_ms alone) that doubles a
    round's cost, so those take (runs + 2) // 2 rounds: as many runs as their repeats back to
    back took in one call.
    """
    if workload.cold_weight:  # one run per repeat: later runs of a repeat would find the weight cached
        return (module.time_evaluator("main", device, number=1, repeat=1, f_preproc="cache_flush_cpu_non_first_arg"),
                (cold_repeats(repeats, warm_up_seconds) + 2) // 2)
    single_run = warm_up_seconds * 1e3 >= min_repeat_ms
    return (module.time_evaluator("main", device, number=1, repeat=1, min_repeat_ms=min_repeat_ms),
            (repeats + 2) // 2 if single_run else repeats)


def _probe(module, device, workload: Workload):
    """One short timing (a cold workload: one run after a flush), to tell a clearly slower kernel early."""
    if workload.cold_weight:
        return module.time_evaluator("main", device, number=1, repeat=1, f_preproc="cache_flush_cpu_non_first_arg")
    return module.time_evaluator("main", device, number=1, repeat=1, min_repeat_ms=PROBE_MS)


def measure_modules(modules: list[tuple[MicroKernel, object]], device, workload: Workload,
                    shapes: list[tuple[int, ...]], rng: np.random.Generator, repeats: int = 5,
                    min_repeat_ms: int = 20, best: dict[tuple[int, ...], float] | None = None,
                    on_step: Callable[[int], None] = lambda index: None) -> list[Measurement]:
    """Median time of each (kernel, module)'s "main" at each shape on `device` (local or over
    RPC), by kernel then shape. on_step(i) is called before each step of kernel i's work.

    The repeats are spread over time: after a warm-up call of every (kernel, shape) pair, each
    round times every pair once, in turn (interleaved). Why: a shared machine's speed sits at levels
    for about a second at a time (one kernel read 95, 121 or 150-175 GFLOP/s for a second
    each, on a 2-core Zen 3), so repeats back to back time one level and kernels measured one
    after another were compared by their moments. In one tuning of dense batch 16, the
    kernel fastest at M = 1600-2048 when timed interleaved read about half its speed at five
    of six sample shapes and lost the vote to one 10% slower.

    With `best` (the fastest time measured so far at each shape), a pair whose probe is
    ABANDON_FACTOR times that is recorded at its probe's time instead of being timed in
    full: the search only needs to know it is slower, and on BERT-base's quick tuning the
    full timings of such kernels were about a third of all measuring time (cold dense
    layers at M = 2048 run 0.1-1 s).

    Builds of one micro-kernel (bench.studies.aot_pairs' symbolic and static) share their argument
    tensors at a shape, so their ratio is the code's alone: four loaded copies of one static
    NN library at T = 1 (a 1.3 us kernel), each on tensors of its own, read 1.06-1.08x the
    time of the first listed, and 1.000-1.002x on shared tensors (2-vCPU Xeon).
    """
    template = templates.for_workload(workload)
    records: dict[tuple[int, tuple[int, ...]], Measurement] = {}
    timed: list[tuple[int, tuple[int, ...], Callable[[], float], int]] = []  # index, shape, run, runs
    for shape in map(tuple, shapes):
        operands = template.random_operands(workload, workload.dims_at(shape), rng)
        arguments_of: dict[str, list] = {}  # one kernel's builds run on the same tensors (docstring)
        for index, (kernel, module) in enumerate(modules):
            on_step(index)
            try:
                if kernel.name not in arguments_of:
                    arguments_of[kernel.name] = template.kernel_arguments(operands, workload, kernel, device)
                arguments = arguments_of[kernel.name]
                started = time.perf_counter()
                module["main"](*arguments)
                warm_up_seconds = time.perf_counter() - started
                if best and shape in best:
                    probe = float(np.median(_probe(module, device, workload)(*arguments).results))
                    if probe > ABANDON_FACTOR * best[shape]:
                        records[index, shape] = Measurement(kernel, shape, probe)
                        continue
                timer, runs = _timer(module, device, workload, repeats, min_repeat_ms, warm_up_seconds)
                timed.append((index, shape, lambda t=timer, a=arguments: float(t(*a).mean), runs))
            except Exception as error:  # noqa: BLE001 - a failed candidate is data, not a crash
                records[index, shape] = Measurement.failed(kernel, shape, error)

    failures: dict[int, Exception] = {}

    def time_once(position: int) -> float:
        if position not in failures:
            on_step(timed[position][0])
            try:
                return timed[position][2]()
            except Exception as error:  # noqa: BLE001 - a failed candidate is data, not a crash
                failures[position] = error
        return math.nan

    samples = interleaved(time_once, [runs for *_, runs in timed])
    for position, ((index, shape, _, _), times) in enumerate(zip(timed, samples)):
        kernel, error = modules[index][0], failures.get(position)
        records[index, shape] = (Measurement.failed(kernel, shape, error) if error is not None
                                 else Measurement(kernel, shape, float(np.median(times))))
    return [records[index, tuple(shape)] for index in range(len(modules)) for shape in shapes]


def interleaved(run: Callable[[int], float], counts: list[int]) -> list[list[float]]:
    """run(i) called counts[i] times for each i, in rounds (each round calls every i still
    short of its count once); each i's results.

    Each round visits the i in the order of one row of a balanced Latin square (balanced_order),
    so over the rounds every i comes first, last and right after every other alike. In one fixed
    order (bench.tuned_kernels: TF, the bundle's kernel, its static build, ...) whatever came first
    after TF's in-graph sample took it every round: there the same kernel read 1.116 and 1.031x its
    time later in the round (dense batch 1, T = 17; 0.980 with TF left out; 2-core Zen 3),
    on the symbolic side of the AOT ratio."""
    samples: list[list[float]] = [[] for _ in counts]
    for round_ in range(max(counts, default=0)):
        for position in balanced_order(len(counts), round_):
            if round_ < counts[position]:
                samples[position].append(run(position))
    return samples


def balanced_order(n: int, row: int) -> list[int]:
    """Row `row` (mod n, or mod 2n for odd n) of a Williams design over range(n): over n rows (2n
    for odd n) each i is in every place once (twice) and right after every other i once (twice)."""
    first = [0] + [(j + 1) // 2 if j % 2 else n - j // 2 for j in range(1, n)]
    order = [(i + row) % n for i in first] if n else []
    return order[::-1] if n % 2 and (row // n) % 2 else order
