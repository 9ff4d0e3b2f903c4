"""The accuracy gate: dense layers back in float32, most sensitive first, until the outputs meet max_error.

optimize() in a reduced precision runs the original model and the rewritten one
on the output check's inputs (output_check: input_fn's, else random inputs at
the corners and middle of the shape ranges) and measures each output's error
relative to its largest |value|. Beyond max_error, the layers are ranked by
sensitivity and the most sensitive k are put back in float32, k found in a few
rounds: k = 1, 2, 4, ... until the bound holds, then bisection between the last
k that failed and the first that held. Each round rewrites the model and runs
it on the same inputs (the original's outputs are read once). If the bound does
not hold with every layer in float32, BoundUnreachable says so.

A layer's sensitivity is its own output error in the reduced precision on its
own inputs, recorded from the original model on the check's inputs: its op run
on them against the float32 product, relative to that product's largest
|value|. It sees what weight-only measures miss (an input whose rows have one
huge value, which the int8 op's per-row scale then flattens); on a small
encoder it ranked layers closer to their effect on the output than the weight's
quantization error did (docs/decisions.md, "Precision"). It costs one run of
the original model and one op call per layer and input.
"""

import dataclasses
from collections.abc import Callable

import numpy as np
import tensorflow as tf

from tf_dietcode import output_check
from tf_dietcode.output_check import OutputCheck
from tf_dietcode.precision.contract import Precision


@dataclasses.dataclass(frozen=True)
class Round:
    """One candidate the gate ran: its `in_float32` most sensitive layers back in float32."""
    in_float32: int
    error: float      # the largest output error, relative to the output's largest |value|
    output: str       # which output ("signature.output")

    @property
    def text(self) -> str:
        return f"{self.in_float32} in float32: error {self.error:.2g} ({self.output})"


@dataclasses.dataclass
class GateResult:
    """What the gate did: the layers it ranked (most sensitive first, with their own error), the
    rounds it ran and how many layers it kept in float32 (the first `in_float32` of `ranked`)."""
    precision: str
    max_error: float
    ranked: list[tuple[str, float]]
    rounds: list[Round]
    in_float32: int
    seconds: float = 0.0

    def why_float32(self, rank: int) -> str:
        """Why the layer ranked `rank` (one the gate put back) runs in float32: the error of the last
        round that failed with it still in the reduced precision."""
        failed = max((r for r in self.rounds if r.in_float32 <= rank and not r.error <= self.max_error),
                     key=lambda r: r.in_float32)
        return (f"kept by the accuracy gate (output error {failed.error:.3g} > max_error {self.max_error:g} "
                f"with it in {self.precision})")

    def summary(self) -> list[str]:
        first = self.rounds[0]
        if first.in_float32 == 0 and first.error <= self.max_error:
            return [f"accuracy gate: error {first.error:.2g} <= max_error {self.max_error:g} with every layer it "
                    f"could convert in {self.precision} ({first.output})"]
        return [f"accuracy gate: {self.in_float32} of {len(self.ranked)} dense layers kept in float32 to meet "
                f"max_error {self.max_error:g}, most sensitive first ({len(self.rounds)} rounds: "
                + "; ".join(r.text for r in self.rounds) + ")"]

    def to_json(self) -> dict:
        return {"max_error": self.max_error, "in_float32": self.in_float32, "seconds": self.seconds,
                "ranked": [{"node": node, "own_error": error} for node, error in self.ranked],
                "rounds": [dataclasses.asdict(r) for r in self.rounds]}


class BoundUnreachable(output_check.OutputMismatch):
    """max_error is not met even with every dense layer in float32: nothing is written."""

    def __init__(self, check: OutputCheck, layers: int):
        self.check = check
        worst = check.largest
        ValueError.__init__(self, f"max_error {check.bound:g} cannot be met: with all {layers} dense layers back in "
                                  f"float32 the largest output error is {worst.error:.3g} ({worst.signature}."
                                  f"{worst.output} at {worst.at}); nothing was written. Give a larger max_error "
                                  "(float32's own rounding reaches about 1e-6 of an output's largest value)")


def settle(layers: int, evaluate: Callable[[int], OutputCheck]) -> tuple[int, list[Round]]:
    """How many of the `layers` (ranked, most sensitive first) go back in float32 for the bound to
    hold, `evaluate(k)` checking the model with the first k back; and the rounds run. Raises
    BoundUnreachable where it fails with all of them back."""
    rounds, checks = [], []

    def holds(k: int) -> bool:
        check = evaluate(k)
        worst = check.largest
        rounds.append(Round(k, worst.error if worst else 0.0, f"{worst.signature}.{worst.output}" if worst else ""))
        checks.append(check)
        return not check.beyond_bound

    if holds(0):
        return 0, rounds
    failed, step = 0, 1
    while not holds(min(step, layers)):
        if step >= layers:
            raise BoundUnreachable(checks[-1], layers)
        failed, step = step, step * 2
    held = min(step, layers)
    while held - failed > 1:
        middle = (failed + held) // 2
        if holds(middle):
            held = middle
        else:
            failed = middle
    return held, rounds


def own_error(precision: Precision, weight: np.ndarray, inputs: list[np.ndarray]) -> float:
    """A dense layer's own output error in `precision` on its recorded inputs (each [..., K]):
    the largest |op(x) - x @ weight| relative to the largest |x @ weight|, over all of them."""
    k, n = weight.shape
    converted = {name: tf.constant(value) for name, value in precision.convert(weight, None).items()}
    error = largest = 0.0
    for x in inputs:
        rows = np.asarray(x, np.float32).reshape(-1, k)
        expected = rows.astype(np.float64) @ weight.astype(np.float64)
        actual = precision.product(tf.constant(rows), converted, None, n=n, activation="none").numpy()
        error = max(error, float(np.abs(actual - expected).max(initial=0.0)))
        largest = max(largest, float(np.abs(expected).max(initial=0.0)))
    return error / max(largest, float(np.finfo(np.float32).tiny))
