"""GPU micro-kernels and the shape-generic space they are drawn from.

A thread block computes a block_m x block_n output tile, each of its threads a
thread_m x thread_n register tile, stepping through K tile_k at a time with
both operand tiles staged in shared memory, in one buffer or, pipelined, in
`stages` of them: the copies of the next K steps (cp.async, sm_80 and newer)
run while the current one is computed. Every size comes from the limits
of the target architectures (threads, shared memory, registers), none from a
shape; tiles need not divide the dims (local padding does the rest).
"""

import dataclasses
import itertools
import re

from tf_dietcode.tuning.cuda.limits import GpuLimits
from tf_dietcode.tuning.workload import Workload

BLOCK_SIZES = (8, 16, 32, 64, 128)
THREAD_TILES = (1, 2, 4, 8)
K_STEPS = (8, 16, 32, 64)
STAGES = (1, 2)          # shared-memory buffers per operand: 2 overlaps the next K step's copy with this one's FMAs
REGISTER_OVERHEAD = 24  # addresses, loop counters and the fetch's temporaries, besides the tile
K_MAJOR_PADDING = 4     # a tile laid out [K, columns] has rows of K_MAJOR_PADDING words modulo SHARED_BANKS
SHARED_BANKS = 32       # 4-byte banks of shared memory
PIPELINED_STEPS = 8     # two stages only where the largest K takes this many K steps (see space())


@dataclasses.dataclass(frozen=True, order=True)
class GpuKernel:
    block_m: int
    block_n: int
    thread_m: int
    thread_n: int
    tile_k: int
    stages: int = 1

    @property
    def threads(self) -> tuple[int, int]:
        """(threadIdx.x, threadIdx.y) extents: x runs along N, y along M."""
        return self.block_n // self.thread_n, self.block_m // self.thread_m

    @property
    def name(self) -> str:
        pipelined = f"_s{self.stages}" if self.stages > 1 else ""  # one stage: the name records had before
        return f"g{self.block_m}x{self.block_n}_t{self.thread_m}x{self.thread_n}_k{self.tile_k}{pipelined}"

    @classmethod
    def from_name(cls, name: str) -> "GpuKernel":
        match = re.fullmatch(r"g(\d+)x(\d+)_t(\d+)x(\d+)_k(\d+)(?:_s(\d+))?", name)
        if match is None:
            raise ValueError(f"not a GPU kernel name: {name!r}")
        return cls(*(int(g) for g in match.groups() if g is not None))

    def registers(self) -> int:
        """Estimated registers a thread holds: its accumulators, one operand column and row."""
        return self.thread_m * self.thread_n + self.thread_m + self.thread_n + REGISTER_OVERHEAD

    def shared_bytes(self, workload: Workload | None = None) -> int:
        """Both operand tiles, once per stage; an NT y tile is laid out [K, columns] with rows
        padded to K_MAJOR_PADDING words past a multiple of SHARED_BANKS (see
        schedule._fetch_to_shared: 4 words past 64 columns, 28 past 8). No workload: the tiles alone."""
        nt = workload is not None and workload.kind == "batch_matmul" and workload.transpose_b
        padding = (K_MAJOR_PADDING - self.block_n) % SHARED_BANKS if nt else 0
        return (self.block_m + self.block_n + padding) * self.tile_k * 4 * self.stages


def _fits(kernel: GpuKernel, limits: GpuLimits, workload: Workload) -> bool:
    """Whole warps (2 to 8 of them), shared tiles within the per-block limit, and
    registers that leave room for two resident blocks per SM (one block per SM
    cannot hide its own shared-memory waits)."""
    x, y = kernel.threads
    threads = x * y
    return (threads % limits.warp == 0 and 2 * limits.warp <= threads <= min(256, limits.threads_per_block)
            and kernel.shared_bytes(workload) <= limits.shared_bytes_per_block
            and kernel.registers() <= limits.registers_per_thread
            and 2 * threads * kernel.registers() <= limits.registers_per_sm)


def space(limits: GpuLimits, workload: Workload, stages: tuple[int, ...] = STAGES) -> list[GpuKernel]:
    """Every GPU micro-kernel the limits admit for this workload (with these pipeline
    depths); tiles more than twice as large as a dim's largest size would only compute
    padding, and a pipeline over fewer than PIPELINED_STEPS K steps hides little (its
    first copy is never overlapped): on an H100, two stages sped up NT's best kernels
    (K = 64) by 1% at most and diluted its search."""
    kernels = []
    for bm, bn, tm, tn, bk, depth in itertools.product(BLOCK_SIZES, BLOCK_SIZES, THREAD_TILES, THREAD_TILES,
                                                       K_STEPS, stages):
        if bm % tm or bn % tn or bm > 2 * max(workload.m.hi, 8) or bn > 2 * max(workload.n.hi, 8) \
                or bk > 2 * max(workload.k.hi, 8) or (depth > 1 and workload.k.hi < PIPELINED_STEPS * bk):
            continue
        kernel = GpuKernel(bm, bn, tm, tn, bk, depth)
        if _fits(kernel, limits, workload):
            kernels.append(kernel)
    return kernels
