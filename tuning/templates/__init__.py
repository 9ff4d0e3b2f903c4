"""Micro-kernel templates, one module per workload kind, with one interface:

    schedule(workload, kernel, dims=None) -> IRModule   (dims=None: dynamic dims symbolic)
    random_operands(workload, dims, rng) -> {name: array}
    kernel_arguments(operands, workload, kernel, device=None) -> tensors on device (CPU), output last
    reference_output(operands, workload) -> float64 array
    task_count(workload, kernel, dims), computed_elements(workload, kernel, dims)
"""

import importlib

# Bumped whenever generated code changes, so the tuning database stops reusing
# measurements of older kernels (2: exact GELU's erf became a rational form;
# 3: batch matmul reads strided [batch, heads, rows, cols] views, scales and adds;
# 4: dense kernels may read their weight in place; 5: relu keeps NaN;
# 6: tanh (and GELU's tanh form) became a rational form, erf's keeps NaN explicitly;
# 7: the write-back checks only rows and columns; 8: dense row tasks of task_m row tiles;
# 9: fetches split at their bounds; 10: vectors of power-of-two width;
# 11: write-backs split at their bounds too; 12: fetches copy inside the bounds, zero only the reduction's padding;
# 13: guarded loops stop at their bounds (guarded_loops), batch matmul's x tile on the stack;
# 14: dense rows past M read x's last row in place instead of a fetched local tile;
# 15: scratch tiles allocated once per parallel task, not per iteration: task_scratch;
# 16: cold dense kernels with one-panel tasks prefetch the next panel: prefetch_panel;
# 17: a tile's padding along a dynamic reduction is zeroed once per task: task_scratch;
# 18: batch matmul NT fetches its y tile where nothing is padded too;
# 19: batch matmul reads x in place, rows past M clamped, unless a dynamic K pads it;
# 20: each loop partition keeps its own accumulator, and guards its enclosing loops imply are dropped;
# 21: batch matmul never pads K: its last K block is shorter, and x is always read in place;
# 22: a fetched tile's padding is zeroed, not left as scratch memory: copy_inside_bounds;
# 23: a transposing fetch (batch matmul NT's y) copies square blocks through registers: transpose_in_registers;
# 24: register tiles of 1 KiB or more stay on the stack too: register_tiles;
# 25: a packed one-panel dense task prefetches its next panel with a warm weight too (two row tiles on);
# 26: batch matmul splits K only where a K block encloses several column blocks (blocks_the_reduction);
# 27: partial columns written back with masked stores, a whole batch's last column task copied in blocks,
# its row loop copied for whole row tiles too;
# 28: write-backs reading a strided addend as vector stores, by versions of its stride (vector_write_backs);
# 29: a symbolic N's last partial column task runs as a whole one ending at N, and whole row tiles read x's rows
# unclamped (overlapping_tiles);
# 30: a dynamic reduction's sizes 1-8 get copies of the kernel's parallel loop (small_reductions);
# 31: a parallel task splits its index by symbolic batch dims once, by a reciprocal's multiply (task_division);
# 32: copies for a dynamic reduction's sizes 1-5 only (compile time);
# 33: the copies left unsimplified (their partial column tiles' write-backs vector stores again), and a
# remainder's row counts copied only where its scope allows them);
# 34: in the copies for small sizes, each operand's per-task offset is one linear form (task_division);
# 35: loops reading 5 or more rows of an operand in place take a pointer per row (row_pointers);
# 36: ... one pointer per distinct address: rows a small size's copy clamps to one row share it;
# 37: ... each row of a whole tile laundered at its distance from the first row;
# 38: no zero fill before a transposing fetch that writes its whole tile (transpose_in_registers);
# 39: K loops with few live accumulator vectors add into partial accumulators (reduction_chains);
# 40: write-backs of 5 or more rows a symbolic stride apart store through the first row's pointer (row_pointers).
# 41: a partial column task's write-back stores whole vectors where all their columns are inside (vector_write_backs).
# 42: a dense task with its weight in place may copy its panel once and run every row tile (task_m = 0).
# 43: the partitions of a parallel loop run in one launch (parallel_launches).
TEMPLATES_VERSION = 43

import functools

import tvm
from tvm import s_tir, tirx
from tvm.s_tir.stmt import SBlockRealize
from tvm.sym import Analyzer
from tvm.sym.analyzer import ProofStrength

from tf_dietcode.tuning.tir_passes.ir import conjunction_terms


def for_workload(workload):
    """The template module of the workload's kind."""
    return _template(workload.kind)


@functools.cache
def _template(kind: str):
    """Looked up once per kind: dispatch's votes ask for it per kernel and shape (a million times)."""
    return importlib.import_module(f"tf_dietcode.tuning.templates.{kind}")


def dim(workload, name: str, dims: dict[str, int] | None, dtype: str = "int64"):
    """A dim as TIR: a symbolic var if dynamic and not fixed by `dims`, else a constant
    (int64 on the CPU; GPU kernels ask for int32, their fast index type)."""
    size = getattr(workload, name)
    if dims is None and not size.static:
        return tirx.Var(name.upper(), dtype)
    return tirx.const(size.lo if dims is None else dims[name], dtype)


def optional_block(sch: s_tir.Schedule, name: str):
    """The named block, or None where pad_einsum found nothing to pad."""
    try:
        return sch.get_sblock(name)
    except s_tir.ScheduleError:
        return None


def fetch_into_local(sch: s_tir.Schedule, fetch, loop, layout=None):
    """Local padding, input side: the copy `fetch` (pad_einsum's padded copy, or
    a plain cache_read where nothing is padded) becomes a tile private to each
    task (a 64-byte-aligned workspace allocation, for tiles read as vectors),
    laid out by the index map `layout` where one is given, fetched once per
    iteration of `loop`; a padded copy goes through copy_inside_bounds. None:
    nothing to fetch (the operand is read in place)."""
    if fetch is None:
        return
    sch.compute_at(fetch, loop)
    sch.set_scope(fetch, 0, "local")
    if layout is not None:
        sch.transform_layout(fetch, ("write", 0), layout)
    if _selects(sch.get(fetch).body.value):
        copy_inside_bounds(sch, fetch, loop)


def read_in_place_clamped(sch: s_tir.Schedule, fetch, reduction_axis: int) -> None:
    """Local padding without a copy, where only spatial axes are padded: the
    padded copy `fetch` ("inside ? load : 0" on rows or columns, never along
    the reduction, axis `reduction_axis`) becomes a load whose checked indices
    are clamped to their last valid value, inlined into its consumer. Padding
    then reads a real row (or column) again: finite values that only reach
    output elements the write-back skips (as in copy_inside_bounds). The clamp
    depends on the row alone, so the loop over K carries no check. A copy that
    pads the reduction (whose elements must be zero) or is of another form is
    a template's error (ValueError).

    Batch matmul NT at T = 119 fetching x's rows instead spent 31% of its time
    in the copy (a tile_m x K copy per row tile and column task) and ran 1.47x
    its static build, which divides M into whole tiles and reads x in place.
    The dense template clamps its rows the same way in its compute definition.
    Not for GPU fetches: there a predicated-off load reads nothing, and
    clamped fetches made dense kernels slower (decisions.md, "CUDA").
    """
    block = sch.get(fetch)
    store = block.body
    if not _selects(store.value):
        raise ValueError(f"{block.name_hint} is not a padded copy: {store.value}")
    condition, load, _ = store.value.args
    axes = [iter_var.var for iter_var in block.iter_vars]
    clamped = list(load.indices)
    for term in conjunction_terms(condition):
        if not isinstance(term, tirx.LT) or not any(term.a.same_as(axis) for axis in axes) \
                or term.a.same_as(axes[reduction_axis]):
            raise ValueError(f"{block.name_hint} pads more than rows or columns: {condition}")
        clamped = [tirx.min(index, term.b - 1) if index.same_as(term.a) else index for index in clamped]
    body = tirx.BufferStore(store.buffer, tirx.BufferLoad(load.source, clamped), store.indices)
    reads, writes = s_tir.analysis.get_sblock_read_write_region(
        s_tir.SBlock(block.iter_vars, [], [], block.name_hint, body),
        {buffer: buffer for buffer in (load.source, store.buffer)})
    rewritten = s_tir.SBlock(block.iter_vars, reads, writes, block.name_hint, body, block.init,
                             block.alloc_buffers, block.match_buffers, block.annotations)
    sch.state.replace(sch.get_sref(fetch), rewritten, {block: rewritten})
    sch.compute_inline(fetch)


def _selects(value) -> bool:
    """Whether a copy's value is pad_einsum's "inside ? load : 0"."""
    return isinstance(value, tvm.ir.expr.Call) and value.op.same_as(tvm.ir.Op.get("prim.if_then_else"))


def copy_inside_bounds(sch: s_tir.Schedule, fetch, loop) -> None:
    """Split the fetch's per-element "inside ? load : 0" (decompose_padding)
    into a copy whose loops stop at the operand's bounds and a zero fill of the
    padding alone (rows past M, columns past N), neither checking an element:
    ShrinkGuardedLoops turns both guards into loop bounds, so the fill is a
    short loop over the last tile's padded columns. The reduction is never
    padded (batch_matmul.partition_the_reduction).

    Why zeros: products with the padding only reach output elements the
    write-back skips, but the tile is scratch memory, and what it held before
    (integers, pointers' upper halves) reads as denormal floats. Outside TF's
    threads, which flush denormals, each FMA on one then takes a microcode
    assist on Intel cores: batch matmul NT at T = 5 took 1.5 ms against
    0.024 ms with denormals flushed (Emerald Rapids), and its tuning measured
    that noise. A check per element in the copy cost a symbolic kernel
    1.3-1.6x its static build's time (LLVM turned the int64 compares into
    masks).
    """
    if not isinstance(sch.get(sch.get_loops(fetch)[-1]).body, SBlockRealize):
        sch.add_unit_loop(fetch)  # a tile of one element gets no loop of its own
    loops = sch.get_loops(fetch)
    depth = [sch.get(outer).same_as(sch.get(loop)) for outer in loops].index(True) + 1  # the fetch's first loop
    zero = sch.decompose_padding(fetch, loops[depth])
    fill_loop = sch.get_loops(zero)[-1]
    source = sch.get(fetch).reads[0].source
    set_predicate(sch, fill_loop, _past_bounds(sch.get(fill_loop).body, source.shape))


def _past_bounds(fill: SBlockRealize, extents) -> tvm.ir.expr.Expr:
    """The fill's predicate: its own (the tile's region), and some index at or past the operand's
    extent along an axis the tile pads (the fill's axes are the operand's, in its order)."""
    analyzer = Analyzer()
    region = [term for term in conjunction_terms(fill.predicate) if not isinstance(term, tirx.IntImm)]
    past = [extent <= value for value, axis, extent in zip(fill.iter_values, fill.block.iter_vars, extents, strict=True)
            if not analyzer.can_prove_equal(axis.dom.extent, extent)]
    if not past:
        return tirx.const(False, "bool")
    return tirx.all(*region, tirx.any(*past))


def set_predicate(sch: s_tir.Schedule, innermost, predicate) -> None:
    """Guard the block directly under the loop `innermost` with `predicate`."""
    loop = sch.get(innermost)
    realize = loop.body
    guarded = SBlockRealize(realize.iter_values, predicate, realize.block)
    replaced = tirx.For(loop.loop_var, loop.min, loop.extent, loop.kind, guarded, loop.thread_binding,
                        loop.annotations)
    sch.state.replace(sch.get_sref(innermost), replaced, {realize.block: realize.block})


def all_likely(terms):
    """The conjunction of `terms`, each `likely`: LoopPartition splits a loop at every one."""
    return functools.reduce(tirx.And, map(tirx.likely, terms))


def accumulate_locally(sch: s_tir.Schedule, block, loop, write_back, vector_loop, unroll_loop, reduction_loop,
                       one_register_tile: bool):
    """Local padding, output side: an accumulator tile per iteration of `loop`,
    written back by `write_back` (the only output bound check) straight from it;
    then the register tile's vector and unrolled loops, and its zero-init.

    TVM 0.27 turns every "local" allocation into a TVMBackendAllocWorkspace call
    inside the loops, and keeps "global" ones of constant size on the stack
    (TVM only under 1 KiB; register_tiles at any register tile's size). An
    accumulator that is one register tile (one column block per task) is
    therefore "global": on the stack, LLVM holds it in registers
    (1-row batch-matmul kernels 8-22% faster). One that spans several column
    blocks is indexed by their loop and stays in memory, where the workspace's
    64-byte alignment beats the stack's 16 (two 32-column blocks ran 25-40%
    slower on the stack), so it stays "local". Each parallel task gets its own.
    """
    accumulator = sch.cache_write(block, 0, "global" if one_register_tile else "local")
    sch.reverse_compute_at(accumulator, loop)
    if write_back is not None:
        sch.reverse_compute_at(write_back, loop)
        sch.compute_inline(accumulator)  # the write-back reads the local tile directly
        check_rows_and_columns_only(sch, write_back)
    vectorize_in_whole_vectors(sch, vector_loop)
    sch.unroll(unroll_loop)
    sch.decompose_reduction(block, reduction_loop)


def vectorize_in_whole_vectors(sch: s_tir.Schedule, loop) -> None:
    """Vectorize a loop of constant extent in power-of-two pieces, unrolling the pieces.

    LLVM legalizes a vector of a power-of-two width into the machine's registers
    cleanly, but a <24 x float> (three AVX2 registers) into shuffles and inserts:
    dense kernels of 24-column register tiles ran 5-7x slower than 16-column ones
    (Zen 1, 768x768). Split at the largest power of two dividing the extent, every
    tile width becomes whole registers.
    """
    extent = int(sch.get(loop).extent)
    width = extent & -extent
    if width < extent:
        pieces, loop = sch.split(loop, [None, width])
        sch.unroll(pieces)
    sch.vectorize(loop)


def check_rows_and_columns_only(sch: s_tir.Schedule, write_back) -> None:
    """Make the write-back's bound check exactly "row < rows and column < columns".

    reverse_compute_at guards the write-back with a term per output dim plus
    terms for empty ranges (`(i - tiles < 0 or row == 0) and row < M`; for batch
    matmul also the batch and head decoded from the fused task index), evaluated
    per element: on one thread that cost a quarter of a K=64 batch-matmul
    kernel's time. Only the tile's rows and columns (the last two dims) can fall
    outside the output, the leading dims being iterated exactly, so only they are
    checked, and only where the loop bounds do not already prove them; each
    `likely`, so LoopPartition (tir_passes.pipeline.PASS_CONFIG) splits the loop over the
    tile's columns into the valid columns, unchecked, and the rest.
    """
    if not isinstance(sch.get(sch.get_loops(write_back)[-1]).body, SBlockRealize):
        sch.add_unit_loop(write_back)  # a static tile of one row and column gets no loop of its own
    loops = sch.get_loops(write_back)
    innermost = sch.get(loops[-1])
    realize = innermost.body
    analyzer = Analyzer()
    for loop in map(sch.get, loops):
        analyzer.bind(loop.loop_var, tvm.ir.Range.from_min_extent(loop.min, loop.extent))
    checks = [value < var.dom.min + var.dom.extent
              for value, var in list(zip(realize.iter_values, realize.block.iter_vars))[-2:]]
    checks = [check for check in checks if not analyzer.can_prove(check, ProofStrength.SYMBOLIC_BOUND)]
    set_predicate(sch, loops[-1], all_likely(checks) if checks else tirx.const(True, "bool"))
