"""The accuracy gate: dense layers put back, most sensitive first, until the outputs meet max_error.

optimize() in a reduced precision runs the original model and the rewritten one
on the output check's inputs (output_check: input_fn's, else random inputs at
the corners and middle of the shape ranges) and measures each output's error as
the output check does (output_check.row_error: the largest row error relative
to the largest row norm). Beyond max_error, the layers are ranked by
sensitivity and the most sensitive k are put back, k found in a few rounds:
k = 1, 2, 4, ... until the bound holds, then bisection between the last k that
failed and the first that held, down to a few candidates, of which the
smallest that holds wins. Each round rewrites the model and runs it on the same
inputs (the original's outputs are read once). The k chosen is one whose model
was run and held: an error that does not fall steadily as layers go back can
cost layers (a noisy failure at a power of two), never the bound.

Layers go back in the cheapest precision the mode offers (Precision.put_back_in:
int8 layers in bfloat16 where the CPU multiplies bfloat16 natively, else in
float32); where the bound does not hold even with every layer back in it, the
search runs again in the next, float32 last. If the bound does not hold with
every layer in float32, BoundUnreachable says so.

A layer's sensitivity is measured, not predicted: the model's output error with
that layer alone in the reduced precision (`rank`), one round per layer. On the
pretrained all-MiniLM-L6-v2 a layer's own output error ranked its 36 layers
poorly against that effect (Spearman 0.27), and in int8 the gate then kept 4
layers in float32 where the measured ranking keeps 2 (docs/decisions.md,
"Precision").
"""

import dataclasses
from collections.abc import Callable, Sequence

import numpy as np

from tf_dietcode import output_check
from tf_dietcode.output_check import OutputCheck


@dataclasses.dataclass(frozen=True)
class Round:
    """One candidate the gate ran: its `put_back` most sensitive layers back in `precision`."""
    put_back: int
    precision: str
    error: float      # the largest output error (output_check.row_error)
    output: str       # which output ("signature.output")

    @property
    def text(self) -> str:
        back = f"{self.put_back} in {self.precision}" if self.put_back else "none back"
        return f"{back}: error {self.error:.2g} ({self.output})"

    @classmethod
    def of(cls, put_back: int, precision: str, check: OutputCheck) -> "Round":
        worst = check.largest
        return cls(put_back, precision, worst.error if worst else 0.0,
                   f"{worst.signature}.{worst.output}" if worst else "")


@dataclasses.dataclass
class GateResult:
    """What the gate did: how many dense layers it could convert, those it ranked (most sensitive
    first, with the output error each reads alone in the precision; none where the model met the
    bound with every layer converted), the rounds it ran and how many layers it put back, in which
    precision (the first `put_back` of `ranked`, in `put_back_in`)."""
    precision: str
    max_error: float
    layers: int
    ranked: list[tuple[str, float]]
    rounds: list[Round]
    put_back: int
    put_back_in: str = "float32"
    seconds: float = 0.0

    def why_put_back(self, rank: int) -> str:
        """Why the layer ranked `rank` (one the gate put back) runs in `put_back_in`: the error of the
        last round that failed with it still in the reduced precision."""
        failed = max((r for r in self.rounds if r.put_back <= rank and not r.error <= self.max_error),
                     key=lambda r: r.put_back)
        return (f"put back by the accuracy gate (output error {failed.error:.3g} > max_error {self.max_error:g} "
                f"with it in {self.precision})")

    def summary(self) -> list[str]:
        first = self.rounds[0]
        if first.put_back == 0 and first.error <= self.max_error:
            return [f"accuracy gate: error {first.error:.2g} <= max_error {self.max_error:g} with every layer it "
                    f"could convert in {self.precision} ({first.output})"]
        return [f"accuracy gate: {self.put_back} of {self.layers} dense layers put back in {self.put_back_in} to "
                f"meet max_error {self.max_error:g}, most sensitive first ({len(self.rounds)} rounds: "
                + "; ".join(r.text for r in self.rounds) + ")"]

    def to_json(self) -> dict:
        return {"max_error": self.max_error, "layers": self.layers, "put_back": self.put_back,
                "put_back_in": self.put_back_in, "seconds": self.seconds,
                "ranked": [{"node": node, "error_alone": error} for node, error in self.ranked],
                "rounds": [dataclasses.asdict(r) for r in self.rounds]}


class BoundUnreachable(output_check.OutputMismatch):
    """max_error is not met even with every dense layer in float32: nothing is written."""

    def __init__(self, check: OutputCheck, layers: int):
        self.check = check
        worst = check.largest
        ValueError.__init__(self, f"max_error {check.bound:g} cannot be met: with all {layers} dense layers back in "
                                  f"float32 the largest output error is {worst.error:.3g} ({worst.signature}."
                                  f"{worst.output} at {worst.at}); nothing was written. Give a larger max_error "
                                  "(float32's own rounding reaches about 1e-6 of an output's largest row norm)")


SCAN = 4  # bisection stops at this many candidates, then tries them in order


def settle(layers: int, put_back_in: Sequence[str],
           evaluate: Callable[[int, str], OutputCheck]) -> tuple[int, str, list[Round]]:
    """How many of the `layers` (ranked, most sensitive first) go back, and in which of the
    precisions `put_back_in` (cheapest first, float32 last), for the bound to hold, `evaluate(k, p)`
    checking the model with the first k back in p; and the rounds run. The first precision in which
    some k holds wins; the k returned is one evaluate() held at. Raises BoundUnreachable where the
    bound fails with all of them back in the last."""
    rounds, checks = [], []

    def holds(k: int, precision: str) -> bool:
        check = evaluate(k, precision)
        rounds.append(Round.of(k, precision, check))
        checks.append(check)
        return not check.beyond_bound

    if holds(0, put_back_in[0]):
        return 0, put_back_in[0], rounds
    for precision in put_back_in:
        held = _fewest(layers, lambda k, p=precision: holds(k, p))
        if held is not None:
            return held, precision, rounds
    raise BoundUnreachable(checks[-1], layers)


def _fewest(layers: int, holds: Callable[[int], bool]) -> int | None:
    """The fewest k in 1..layers that holds (k = 0 having failed), found by doubling, bisection down
    to SCAN candidates, then those in order; None where not even k = layers holds."""
    failed, step = 0, 1
    while not holds(min(step, layers)):
        if step >= layers:
            return None
        failed, step = step, step * 2
    held = min(step, layers)
    while held - failed > SCAN:
        middle = (failed + held) // 2
        if holds(middle):
            held = middle
        else:
            failed = middle
    # the few left in order: one noisy failure in between does not hide a smaller k that holds
    return next((k for k in range(failed + 1, held) if holds(k)), held)


def rank(layers: list, evaluate: Callable[[list], OutputCheck]) -> list[tuple[object, float]]:
    """(layer, output error with it alone in the reduced precision), most sensitive first:
    `evaluate(kept)` checks the model with the layers `kept` put back and the others converted."""
    errors = []
    for layer in layers:
        worst = evaluate([other for other in layers if other != layer]).largest
        errors.append((layer, worst.error if worst else 0.0))
    return sorted(errors, key=lambda pair: np.inf if np.isnan(pair[1]) else pair[1], reverse=True)
