"""How the benchmarks time, in one place (a change of method is an edit here).

- In-graph (TF computations): calling a tf.function from Python costs ~0.2 ms here, more
  than many kernels. So the op runs k times inside a tf.while_loop of one tf.function and
  the time per run is (t(k) - t(0)) / k, taken as the median over repeats. Each iteration
  takes its inputs through an identity that depends on the previous result, so iterations
  run in order and nothing is hoisted out of the loop. With jit_compile, `compute` is an
  XLA cluster called once per iteration of the same TF loop (a loop compiled by XLA as a
  whole would drop the control dependency and hoist the work out of it).
- TVM kernels: TVM's time_evaluator, calls back to back (no Python in the loop).
- Rounds: computations compared with each other are sampled in interleaved rounds (medians
  over rounds, ratios paired by round).
- Whole calls (a SavedModel's signature, an ONNX Runtime session): every peer as its users run
  it (default options), in blocks of back-to-back calls, several rounds of blocks alternating
  between the peers, medians (block_seconds).
"""

import statistics
import threading
import time
from collections.abc import Callable, Sequence

import numpy as np
import tensorflow as tf

ROUNDS = 21  # 7 read NN's 2 us kernel at T = 1 as 1.10x its static build; 41 read 0.97-1.02
ROUND_SECONDS = 0.03
BOOTSTRAP_SAMPLES = 2000
BLOCK_ROUNDS = 7  # rounds of blocks of whole calls (block_seconds)
MIN_ROUNDS = 3  # ... and the fewest a budget leaves
BLOCK_SECONDS = 0.2  # a block's timed calls fill this, at least one


def in_graph_loop(compute: Callable[..., tf.Tensor], inputs: Sequence[tf.Tensor], jit_compile: bool = False):
    """A tf.function running compute(*inputs) 1 + `iterations` times in order (its argument)."""
    if jit_compile:
        compute = tf.function(compute, jit_compile=True)

    @tf.function
    def run(iterations):
        first = compute(*inputs)

        def body(i, previous):
            with tf.control_dependencies([previous]):
                fresh = [tf.identity(x) for x in inputs]
            return i + 1, compute(*fresh)

        _, last = tf.while_loop(lambda i, _: i < iterations, body, (tf.constant(0), first))
        return tf.reduce_sum(last[..., :1])

    return run


def _wall_seconds(run, iterations: int) -> float:
    start = time.perf_counter()
    run(tf.constant(iterations)).numpy()
    return time.perf_counter() - start


def in_graph_seconds(compute: Callable[..., tf.Tensor], inputs: Sequence[tf.Tensor],
                     repeats: int = 5, target_seconds: float = 0.05, jit_compile: bool = False) -> float:
    """Median seconds of one `compute(*inputs)`, measured in-graph."""
    return _in_graph_medians(compute, inputs, target_seconds, jit_compile)(repeats)


def _in_graph_medians(compute: Callable[..., tf.Tensor], inputs: Sequence[tf.Tensor], target_seconds: float = 0.05,
                      jit_compile: bool = False) -> Callable[[int], float]:
    """A timing of `compute(*inputs)` to run again and again (traced, warmed up and sized once):
    repeats -> median seconds of one call, measured in-graph."""
    run = in_graph_loop(compute, inputs, jit_compile)
    _wall_seconds(run, 2)  # trace and warm up
    estimate = max(_wall_seconds(run, 3) - _wall_seconds(run, 0), 1e-6) / 3
    iterations = int(min(max(target_seconds / estimate, 1), 2000))  # a call past the target: one per sample

    def seconds(repeats: int) -> float:
        samples = [(_wall_seconds(run, iterations) - _wall_seconds(run, 0)) / iterations for _ in range(repeats)]
        return max(statistics.median(samples), 0.0)

    return seconds


def in_graph_timer(compute, inputs: list, round_seconds: float = ROUND_SECONDS) -> Callable[[], float]:
    """One sample of compute(*inputs)'s seconds per call, timed in-graph over at least round_seconds
    (a timer for median_seconds' rounds)."""
    timer = _in_graph_medians(compute, inputs, target_seconds=round_seconds)
    return lambda: timer(1)


def tvm_timer(module, name: str, arguments, round_seconds: float = ROUND_SECONDS) -> Callable[[], float]:
    """One sample of the function's seconds per call, over calls back to back for at least
    round_seconds (warmed up and sized by a first timing)."""
    import tvm  # here: benchmarks that time TF alone start without TVM

    first = module.time_evaluator(name, tvm.cpu(), number=1, repeat=1, min_repeat_ms=int(round_seconds * 1e3))
    number = max(1, int(np.ceil(round_seconds / first(*arguments).mean)))
    timer = module.time_evaluator(name, tvm.cpu(), number=number, repeat=1)
    return lambda: timer(*arguments).mean


def round_samples(*timers: Callable[[], float]) -> np.ndarray:
    """ROUNDS samples of each timer (timers x rounds), taken in interleaved rounds.

    Why interleaved: a shared 2-core machine's speed drifts by tens of % within seconds (the FMA
    peak read 37-68 GFLOP/s across one hour), so computations timed one after another
    compare their moments as much as themselves; in rounds, each round times every
    one at nearly the same moment. The rounds' orders are balanced (measure.interleaved):
    TF's sample, first in every round, slowed what came next (by 3% and 12% in two
    measurements: docs/decisions.md, "Rounds in balanced orders").
    """
    from tf_dietcode.tuning import measure  # imports TVM

    return np.array(measure.interleaved(lambda i: timers[i](), [ROUNDS] * len(timers)))


def median_seconds(*timers: Callable[[], float]) -> list[float]:
    """Each timer's median over round_samples' rounds (the median drops the outlying rounds)."""
    return [float(np.median(runs)) for runs in round_samples(*timers)]


def tvm_seconds(*calls: tuple) -> list[float]:
    """Median seconds per call of each (module, function name, arguments), in interleaved rounds."""
    return median_seconds(*(tvm_timer(*call) for call in calls))


def paired_ratio(numerator: np.ndarray, denominator: np.ndarray) -> float:
    """The median over rounds of one round's ratio of two timers' samples.

    Why paired: a slow patch of a shared machine spans seconds, so it lands on both samples of a
    round, and a round's ratio cancels it where the ratio of the two medians need not (each
    median may fall in another patch). Six repeats of 21 rounds of the same cells (2-core
    Zen 3: dense batch 16 T = 24, batch 1 T = 43, NT T = 43, NN T = 17, batch 16 T = 100)
    gave the bundle's kernel over its static build a spread (sd of the log) of 0.003-0.010
    paired against 0.007-0.016 as a ratio of medians; against TF's in-graph sample, timed by
    another mechanism, pairing did not narrow it (0.016-0.048 against 0.016-0.042)."""
    return float(np.median(np.asarray(numerator) / np.asarray(denominator)))


def median_ratio_interval(numerator: list[float], denominator: list[float],
                          rng: np.random.Generator) -> tuple[float, float, float]:
    """Median of the per-round ratios and its bootstrap 95% interval."""
    ratios = np.asarray(numerator) / np.asarray(denominator)
    resampled = np.median(rng.choice(ratios, (BOOTSTRAP_SAMPLES, ratios.size)), axis=1)
    low, high = np.percentile(resampled, [2.5, 97.5])
    return float(np.median(ratios)), float(low), float(high)


def alternating_pairs(first: Callable[[], float], second: Callable[[], float],
                      rounds: int) -> tuple[np.ndarray, np.ndarray]:
    """`rounds` pairs of one sample of each timer, back to back, the order alternating: the
    first's samples and the second's.

    Why one sample each: a shared machine has slow patches of tens of ms, so the two sides of a ratio must
    be timed at nearly the same moment (rounds of a median of 3 op samples against a median of 21
    kernel samples compared a second's window with a third of one). No pause between them: an op
    timed after a pause of 1 s ran 1.1-1.8x its time alone (the machine idles its cores); TVM's pool
    thread no longer yields into the op's timing (bench.threads.use_tvm_threads)."""
    pairs = []
    for i in range(rounds):
        if i % 2:
            second_seconds = second()
            first_seconds = first()
        else:
            first_seconds = first()
            second_seconds = second()
        pairs.append((first_seconds, second_seconds))
    first_samples, second_samples = np.array(pairs).T
    return first_samples, second_samples


def block_medians(calls: dict[str, Callable[[], object]], rounds: int = BLOCK_ROUNDS,
                  budget_seconds: float | None = None,
                  check: Callable[[dict[str, object]], None] | None = None) -> dict[str, float]:
    """Median seconds per call of each whole call (a model's signature, a session's run), timed in
    blocks (block_seconds)."""
    samples = block_seconds(calls, rounds, budget_seconds, check)
    return {name: statistics.median(values) for name, values in samples.items()}


def block_seconds(calls: dict[str, Callable[[], object]], rounds: int = BLOCK_ROUNDS,
                  budget_seconds: float | None = None,
                  check: Callable[[dict[str, object]], None] | None = None) -> dict[str, list[float]]:
    """Seconds per call of each call, one sample a round: a block of back-to-back calls, as a server
    calls a model, the block's first call untimed. Rounds visit the calls in balanced orders
    (measure.balanced_order), so drift on a noisy machine hits all alike.

    Why blocks: each peer runs as its users run it. ONNX Runtime keeps its pool threads spinning
    after a call (its default); interleaved call by call, that spinning slowed the TF call after
    it (BERT-base, batch 1: 19 to 32 ms), and turning it off cost ONNX Runtime 10-15% at small T.
    In a block, a peer's calls follow its own; the untimed first call absorbs what the previous
    block left behind. A block lasts BLOCK_SECONDS (at least one timed call): the first timed round
    sizes it. With a budget, fewer rounds (at least MIN_ROUNDS) where blocks are long. `check` gets
    the warm-up calls' outputs by name (XLA compiles a new shape there). Round i of every call lists
    at index i, so ratios can be paired by round.
    """
    from tf_dietcode.tuning.measure import balanced_order  # imports TVM

    outputs = {name: call() for name, call in calls.items()}  # warm up
    if check is not None:
        check(outputs)
    names = list(calls)
    samples: dict[str, list[float]] = {name: [] for name in names}
    counts = dict.fromkeys(names, 1)

    def block(name: str) -> None:
        calls[name]()
        start = time.perf_counter()
        for _ in range(counts[name]):
            calls[name]()
        samples[name].append((time.perf_counter() - start) / counts[name])

    for position in balanced_order(len(names), 0):
        block(names[position])
    for name in names:
        counts[name] = max(1, round(BLOCK_SECONDS / max(samples[name][0], 1e-9)))
    round_seconds = sum((counts[name] + 1) * samples[name][0] for name in names)
    if budget_seconds is not None:
        rounds = max(MIN_ROUNDS, min(rounds, int(budget_seconds / max(round_seconds, 1e-6))))
    for round_ in range(1, rounds):
        for position in balanced_order(len(names), round_):
            block(names[position])
    return samples


def repeated_call_seconds(call, repeats: int = 5, target_seconds: float = 0.05) -> float:
    """Median over repeats of the mean time of enough calls to fill target_seconds."""
    call()
    start = time.perf_counter()
    call()
    count = int(min(max(target_seconds / max(time.perf_counter() - start, 1e-7), 1), 2000))
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(count):
            call()
        samples.append((time.perf_counter() - start) / count)
    return statistics.median(samples)


def concurrent_seconds(runs, iterations: int) -> float:
    """Wall time of every run(iterations) started together (median of 3)."""
    samples = []
    for _ in range(3):
        threads = [threading.Thread(target=run, args=(iterations,)) for run in runs]
        start = time.perf_counter()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)
