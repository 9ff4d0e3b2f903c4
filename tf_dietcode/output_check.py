"""The output check: the written model against the original, before the output takes its name.

Both run the same inputs: input_fn's where given, else one at the lowest corner,
the middle and the highest corner of the shape ranges, with random floats in
[-1, 1) in float inputs, zeros in other numbers and empty strings in text (the
values every model accepts: token ids, masks), and an integer scalar given a
range of values (a loop's length) at its value there. Per output, the error is
`row_error`: rows along the last axis, the largest ||optimized - original|| of
a row relative to the largest ||original|| of a row (Euclidean norms). It reads
a vector's error against the vector's size, not one element's against one
element: for unit-norm embeddings it is sqrt(2 (1 - cos)) of the worst row
(0.1 is a cosine similarity of 0.995, 0.141 of 0.99), and against the largest
row, not each row's own norm, so that a row near zero (a padded position) does
not dominate. Its largest over the inputs is reported, and a float output
beyond BOUND fails the check. NaN and infinities must be where the original
has them. Outputs of other dtypes (ids, an argmax) are compared exactly and
reported, the share of their elements that differ as their error, but never
fail the check: one computed from floats may flip where two values nearly tie.

BOUND: each fused op agrees with TF's within float32 rounding of its sums (2e-5
of their absolute terms, docs/user-guide.md#precision); the tests hold one- and
two-layer models to 1e-5 (rtol and atol), and the benchmarks hold 12-layer
BERT-base and the demo encoder to 1e-4 (bench/bert_base.py, bench/demo.py), as
rounding carries through the layers. 1e-4, here of the output's largest row
norm so that it does not depend on the output's scale. A 12-layer encoder
(bench's, hidden 256, every layer fused) read 1.7e-6 at this check's inputs
and at most 1.3e-6 on random token ids, the demo encoder (2 layers) 5.2e-7 and
5.9e-7 (2-vCPU AMD EPYC), while a broken rewrite (a wrong weight layout, a
dropped bias or activation, a wrong kernel) is off by far more: a dense weight
1% off reads 1e-2.

BOUND is float32's: a model optimized in a reduced precision is held to that
precision's bound instead (its `max_error`, tf_dietcode.precision), which the
accuracy gate (precision.accuracy_gate) meets by keeping layers in float32; the
gate runs candidates on the same inputs, against the original's outputs read
once (`reference`).
"""

import dataclasses
import time
from collections.abc import Callable

import numpy as np
import tensorflow as tf

from tf_dietcode.graph_rewrite.analysis import shape_ranges

BOUND = 1e-4  # float32 outputs: the largest row error relative to the largest row norm (row_error)
SEED = 0


@dataclasses.dataclass(frozen=True)
class OutputError:
    signature: str
    output: str
    error: float    # float outputs: as BOUND measures it; others: the share of elements that differ
    at: str         # the inputs where it was largest
    checked: bool   # a float output, held to the check's bound

    def beyond(self, bound: float) -> bool:
        return self.checked and not self.error <= bound  # NaN too


@dataclasses.dataclass
class OutputCheck:
    inputs: int                                  # input sets run on both models
    errors: list[OutputError]                    # per signature output
    notes: list[str]                             # inputs left out: the original fails on them
    bound: float = BOUND                         # a float output's largest error that passes
    seconds: float = 0.0

    @property
    def beyond_bound(self) -> list[OutputError]:
        return [e for e in self.errors if e.beyond(self.bound)]

    @property
    def largest(self) -> OutputError | None:
        """The float output whose error is largest (NaN counts as largest), None without any."""
        checked = [e for e in self.errors if e.checked]
        return max(checked, key=lambda e: np.inf if np.isnan(e.error) else e.error, default=None)

    def to_json(self) -> dict:
        return {"bound": self.bound, "inputs": self.inputs, "seconds": self.seconds, "notes": self.notes,
                "outputs": [dataclasses.asdict(e) for e in self.errors]}


class OutputMismatch(ValueError):
    """The written model's outputs differ from the original's beyond the bound: nothing is written."""

    def __init__(self, check: OutputCheck):
        self.check = check
        worst = ", ".join(f"{e.signature}.{e.output}: {e.error:.3g} at {e.at}" for e in check.beyond_bound)
        tolerance = "float32 tolerance" if check.bound == BOUND else "max_error"
        super().__init__(f"the optimized model's outputs differ from the original's beyond {tolerance} "
                         f"({check.bound:g} of each output's largest row norm): {worst}; nothing was written. "
                         "This is a bug in tf_dietcode: please report it with the model's layers "
                         "(optimize(..., validate=False) writes the model unchecked)")


def _inputs(specs: dict[str, tf.TensorSpec], ranges: shape_ranges.DimRanges,
           examples: list[dict]) -> list[dict[str, tf.Tensor]]:
    """The check's inputs for one signature, by input name."""
    if examples:
        return [{name: tf.constant(example[name], spec.dtype) for name, spec in specs.items()} for example in examples]
    rng = np.random.default_rng(SEED)
    lowest, highest = shape_ranges.corners(ranges)
    points = [lowest, shape_ranges.middle(ranges), highest]
    return [{name: shape_ranges.tensor_at(spec, point[name], lambda shape, dtype: _values(dtype, shape, rng))
             for name, spec in specs.items()} for i, point in enumerate(points) if point not in points[:i]]


@dataclasses.dataclass
class Run:
    """The original model's outputs on one of the check's inputs."""
    key: str                          # the signature run (the first of those that compute alike)
    feed: dict[str, tf.Tensor]
    at: str                           # the input shapes, as reports name them
    outputs: dict[str, np.ndarray]


@dataclasses.dataclass
class Reference:
    """The original's outputs on the check's inputs, once per computation, for every signature."""
    runs: list[Run]
    keys: dict[str, str]              # each signature -> the key its computation was run under
    notes: list[str]                  # inputs left out: the original fails on them


def reference(original, signatures: dict[str, tuple[dict[str, tf.TensorSpec], shape_ranges.DimRanges]],
              examples: list[dict], computations: dict[str, object]) -> Reference:
    """Runs the original's signatures ({key: (input specs, ranges)}) on the check's inputs, once
    per computation (`computations`: what each key computes; Keras' serve and serving_default
    alike)."""
    runs, notes, first = [], [], {}
    for key, (specs, ranges) in signatures.items():
        if computations[key] in first:
            continue
        first[computations[key]] = key
        for feed in _inputs(specs, ranges, examples):
            at = shape_ranges.shapes_text(feed)
            try:
                expected = original.signatures[key](**feed)
            except tf.errors.OpError as error:
                notes.append(f"{key}: the output check left out {at}: the original model fails there "
                             f"({shape_ranges.op_error_summary(error)})")
                continue
            runs.append(Run(key, feed, at, {name: np.asarray(value) for name, value in expected.items()}))
    return Reference(runs, {key: first[computations[key]] for key in signatures}, notes)


def compare(reference: Reference, run: Callable[[str, dict[str, tf.Tensor]], dict],
            bound: float = BOUND) -> OutputCheck:
    """Each signature's largest error per output: `run(key, feed)` (the written model's outputs,
    or a candidate's) against the original's."""
    started, worst = time.perf_counter(), {}
    for original in reference.runs:
        try:
            found = _compare(original.key, original.outputs, run(original.key, original.feed), original.at)
        except tf.errors.OpError as error:  # where the original runs
            found = [OutputError(original.key, name, float("inf"), f"{original.at} (it fails: "
                                 f"{shape_ranges.op_error_summary(error)})", True) for name in original.outputs]
        worst.setdefault(original.key, []).extend(found)
    errors = [dataclasses.replace(e, signature=key) for key, first in reference.keys.items()
              for e in _largest(worst.get(first, []))]
    return OutputCheck(len(reference.runs), errors, list(reference.notes), bound, time.perf_counter() - started)


def check(original, written, signatures: dict[str, tuple[dict[str, tf.TensorSpec], shape_ranges.DimRanges]],
          examples: list[dict], computations: dict[str, object], bound: float = BOUND) -> OutputCheck:
    """The written model against the original on the check's inputs (`reference`), with `bound`."""
    started = time.perf_counter()
    result = compare(reference(original, signatures, examples, computations),
                     lambda key, feed: written.signatures[key](**feed), bound)
    return dataclasses.replace(result, seconds=time.perf_counter() - started)


def _values(dtype: tf.DType, shape: list[int], rng: np.random.Generator) -> tf.Tensor:
    if dtype.is_floating:
        return tf.constant(rng.uniform(-1, 1, shape), dtype)
    return tf.zeros(shape, dtype)


def _compare(key: str, original: dict, written: dict, at: str) -> list[OutputError]:
    """Each output's error on one input (outputs by name, as signatures return them)."""
    return [_error(key, name, np.asarray(original[name]), np.asarray(written[name]), at) for name in original]


def _error(key: str, name: str, expected: np.ndarray, actual: np.ndarray, at: str) -> OutputError:
    if expected.shape != actual.shape:
        return OutputError(key, name, float("inf"), at, True)
    if not np.issubdtype(expected.dtype, np.floating):
        differ = np.count_nonzero(expected != actual)
        return OutputError(key, name, differ / expected.size if expected.size else 0.0, at, False)
    expected, actual = expected.astype(np.float64), actual.astype(np.float64)
    finite = np.isfinite(expected)
    if not np.array_equal(np.isnan(expected), np.isnan(actual)) or \
            not np.array_equal(expected[~finite & ~np.isnan(expected)], actual[~finite & ~np.isnan(expected)]):
        return OutputError(key, name, float("inf"), at, True)
    return OutputError(key, name, row_error(np.where(finite, expected, 0.0), np.where(finite, actual, 0.0)), at, True)


def row_error(expected: np.ndarray, actual: np.ndarray) -> float:
    """The largest row error relative to the largest row norm, rows along the last axis (a rank-0
    or rank-1 array is one row): max ||actual_row - expected_row||_2 / max ||expected_row||_2.
    For unit-norm rows (embeddings) it is sqrt(2 (1 - cos)) of the worst row."""
    expected, actual = np.asarray(expected, np.float64), np.asarray(actual, np.float64)
    if not expected.size:
        return 0.0
    width = expected.shape[-1] if expected.ndim else 1
    expected, actual = expected.reshape(-1, width), actual.reshape(-1, width)
    largest = np.linalg.norm(expected, axis=1).max(initial=0.0)
    error = np.linalg.norm(actual - expected, axis=1).max(initial=0.0)
    return float(error / max(largest, np.finfo(np.float32).tiny))


def _largest(errors: list[OutputError]) -> list[OutputError]:
    """Per (signature, output), its largest error over the inputs, in first-seen order."""
    worst: dict[tuple[str, str], OutputError] = {}
    for error in errors:
        key = (error.signature, error.output)
        if key not in worst or not error.error <= worst[key].error:
            worst[key] = error
    return list(worst.values())
