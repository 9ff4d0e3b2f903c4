"""Hardware limits of the machine that runs the kernels, read once.

The micro-kernel space is built from these numbers (vector width, registers,
cache sizes, cores), never from a shape, so one space serves a shape range.
"""

import dataclasses
import functools
import os
import pathlib

from tf_dietcode import cpu_features
from tf_dietcode.tuning import micro_kernel

CACHE_DIR = pathlib.Path("/sys/devices/system/cpu/cpu0/cache")


@dataclasses.dataclass(frozen=True)
class Hardware:
    mcpu: str                # LLVM's name for the CPU, e.g. "znver3", "sapphirerapids"
    features: tuple[str, ...]
    vector_lanes: int        # float32 lanes per SIMD register
    vector_registers: int
    l1d_bytes: int
    l2_bytes: int
    cores: int
    l3_bytes: int = 32 << 20  # the last-level cache

    def holds_in_cache(self, weight_bytes: int) -> bool:
        """Whether weights of this size stay cached from one call of a model to the next;
        where they do not, each call streams them from DRAM (Workload.cold_weight)."""
        return weight_bytes <= self.l3_bytes

    def target(self):
        """The TVM LLVM target for this machine."""
        import tvm

        return tvm.target.Target({"kind": "llvm", "mcpu": self.mcpu, "num-cores": self.cores})

    # What the search and the cost model ask of a target; a GPU's GpuTarget
    # (tuning/cuda/target.py) answers the same for its kernels.
    kernel_type = micro_kernel.MicroKernel

    @property
    def name(self) -> str:
        """The tuning database's key for measurements taken here."""
        return self.mcpu

    def space(self, workload) -> list:
        return micro_kernel.space(self, workload)

    def kernel_features(self, kernel) -> list[float]:
        return micro_kernel.features(kernel, self)

    def busy(self, kernel) -> bool:
        """Worth a place in the first batch: accumulators fill at least half the vector registers."""
        return micro_kernel.accumulator_share(kernel, self) >= 0.5

    def task_count(self, workload, kernel, dims: dict):
        """Parallel tasks of one call (dims: sizes, or arrays of sizes for many shapes at once)."""
        from tf_dietcode.tuning import templates  # TVM: loaded only where kernels are built

        return templates.for_workload(workload).task_count(workload, kernel, dims)

    def computed_elements(self, workload, kernel, dims: dict):
        """Output elements computed including padding."""
        from tf_dietcode.tuning import templates

        return templates.for_workload(workload).computed_elements(workload, kernel, dims)

    def weight_layout(self, workload, kernel) -> dict:
        """The layout in which the kernel reads a static weight (kernels of one dispatch share it)."""
        from tf_dietcode.tuning.templates import dense

        return dense.weight_layout(workload, kernel)


def _cache_bytes(level: int, default: int) -> int:
    """Size of the data/unified cache at `level` from sysfs, e.g. '32K' -> 32768."""
    for index in sorted(CACHE_DIR.glob("index*")):
        try:
            if int((index / "level").read_text()) == level and \
                    (index / "type").read_text().strip() in ("Data", "Unified"):
                size = (index / "size").read_text().strip()
                scale = {"K": 1 << 10, "M": 1 << 20}.get(size[-1], 1)
                return int(size.rstrip("KM")) * scale
        except (OSError, ValueError):
            continue
    return default


def float32_lanes(features) -> int:
    """float32 lanes of the widest vector registers that SIMD `features` give."""
    return 16 if "avx512f" in features else 8 if "avx" in features else 4


def llvm_float32_lanes(func) -> int | None:
    """float32 lanes of the CPU a lowered function is compiled for; None if it is not for a CPU
    (the TIR passes that write vectors by hand apply to CPU kernels only)."""
    import tvm

    target = func.attrs.get("target") if func.attrs else None
    if target is None or target.kind.name != "llvm":
        return None
    return float32_lanes([feature for feature in ("avx512f", "avx")
                          if tvm.target.codegen.llvm_cpu_has_features([feature], target)])


@functools.cache
def detect() -> "Hardware":
    """This machine's limits (cores: the CPUs this process may run on)."""
    import tvm

    features = tuple(cpu_features.simd_features())
    return Hardware(
        mcpu=str(tvm.target.codegen.llvm_get_system_cpu()),
        features=features,
        vector_lanes=float32_lanes(features),
        vector_registers=32 if "avx512f" in features else 16,
        l1d_bytes=_cache_bytes(1, 32 << 10),
        l2_bytes=_cache_bytes(2, 512 << 10),
        cores=len(os.sched_getaffinity(0)),
        l3_bytes=_cache_bytes(3, 32 << 20),
    )
