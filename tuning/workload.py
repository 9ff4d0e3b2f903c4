"""Tuning workloads: one fused product with its shape ranges, the key of all tuning.

A workload is hashable and serialises to a stable JSON key, so the tuning
database and kernel bundles can be looked up by it.
"""

import dataclasses
import json

KINDS = ("dense",)
ACTIVATIONS = ("none", "relu", "tanh", "sigmoid", "gelu", "gelu_tanh")


@dataclasses.dataclass(frozen=True)
class DimRange:
    """An inclusive range of a dimension's sizes; lo == hi is a static dim."""

    lo: int
    hi: int

    def __post_init__(self):
        if not 0 <= self.lo <= self.hi:
            raise ValueError(f"dim range needs 0 <= lo <= hi, got [{self.lo}, {self.hi}]")

    @property
    def static(self) -> bool:
        return self.lo == self.hi

    @classmethod
    def of(cls, value: "int | tuple[int, int] | dict | DimRange") -> "DimRange":
        if isinstance(value, DimRange):
            return value
        if isinstance(value, int):
            return cls(value, value)
        if isinstance(value, dict):
            return cls(**value)
        return cls(*value)


@dataclasses.dataclass(frozen=True)
class Workload:
    """Dense: out[M, N] = act(x[M, K] @ w[N, K]^T + bias[N]), M dynamic, the weight static."""

    kind: str
    m: DimRange
    n: DimRange
    k: DimRange
    bias: bool = True
    activation: str = "none"
    dtype: str = "float32"

    def __post_init__(self):
        for name in ("m", "n", "k"):
            object.__setattr__(self, name, DimRange.of(getattr(self, name)))
        if self.kind not in KINDS:
            raise ValueError(f"workload kind must be one of {KINDS}, got {self.kind!r}")
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {ACTIVATIONS}, got {self.activation!r}")
        if self.dtype != "float32":
            raise ValueError(f"only float32 is tuned, got {self.dtype}")
        if not (self.n.static and self.k.static):
            raise ValueError("a dense workload's weight dims N and K must be static")

    def key(self) -> str:
        """Stable JSON text identifying the workload (the tuning database key)."""
        return json.dumps(dataclasses.asdict(self), sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_key(cls, key: str) -> "Workload":
        return cls(**json.loads(key))

    def flops(self, m: int) -> float:
        return 2.0 * m * self.n.hi * self.k.hi
