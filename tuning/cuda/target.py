"""A GPU as the search's and the cost model's target (the CPU's is hardware.Hardware).

DietCode's f_occ is the GPU's: thread blocks run in waves over the SMs, and a
last wave that leaves SMs idle wastes them. Here the SMs are the parallel
units, the thread blocks the tasks, and the coefficient k is learned from
measurements as on the CPU; f_MK learns a kernel's own throughput from the
features below, which include what decides how many of its blocks share an SM.
"""

import dataclasses
import math

from tf_dietcode.tuning.cuda import space
from tf_dietcode.tuning.cuda.limits import GpuLimits
from tf_dietcode.tuning.cuda.space import GpuKernel

# Bumped whenever the generated CUDA code changes, so measurements of older kernels are not reused
# (2: NT's y tile laid out [K, columns] in shared memory; 3: pipelined kernels, two shared buffers;
# 4: their cp.async copies 16 bytes at a time where the layout allows).
CUDA_TEMPLATES_VERSION = 4


@dataclasses.dataclass(frozen=True)
class GpuTarget:
    limits: GpuLimits
    sms: int    # streaming multiprocessors of the GPU measured (132 on an H100 or H200)
    stages: tuple[int, ...] = space.STAGES  # pipeline depths the space offers (1 alone: templates 2's space)

    kernel_type = GpuKernel

    @property
    def name(self) -> str:
        """The tuning database's key: the architecture and the version of the CUDA templates."""
        return f"cuda-{self.limits.arch}-{self.sms}sm-v{CUDA_TEMPLATES_VERSION}"

    @property
    def cores(self) -> int:
        return self.sms

    def space(self, workload) -> list[GpuKernel]:
        return space.space(self.limits, workload, self.stages)

    def kernel_features(self, kernel: GpuKernel) -> list[float]:
        """Tile shape, threads, the register tile (FMAs per shared-memory load), shared
        memory and registers against the SM's, and so how many blocks fit an SM, and
        the pipeline's stages."""
        threads = kernel.threads[0] * kernel.threads[1]
        resident = min(self.limits.registers_per_sm // (threads * kernel.registers()), 2048 // threads, 32)
        intensity = kernel.thread_m * kernel.thread_n / (kernel.thread_m + kernel.thread_n)
        return [kernel.block_m, kernel.block_n, kernel.thread_m, kernel.thread_n, kernel.tile_k, threads,
                kernel.registers(), kernel.shared_bytes() / self.limits.shared_bytes_per_block, resident,
                intensity, math.log2(kernel.block_m * kernel.block_n), kernel.stages]

    def busy(self, kernel: GpuKernel) -> bool:
        """Worth a place in the first batch: a register tile of 4 or more outputs a thread."""
        return kernel.thread_m * kernel.thread_n >= 4

    def task_count(self, workload, kernel: GpuKernel, dims: dict):
        """Thread blocks of one launch (dims: sizes, or arrays of sizes)."""
        return dims["b"] * -(-dims["m"] // kernel.block_m) * -(-dims["n"] // kernel.block_n)

    def computed_elements(self, workload, kernel: GpuKernel, dims: dict):
        return self.task_count(workload, kernel, dims) * kernel.block_m * kernel.block_n

    def weight_layout(self, workload, kernel: GpuKernel) -> dict:
        """Every GPU kernel reads a dense weight as stored, [K, N]."""
        return {"packed": False}
