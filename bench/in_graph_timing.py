"""Times one TF computation in-graph, free of Python's per-call cost.

Calling a tf.function from Python costs ~0.2 ms here, more than many kernels.
So the op runs k times inside a tf.while_loop of one tf.function and the time
per run is (t(k) - t(0)) / k, taken as the median over repeats. Each iteration
takes its inputs through an identity that depends on the previous result, so
iterations run in order and nothing is hoisted out of the loop. With
jit_compile, `compute` is an XLA cluster called once per iteration of the same
TF loop (a loop compiled by XLA as a whole would drop the control dependency
and hoist the work out of it).
"""

import statistics
import time
from collections.abc import Callable, Sequence

import tensorflow as tf


def looped(compute: Callable[..., tf.Tensor], inputs: Sequence[tf.Tensor], jit_compile: bool = False):
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


def wall_seconds(run, iterations: int) -> float:
    start = time.perf_counter()
    run(tf.constant(iterations)).numpy()
    return time.perf_counter() - start


def seconds_per_call(compute: Callable[..., tf.Tensor], inputs: Sequence[tf.Tensor],
                     repeats: int = 5, target_seconds: float = 0.05, jit_compile: bool = False) -> float:
    """Median seconds of one `compute(*inputs)`, measured in-graph."""
    return timer(compute, inputs, target_seconds, jit_compile)(repeats)


def timer(compute: Callable[..., tf.Tensor], inputs: Sequence[tf.Tensor], target_seconds: float = 0.05,
          jit_compile: bool = False) -> Callable[[int], float]:
    """A timing of `compute(*inputs)` to run again and again (traced, warmed up and sized once):
    repeats -> median seconds of one call, measured in-graph."""
    run = looped(compute, inputs, jit_compile)
    wall_seconds(run, 2)  # trace and warm up
    estimate = max(wall_seconds(run, 3) - wall_seconds(run, 0), 1e-6) / 3
    iterations = int(min(max(target_seconds / estimate, 1), 2000))  # a call past the target: one per sample

    def median_seconds(repeats: int) -> float:
        samples = [(wall_seconds(run, iterations) - wall_seconds(run, 0)) / iterations for _ in range(repeats)]
        return max(statistics.median(samples), 0.0)

    return median_seconds
