"""Per-architecture limits of NVIDIA GPUs that bound the micro-kernel space.

This project's build machines have nvcc but no GPU, so the limits come from
NVIDIA's published tables per compute capability (CUDA C Programming Guide,
"Compute Capabilities"); the GPU runner (bench/cuda_kernels.py) prints the
device's own properties beside its measurements.
"""

import dataclasses


@dataclasses.dataclass(frozen=True)
class GpuLimits:
    arch: str                      # nvcc's name, e.g. "sm_90"
    threads_per_block: int
    shared_bytes_per_block: int    # without opting in to more (static shared memory)
    registers_per_thread: int
    registers_per_sm: int
    warp: int = 32


ARCHS = {
    "sm_80": GpuLimits("sm_80", 1024, 48 << 10, 255, 64 << 10),
    "sm_90": GpuLimits("sm_90", 1024, 48 << 10, 255, 64 << 10),
}


def common(archs: tuple[str, ...]) -> GpuLimits:
    """The limits every one of `archs` meets: one fatbin's kernels must run on all."""
    chosen = [ARCHS[a] for a in archs]
    return GpuLimits(",".join(archs), *(min(getattr(c, f.name) for c in chosen)
                                        for f in dataclasses.fields(GpuLimits)[1:]))
