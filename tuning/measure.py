"""Compiling micro-kernels and measuring them with real runs on this machine.

A measurement is one micro-kernel at one shape: median seconds over repeats
after a warm-up, or the error that stopped it (recorded, never raised).
"""

import dataclasses

import numpy as np
import tvm

from tf_dietcode.tuning.hardware import Hardware
from tf_dietcode.tuning.micro_kernel import MicroKernel
from tf_dietcode.tuning.templates import dense
from tf_dietcode.tuning.workload import Workload


@dataclasses.dataclass(frozen=True)
class Measurement:
    kernel: MicroKernel
    m: int
    seconds: float | None      # median seconds per call; None when it failed
    error: str | None = None

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, record: dict) -> "Measurement":
        return cls(MicroKernel(**record["kernel"]), record["m"], record["seconds"], record["error"])


def compile_kernel(workload: Workload, kernel: MicroKernel, hw: Hardware, m: int | None = None):
    """One compiled micro-kernel: symbolic in M (m=None) or for one static M."""
    return tvm.compile(dense.schedule(workload, kernel, m), target=hw.target())


def random_operands(workload: Workload, m: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Unpacked operands x, w, (bias) for one call at M=m."""
    operands = {"x": rng.uniform(-1, 1, (m, workload.k.hi)).astype(np.float32),
                "w": rng.uniform(-1, 1, (workload.n.hi, workload.k.hi)).astype(np.float32)}
    if workload.bias:
        operands["bias"] = rng.uniform(-1, 1, (workload.n.hi,)).astype(np.float32)
    return operands


def reference_output(operands: dict[str, np.ndarray], workload: Workload) -> np.ndarray:
    """The workload computed by numpy in float64 (activations as TF defines them)."""
    from scipy.special import erf

    out = operands["x"].astype(np.float64) @ operands["w"].astype(np.float64).T
    if workload.bias:
        out += operands["bias"]
    return {
        "none": lambda x: x,
        "relu": lambda x: np.maximum(x, 0),
        "tanh": np.tanh,
        "sigmoid": lambda x: 1 / (1 + np.exp(-x)),
        "gelu": lambda x: 0.5 * x * (1 + erf(x / np.sqrt(2))),
        "gelu_tanh": lambda x: 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3))),
    }[workload.activation](out)


def kernel_arguments(operands: dict[str, np.ndarray], workload: Workload, kernel: MicroKernel):
    """Device tensors in the kernel's parameter order, the weight packed, output last."""
    device = tvm.cpu()
    arrays = [operands["x"], dense.pack_weight(operands["w"], workload, kernel)]
    if workload.bias:
        arrays.append(operands["bias"])
    arrays.append(np.zeros((operands["x"].shape[0], workload.n.hi), np.float32))
    return [tvm.runtime.tensor(a, device) for a in arrays]


def run(executable, arguments) -> None:
    executable.mod["main"](*arguments)


def measure(executable, workload: Workload, kernel: MicroKernel, ms: list[int],
            rng: np.random.Generator, repeats: int = 5, min_repeat_ms: int = 20) -> list[Measurement]:
    """Median time of `executable` at each M (warm-up excluded)."""
    results = []
    for m in ms:
        # A fresh timer per shape: one timer keeps the call count it settled on
        # for the first (smallest) shape, which makes large shapes take ages.
        timer = executable.mod.time_evaluator("main", tvm.cpu(), number=1, repeat=repeats,
                                              min_repeat_ms=min_repeat_ms)
        try:
            arguments = kernel_arguments(random_operands(workload, m, rng), workload, kernel)
            run(executable, arguments)
            results.append(Measurement(kernel, m, float(np.median(timer(*arguments).results))))
        except Exception as error:  # noqa: BLE001 - a failed candidate is data, not a crash
            results.append(Measurement(kernel, m, None, f"{type(error).__name__}: {error}"))
    return results
