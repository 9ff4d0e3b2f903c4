"""Tuning workloads: one fused product with its shape ranges, the key of all tuning.

    dense:         out[M, N] = act(x[M, K] @ w[N, K]^T + bias[N]); w static, M dynamic
                   (a constant w may be read pre-packed; a variable, e.g. a trainable
                   Keras kernel, is read in place as stored: [K, N]; `weight_layout`
                   says which, "any" letting the tuner pick the faster; `cold_weight`:
                   the model's weights outgrow the last-level cache, so every call reads
                   w from DRAM and kernels are timed that way; `groups` > 1: w's rows are
                   that many layers side by side, each N / groups wide, and the output is
                   written group-major, out[groups, M, N / groups], so each layer's output is
                   a contiguous block (horizontal fusion); its weight is pre-packed)
    batch_matmul:  out[B, M, N] = alpha * x[B, M, K] @ y[B, K, N] (+ addend)   (NN), or y[B, N, K]^T (NT)

A batch matmul's `bias` is its broadcast addend (a mask or bias); its
kernels read every operand through strides, so B may be any two batch dims
in any layout (see templates/batch_matmul.py).

Any of B, M, N, K of a batch matmul may be dynamic. Dynamic dims listed in
`ties` always have the same size (attention's [192,T,64]x[192,T,64]^T ties M
and N to T), so they are sampled as one variable. A workload is hashable and
serialises to a stable JSON key for the tuning database and kernel bundles.
"""

import dataclasses
import functools
import itertools
import json

import numpy as np

from tf_dietcode.op_contract import ACTIVATIONS

KINDS = ("dense", "batch_matmul")
DIMS = ("b", "m", "n", "k")
WEIGHT_LAYOUTS = ("any", "packed", "in_place")


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
    def of(cls, value: "int | tuple[int, int] | list | dict | DimRange") -> "DimRange":
        if isinstance(value, DimRange):
            return value
        if isinstance(value, int):
            return cls(value, value)
        if isinstance(value, dict):
            return cls(**value)
        return cls(*value)


@dataclasses.dataclass(frozen=True)
class Workload:
    kind: str
    m: DimRange
    n: DimRange
    k: DimRange
    b: DimRange = DimRange(1, 1)
    transpose_b: bool = True
    bias: bool = False
    activation: str = "none"
    ties: tuple[str, ...] = ()
    dtype: str = "float32"
    weight_layout: str = "any"  # dense: "packed", "in_place" (w a variable) or "any" (the tuner picks)
    cold_weight: bool = False   # dense: w, bias and out flushed from the caches before each timed run
    groups: int = 1             # dense: layers side by side in w, output group-major [groups, M, N / groups]

    def __post_init__(self):
        for name in DIMS:
            object.__setattr__(self, name, DimRange.of(getattr(self, name)))
        object.__setattr__(self, "ties", tuple(self.ties))
        if self.kind not in KINDS:
            raise ValueError(f"workload kind must be one of {KINDS}, got {self.kind!r}")
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {ACTIVATIONS}, got {self.activation!r}")
        if self.weight_layout not in WEIGHT_LAYOUTS:
            raise ValueError(f"weight_layout must be one of {WEIGHT_LAYOUTS}, got {self.weight_layout!r}")
        if self.dtype != "float32":
            raise ValueError(f"only float32 is tuned, got {self.dtype}")
        if self.kind == "dense" and not (self.n.static and self.k.static and self.b == DimRange(1, 1)
                                         and self.transpose_b):
            raise ValueError("a dense workload has a static weight w[N, K] and no batch dim")
        if self.kind == "batch_matmul" and (self.activation != "none" or self.cold_weight or self.groups != 1):
            raise ValueError("batch_matmul workloads have no activation epilogue, no static weight and no groups")
        if self.groups < 1 or self.n.hi % self.groups:
            raise ValueError(f"groups must be >= 1 and divide N={self.n.hi}, got {self.groups}")
        if self.groups > 1 and self.weight_layout != "packed":
            raise ValueError("a dense workload with groups reads its weight pre-packed (weight_layout='packed')")
        if self.ties and (len(self.ties) < 2 or not set(self.ties) <= set(self.dynamic_dims)):
            raise ValueError(f"ties must name two or more dynamic dims of {self.dynamic_dims}, got {self.ties}")

    @property
    def group_n(self) -> int:
        """Columns of one group: N, or N / groups for layers side by side."""
        return self.n.hi // self.groups

    @property
    def dynamic_dims(self) -> tuple[str, ...]:
        return tuple(d for d in DIMS if not getattr(self, d).static)

    def variables(self) -> list[tuple[tuple[str, ...], DimRange]]:
        """Independent shape variables: each a group of dims sharing one size, with its range."""
        return list(self._variables)

    @functools.cached_property
    def _variables(self) -> tuple[tuple[tuple[str, ...], DimRange], ...]:
        """Worked out once: dispatch sizes every shape of a range (hundreds of thousands of dims_at)."""
        groups = [(self.ties, DimRange(max(getattr(self, d).lo for d in self.ties),
                                       min(getattr(self, d).hi for d in self.ties)))] if self.ties else []
        groups += [((d,), getattr(self, d)) for d in self.dynamic_dims if d not in self.ties]
        return tuple(groups)

    def dims_at(self, values: tuple[int, ...]) -> dict[str, int]:
        """Every dim's size when the shape variables take `values`."""
        dims = {d: getattr(self, d).lo for d in DIMS}
        for (names, _), value in zip(self._variables, values):
            for name in names:
                dims[name] = value
        return dims

    def dims_over(self, shapes: list[tuple[int, ...]]) -> dict[str, np.ndarray]:
        """dims_at of many shapes at once: each dim's sizes as an array, one entry per shape."""
        values = np.array(shapes, dtype=np.int64).reshape(len(shapes), len(self._variables))
        dims = {d: np.full(len(shapes), getattr(self, d).lo, np.int64) for d in DIMS}
        for column, (names, _) in enumerate(self._variables):
            for name in names:
                dims[name] = values[:, column]
        return dims

    def all_shapes(self, limit: int = 20000) -> list[tuple[int, ...]]:
        """Every combination of variable values (strided down to about `limit` points)."""
        axes = [range(r.lo, r.hi + 1) for _, r in self.variables()]
        total = 1
        for axis in axes:
            total *= len(axis)
        stride = max(1, round((total / limit) ** (1 / max(len(axes), 1))))
        return list(itertools.product(*(dict.fromkeys([*axis[::stride], axis[-1]]) for axis in axes)))

    def contains(self, dims: dict[str, int]) -> bool:
        return all(getattr(self, d).lo <= dims[d] <= getattr(self, d).hi for d in DIMS)

    def flops(self, dims: dict) -> float:  # dims: sizes, or arrays of sizes (dims_over)
        return 2.0 * dims["b"] * dims["m"] * dims["n"] * dims["k"]

    def describe(self) -> str:
        """One line for reports: the product, each dim's size or range, the epilogue."""
        names = ("m", "n", "k") if self.kind == "dense" else DIMS
        sizes = " ".join(f"{d.upper()}={r.lo}" if r.static else f"{d.upper()}={r.lo}..{r.hi}"
                         for d in names for r in [getattr(self, d)])
        if self.kind == "dense":
            groups = f" groups={self.groups}" if self.groups > 1 else ""
            return f"dense {sizes}{groups} bias={self.bias} {self.activation}" + (" cold" if self.cold_weight else "")
        ties = f" ties {'='.join(self.ties).upper()}" if self.ties else ""
        return f"batch matmul {'NT' if self.transpose_b else 'NN'} {sizes}{ties} addend={self.bias}"

    def key(self) -> str:
        """Stable JSON text identifying the workload (the tuning database key); `groups` only
        where > 1, so keys (and databases) from before it existed still match."""
        fields = dataclasses.asdict(self)
        if self.groups == 1:
            del fields["groups"]
        return json.dumps(fields, sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_key(cls, key: str) -> "Workload":
        return cls(**json.loads(key))
