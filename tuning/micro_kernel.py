"""Micro-kernel parameters and the shape-generic space they are drawn from.

A micro-kernel computes one output tile with fixed tile sizes; every size in
the space comes from hardware limits (vector lanes, registers, caches), never
from a particular shape, so the space serves a whole shape range. Tiles need
not divide the dims: local padding handles the remainder.
"""

import dataclasses
import itertools
from typing import TYPE_CHECKING

from tf_dietcode.tuning.workload import Workload

if TYPE_CHECKING:  # hardware.py uses this module to answer for its kernels
    from tf_dietcode.tuning.hardware import Hardware


@dataclasses.dataclass(frozen=True, order=True)
class MicroKernel:
    tile_m: int    # register-tile rows
    tile_n: int    # register-tile columns; also the pre-packed weight's block width
    tile_k: int    # K cache block (divides a static K; a dynamic K's last block is shorter); see blocks_the_reduction
    task_n: int    # tile_n blocks per parallel task (cache blocking of N)
    k_outer: bool  # K blocks outside (True) or inside (False) the task's N blocks; see orders_the_loops
    packed: bool = False  # dense: weight pre-packed in tile_n blocks (True) or read in place as w[K, N]
    task_m: int = 1  # row tiles per parallel task; 0: every row tile (tasks split N only); see _row_tiles_per_task
    whole_batch: bool = False  # batch matmul: a task is a whole batch, its column tasks in turn; see _batch_tasks

    @property
    def name(self) -> str:
        order = "ko" if self.k_outer else "ki"
        layout = "_p" if self.packed else ""
        rows = "_rall" if self.task_m == 0 else f"_r{self.task_m}" if self.task_m > 1 else ""
        batch = "_b" if self.whole_batch else ""
        return f"m{self.tile_m}_n{self.tile_n}_k{self.tile_k}_t{self.task_n}_{order}{layout}{rows}{batch}"

    @property
    def task_panel_bytes(self) -> int:
        """One task's weight panel (tile_k x tile_n x task_n floats), which the space fits in L2."""
        return self.tile_k * self.tile_n * self.task_n * 4


MAX_TILE_ROWS = 8  # the most rows a register tile has (the passes that rewrite tiles rely on it)


def _register_tiles(hw: "Hardware"):
    """(rows, columns) whose accumulators, one B row and one A broadcast fit the registers."""
    for vectors in (1, 2, 3, 4):
        for rows in range(1, MAX_TILE_ROWS + 1):
            if rows * vectors + vectors + 1 <= hw.vector_registers:
                yield rows, vectors * hw.vector_lanes


def _k_blocks(hw: "Hardware", workload: Workload, tile_n: int):
    """K cache blocks whose panel (tile_k x tile_n) fits in half of L2: divisors of a
    static K (and K itself), or powers of two up to K's maximum when K is dynamic
    (the last block is then shorter)."""
    k = workload.k.hi
    if workload.k.static:
        candidates = {k} | {d for d in (32, 64, 128, 192, 256, 384, 512) if d < k and k % d == 0}
    else:
        candidates = {d for d in (8, 16, 32, 64, 128, 256) if d < 2 * k}
    return _within_cache(sorted(candidates), lambda d: d * tile_n * 4, hw.l2_bytes // 2)


def _within_cache(items: list, footprint, limit: int) -> list:
    """The items whose footprint (bytes) fits `limit`, in order; where none does, those of the
    smallest footprint. Cache limits prune the space but must not empty it: a prime static K
    above ~8K has no K block that fits (dense K = 8209), and an attention task's panel of all
    of a long K outgrows a 1 MiB L2 at 16 lanes (NN with K up to 20000): a kernel that
    misses the cache beats none."""
    fitting = [item for item in items if footprint(item) <= limit]
    if fitting or not items:
        return fitting
    smallest = min(map(footprint, items))
    return [item for item in items if footprint(item) == smallest]


def blocks_the_reduction(workload: Workload, k_outer: bool, task_n: int) -> bool:
    """Whether a kernel's K cache blocks change what it computes in which order.

    A batch-matmul task fetches y for all of K at once, so its K blocks matter only
    where each one encloses the task's column blocks (K outside, several blocks);
    elsewhere the blocks of one row tile follow each other with nothing between, and
    splitting K changed the loops alone. For a dynamic K that cost dearly: the split
    left a partial last block, and LLVM spilled the register tile in the loops it
    made of it (NN `m6_n64_k32_t1_ko`, Emerald Rapids, 2 threads: symbolic 2.3x its
    static build at T = 5, 2.0x at T = 17; with one loop over K, 1.11x and 1.07x).
    Such kernels loop over K once, and the space holds one of them, not one per
    tile_k. Dense kernels' K blocks are panels of the weight: always real."""
    return workload.kind != "batch_matmul" or (k_outer and task_n > 1)


def _reduction_blocks(hw: "Hardware", workload: Workload, tile_n: int, k_outer: bool, task_n: int) -> list[int]:
    """tile_k values for these loops: K cache blocks where they change the computation
    (blocks_the_reduction), else K's maximum, one loop over K. A batch-matmul block as long as
    K's maximum is no block: the kernel with K inside its column blocks computes in that order,
    and its symbolic build ran 0.83-1.00 of the blocked one's time (NN at T = 17, 62 and 119, tiles
    of 2-4 rows, 2-4 column blocks per task; their static builds within 3% of each other; 2-core Zen 3)."""
    if not blocks_the_reduction(workload, k_outer, task_n):
        return [workload.k.hi]
    blocks = _k_blocks(hw, workload, tile_n)
    return blocks if workload.kind != "batch_matmul" else [d for d in blocks if d < workload.k.hi]


def orders_the_loops(workload: Workload, tile_k: int, task_n: int) -> bool:
    """Whether k_outer changes the program: only where a task has several K blocks and
    several column blocks. With one of either, both orders compile to the same machine
    code (identical assembly for dense packed, in place, grouped and batch matmul NN and
    NT kernels, e.g. `m6_n16_k768_t1_ki_p` and `m6_n16_k768_t1_ko_p`; LLVM, Zen 3), so the
    space holds one of them: a twin in the space took two of the search's trials and two
    of the finalists' places, and split one program's records between two kernels (17%
    of the dense space, 10-14% of attention's)."""
    return task_n > 1 and tile_k < workload.k.hi


def _weight_layouts(workload: Workload, tile_n: int, task_n: int) -> list[bool]:
    """`packed` values for these column tiles: the workload's weight layout, or both
    for "any"; a weight read in place has no padding, so its tasks must split N exactly,
    as grouped layers' tasks must split each group (no padding between groups)."""
    if workload.kind != "dense":
        return [False]
    allowed = {"any": (True, False), "packed": (True,), "in_place": (False,)}[workload.weight_layout]
    if workload.group_n % (tile_n * task_n) == 0:
        return list(allowed)
    return [] if workload.groups > 1 else [packed for packed in allowed if packed]


def _row_tiles_per_task(hw: "Hardware", workload: Workload, tile_n: int, task_n: int,
                        packed: bool) -> tuple[int, ...]:
    """task_m values. A pre-packed weight's tasks may also split N only (0), each
    running every row tile over its panel: the panel then comes from memory once, to
    one core, and stays in its L2 for the next row tile, where row-and-column tasks
    have each row tile's tasks sweep the whole weight again (a model reads its weights
    from DRAM: a cold 3072x768 layer ran 6-14% faster at M = 17..128). A weight read
    in place has each k row of a task's panel N floats from the next (N = 2304 or 3072
    maps them onto a few cache sets), so a task may copy its panel (all of K) into a
    contiguous local once and run several row tiles from it, as GotoBLAS packs B; only
    where that panel fits in L2, and only for weights that must stay in place (one
    that may be packed ahead of time never pays per call). Such a task may also run
    every row tile (0): the panel is then copied once per call, not once per
    task_m row tiles."""
    if packed:
        return (1, 0)
    if workload.weight_layout != "in_place" or workload.k.hi * tile_n * task_n * 4 > hw.l2_bytes:
        return (1,)
    return (1, 0, 4, 8, 16)


def _batch_tasks(workload: Workload, tile_n: int, task_n: int) -> tuple[bool, ...]:
    """whole_batch values. A batch matmul's tasks may be whole batches (fewer, longer
    tasks, each running its batch's column tasks in turn) or one column task of a
    batch each (more tasks, where batches are few). Each micro-kernel built both ways
    and timed interleaved on a 2-core Zen 1: NN [192,T,T]x[192,T,64], six kernels, whole
    batches 1.28-1.44x as fast at T = 1, 1.16-1.28x at T = 5, 1.05-1.14x at T = 17,
    even from T = 62; NT [192,T,64]x[192,T,64]^T 0.67-0.95x at T = 1 and up to 1.18x
    from T = 17. So the tuner chooses, per shape. Only where N spans more than one
    column task."""
    if workload.kind != "batch_matmul" or workload.n.hi <= tile_n * task_n:
        return (False,)
    return (False, True)


def space(hw: "Hardware", workload: Workload) -> list[MicroKernel]:
    """Every micro-kernel the hardware admits for this workload (sizes from hardware limits)."""
    micro_kernels = []
    for (tile_m, tile_n), task_n, k_outer in itertools.product(_register_tiles(hw), (1, 2, 4, 8), (True, False)):
        if tile_n * task_n > max(workload.n.hi, tile_n):
            continue  # a task wider than N only computes padding
        for tile_k, packed in itertools.product(_reduction_blocks(hw, workload, tile_n, k_outer, task_n),
                                                _weight_layouts(workload, tile_n, task_n)):
            if k_outer and not orders_the_loops(workload, tile_k, task_n):
                continue  # the same code as K inside
            micro_kernels += [MicroKernel(tile_m, tile_n, tile_k, task_n, k_outer, packed, task_m, whole_batch)
                              for task_m in _row_tiles_per_task(hw, workload, tile_n, task_n, packed)
                              for whole_batch in _batch_tasks(workload, tile_n, task_n)]
    return _within_cache(micro_kernels, lambda kernel: kernel.task_panel_bytes, hw.l2_bytes)


def accumulator_share(kernel: MicroKernel, hw: "Hardware") -> float:
    """Share of the vector registers holding the register tile's accumulators."""
    return kernel.tile_m * kernel.tile_n / hw.vector_lanes / hw.vector_registers


def features(kernel: MicroKernel, hw: "Hardware") -> list[float]:
    """What decides a micro-kernel's speed (the cost model's f_MK input): tile shape,
    register use, cache footprints, loop order, the weight's layout (a packed panel
    is contiguous; in place, each k row of it is a separate stride of N floats,
    unless the task copies its panel for task_m row tiles) and how batch-matmul
    tasks split the work."""
    vectors = kernel.tile_n / hw.vector_lanes
    return [kernel.tile_m, kernel.tile_n, kernel.tile_k, kernel.task_n, float(kernel.k_outer),
            vectors, kernel.tile_m * vectors + vectors + 1,               # registers in use
            accumulator_share(kernel, hw),
            kernel.tile_k * kernel.tile_n * 4 / hw.l1d_bytes,              # weight panel vs L1
            kernel.task_panel_bytes / hw.l2_bytes,                          # task's panel vs L2
            float(kernel.tile_n % (2 * hw.vector_lanes) == 0), float(kernel.packed), kernel.task_m,
            float(kernel.whole_batch)]
