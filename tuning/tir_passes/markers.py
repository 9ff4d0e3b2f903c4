"""The marks that templates (and passes) leave in a kernel for a later pass, or TVM, to find: a
function attribute, loop annotations, an allocation's annotation and an attribute key. They live
here, not in the passes that read them, so that templates and passes import marks, never a pass;
each pass's module says why it wants its mark."""

from tvm import s_tir, tirx

# VersionSmallReductions (small_reductions): copies of the parallel loop for small sizes of a dynamic reduction
SMALL_REDUCTIONS = 5  # sizes 1..5 of a dynamic reduction get copies of their own (small_reductions: compile time)
VERSIONS = "tf_dietcode.small_reductions"  # function attribute: {"dims": names, "sizes": the sizes to copy}

# PrefetchNextPanel (prefetch_panel): a packed dense kernel's loops
EVERY = 4  # k steps per prefetch of one k row of the next panel
ROWS, BLOCKS, STEPS = (f"tf_dietcode.prefetch_{mark}" for mark in ("rows", "k_blocks", "steps"))

# RegisterTiles (register_tiles) and SplitReductionChains (reduction_chains): an allocation's annotation
ON_THE_STACK = {"disable_lower_builtin": tirx.const(1, "int32")}  # LowerTVMBuiltin leaves the allocation alone

# AllocatePerTask (task_scratch) and MergeParallelLaunches (parallel_launches): an attribute key
LAUNCH_POINT = "pragma_parallel_launch_point"  # codegen_cpu.cc: the parallel tasks start here


def versions_attribute(dims: list[str], dim_range: range) -> dict:
    """The function attribute asking for copies of the kernel's loop with the dims named (a dynamic K
    and the dims tied to it) fixed to each size up to SMALL_REDUCTIONS that lies in `dim_range`."""
    sizes = [size for size in range(1, SMALL_REDUCTIONS + 1) if size in dim_range]
    return {VERSIONS: {"dims": dims, "sizes": sizes}} if sizes else {}


def annotate(sch: s_tir.Schedule, rows, k_blocks, k_steps, k: int, tile_k: int, tile_n: int, weight_floats: int,
             buffer: str, m: int | str, min_m: int) -> None:
    """Mark a packed dense kernel's loops for PrefetchNextPanel: `k_steps` (the compute's k loop
    inside a K block of tile_k) is split into blocks of EVERY steps. Only calls whose M (a
    constant, or the name of the symbolic var) is at least `min_m` prefetch."""
    blocks, _ = sch.split(k_steps, [None, EVERY])
    sch.annotate(rows, ROWS, 1)
    sch.annotate(k_blocks, BLOCKS, 1)
    sch.annotate(blocks, STEPS, {"k": k, "tile_k": tile_k, "tile_n": tile_n, "size": weight_floats,
                                 "buffer": buffer, "m": m, "min_m": min_m})
