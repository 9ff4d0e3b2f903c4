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
# 11: write-backs split at their bounds too).
TEMPLATES_VERSION = 11

import functools

import tvm
from tvm import s_tir, tirx
from tvm.s_tir.stmt import SBlock, SBlockRealize
from tvm.sym import Analyzer
from tvm.sym.analyzer import ProofStrength


def for_workload(workload):
    """The template module of the workload's kind."""
    return importlib.import_module(f"tf_dietcode.tuning.templates.{workload.kind}")


def dim(workload, name: str, dims: dict[str, int] | None):
    """A dim as TIR: a symbolic int64 var if dynamic and not fixed by `dims`, else a constant."""
    size = getattr(workload, name)
    if dims is None and not size.static:
        return tirx.Var(name.upper(), "int64")
    return tirx.const(size.lo if dims is None else dims[name], "int64")


def optional_block(sch: s_tir.Schedule, name: str):
    """The named block, or None where pad_einsum found nothing to pad."""
    try:
        return sch.get_sblock(name)
    except s_tir.ScheduleError:
        return None


def fetch_into_local(sch: s_tir.Schedule, name: str, loop):
    """Local padding, input side: the padded copy `name` becomes a local tile
    fetched (with its zero-fill bound check) once per iteration of `loop`."""
    block = optional_block(sch, name)
    if block is not None:
        sch.compute_at(block, loop)
        sch.set_scope(block, 0, "local")
        split_fetch_at_bounds(sch, block)
    return block


def split_fetch_at_bounds(sch: s_tir.Schedule, fetch) -> None:
    """Mark each term of the fetch's zero-fill check `likely`, so TVM's
    LoopPartition pass splits a fetch loop with a symbolic trip count at the
    bound: a copy with no check, then a zero fill.

    Without it a symbolic kernel checked every element: LLVM turned the int64
    compare into masks (four 64-bit compares and packs per eight floats), and
    where the fetch runs per row tile along a dynamic K (batch matmul NN) the
    symbolic kernel ran 1.3-1.6x slower than the same micro-kernel compiled for
    a static shape; with the split, 0.97-1.22x (T = 17-128). Loops of constant
    trip count against a symbolic bound (batch matmul NT's columns) split too,
    under measure.PASS_CONFIG.
    """
    block = sch.get(fetch)
    store = block.body
    condition, value, zero = store.value.args
    terms, pending = [], [condition]
    while pending:
        term = pending.pop()
        if isinstance(term, tirx.And):
            pending += [term.b, term.a]
        else:
            terms.append(term)
    hinted = tirx.BufferStore(store.buffer, tirx.if_then_else(all_likely(terms), value, zero), store.indices)
    replaced = SBlock(block.iter_vars, block.reads, block.writes, block.name_hint, hinted, block.init,
                      block.alloc_buffers, block.match_buffers, block.annotations)
    sch.state.replace(sch.get_sref(fetch), replaced, {block: replaced})


def all_likely(terms):
    """The conjunction of `terms`, each `likely`: LoopPartition splits a loop at every one."""
    return functools.reduce(tirx.And, map(tirx.likely, terms))


def accumulate_locally(sch: s_tir.Schedule, block, loop, write_back, vector_loop, unroll_loop, reduction_loop,
                       one_register_tile: bool):
    """Local padding, output side: an accumulator tile per iteration of `loop`,
    written back by `write_back` (the only output bound check) straight from it;
    then the register tile's vector and unrolled loops, and its zero-init.

    TVM 0.27 turns every "local" allocation into a TVMBackendAllocWorkspace call
    inside the loops, and keeps only "global" ones of constant size under 1 KiB
    on the stack. An accumulator that is one register tile (one column block
    per task) is therefore "global": on the stack, LLVM holds it in registers
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
    `likely`, so LoopPartition (measure.PASS_CONFIG) splits the loop over the
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
    predicate = all_likely(checks) if checks else tirx.const(True, "bool")
    guarded = SBlockRealize(realize.iter_values, predicate, realize.block)
    loop = tirx.For(innermost.loop_var, innermost.min, innermost.extent, innermost.kind, guarded,
                    innermost.thread_binding, innermost.annotations)
    sch.state.replace(sch.get_sref(loops[-1]), loop, {realize.block: realize.block})
