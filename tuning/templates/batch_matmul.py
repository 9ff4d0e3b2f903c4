"""Batch-matmul micro-kernels: out[B, H, M, N] = alpha * x[B, H, M, K] @ y[B, H, K, N]
(NN) or y[B, H, N, K]^T (NT), plus an optional broadcast addend; any of the
workload's b (= B * H), M, N, K symbolic.

The batch is factored into two dims, each operand, the addend and the output
carry symbolic strides (the innermost is 1 except for the addend), so one
compiled kernel reads attention's projections in place ([batch, time, heads,
depth] as [B, H, M, K]), writes the context straight into [batch, time,
heads, depth], and broadcasts over batch dims with stride 0: the op passes
each tensor's layout, nothing is transposed or copied.

Both operands arrive at run time, so nothing is pre-packed. A parallel task is
one batch and task_n column blocks (or, whole_batch, one batch and all its
column tasks in turn): each column task fetches its y panel once into a local
tile laid out [K, columns] (NT, transposing while fetching; NN where its
columns are padded, else it reads y's rows in place), then walks the rows in
tile_m steps. It reads x in place, a row past M clamped to row M - 1. K is
blocked only where a block encloses the task's column blocks
(blocks_the_reduction), and never padded: a dynamic K's last block is a
shorter loop (partition_the_reduction). The register tile computes with no checks; only
the fetches (copies that stop at N) and the write-back (scale, addend, bound)
carry them.
"""


import numpy as np
import tvm
from tvm import s_tir, tirx
from tvm.script.ir_builder import IRBuilder
from tvm.tirx.script.builder import ir as T

from tf_dietcode.tuning.micro_kernel import MicroKernel, blocks_the_reduction
from tf_dietcode.tuning.templates import (accumulate_locally, dim, fetch_into_local, optional_block,
                                          read_in_place_clamped, set_predicate)
from tf_dietcode.tuning.tir_passes.markers import versions_attribute
from tf_dietcode.tuning.workload import Workload

COMPUTE_BLOCK = "acc"


def _buffer(name: str, shape: tuple, symbolic_strides: bool, contiguous_last: bool = True) -> tirx.Buffer:
    """A parameter buffer: with symbolic strides (the last one 1 if contiguous_last), or compact."""
    if not symbolic_strides:
        return tirx.decl_buffer(shape, "float32", name)
    strides = [tirx.Var(f"{name}_stride{i}", "int64") for i in range(len(shape))]
    if contiguous_last:
        strides[-1] = tirx.const(1, "int64")
    return tirx.decl_buffer(shape, "float32", name, strides=strides)


def _small_reductions(workload: Workload, symbolic: bool) -> dict:
    """The attribute asking for copies of the kernel's loop at a dynamic K's small sizes, with the dims
    tied to it (small_reductions); none for a static build or a static K."""
    if not symbolic or workload.k.static:
        return {}
    dims, sizes = next((names, size) for names, size in workload.variables() if "k" in names)
    return versions_attribute([name.upper() for name in dims], range(sizes.lo, sizes.hi + 1))


def prim_func(workload: Workload, kernel: MicroKernel, dims: dict[str, int] | None = None) -> tirx.PrimFunc:
    """Params x, y, [addend], alpha, out. dims=None: the dynamic dims and both batch factors
    symbolic, every buffer strided; else all fixed (batch [b, 1]) and compact."""
    m, n, k = (dim(workload, name, dims) for name in ("m", "n", "k"))
    symbolic = dims is None
    if symbolic:
        batches, heads = tirx.Var("B", "int64"), tirx.Var("H", "int64")
    else:
        batches, heads = tirx.const(dims["b"], "int64"), tirx.const(1, "int64")
    product = (batches, heads, m, n)
    with IRBuilder() as builder:
        with T.prim_func(s_tir=True):
            T.func_name("main")
            T.func_attr({"tirx.noalias": True, **_small_reductions(workload, symbolic)})
            x = T.arg("x", _buffer("x", (batches, heads, m, k), symbolic))
            y = T.arg("y", _buffer("y", (batches, heads, n, k) if workload.transpose_b else (batches, heads, k, n),
                                   symbolic))
            addend = T.arg("addend", _buffer("addend", product, symbolic, False)) if workload.bias else None
            alpha = T.arg("alpha", tirx.Var("alpha", "float32"))
            out = T.arg("out", _buffer("out", product, symbolic))
            with T.sblock("root"):
                acc = IRBuilder.name(COMPUTE_BLOCK, T.sblock_alloc_buffer(product, "float32"))
                with T.grid(*product, k) as (p, h, i, j, r):
                    with T.sblock(COMPUTE_BLOCK):
                        index = [T.axis.spatial(extent, v) for extent, v in zip(product, (p, h, i, j))]
                        vr = T.axis.reduce(k, r)
                        x_at = x[index[0], index[1], index[2], vr]
                        y_at = y[(*index[:2], index[3], vr) if workload.transpose_b else (*index[:2], vr, index[3])]
                        T.reads(x_at, y_at)
                        T.writes(acc[index])
                        with T.init():
                            T.buffer_store(acc, tirx.const(0, "float32"), index)
                        T.buffer_store(acc, acc[index] + x_at * y_at, index)
                with T.grid(*product) as loops:
                    with T.sblock("out"):
                        index = [T.axis.spatial(extent, v) for extent, v in zip(product, loops)]
                        T.reads(acc[index], *([addend[index]] if addend is not None else []))
                        T.writes(out[index])
                        value = acc[index] * alpha
                        T.buffer_store(out, value + addend[index] if addend is not None else value, index)
    return builder.get()


def schedule(workload: Workload, kernel: MicroKernel, dims: dict[str, int] | None = None) -> tvm.IRModule:
    sch = s_tir.Schedule(tvm.IRModule({"main": prim_func(workload, kernel, dims)}))
    block = sch.get_sblock(COMPUTE_BLOCK)
    # Columns pad to whole tasks, so no task's loops need a bound. K is not padded (partition_the_reduction).
    sch.pad_einsum(block, [1, 1, kernel.tile_m, kernel.tile_n * kernel.task_n, 1])
    copy_out = optional_block(sch, f"{COMPUTE_BLOCK}_pad")
    if copy_out is not None:
        sch.compute_inline(copy_out)  # the epilogue reads the padded tile directly
    p, h, i, j, k = sch.get_loops(block)
    i_outer, i_inner = sch.split(i, [None, kernel.tile_m])
    j_outer, j_inner = sch.split(j, [None, kernel.tile_n])
    j_task, j_block = sch.split(j_outer, [None, kernel.task_n])
    if blocks_the_reduction(workload, kernel.k_outer, kernel.task_n):
        k_outer, k_inner = sch.split(k, [None, kernel.tile_k])
        middle = [k_outer, j_block, k_inner]
    else:  # one loop over K (blocks_the_reduction says why)
        middle = [j_block, k]
    sch.reorder(p, h, j_task, i_outer, *middle, i_inner, j_inner)
    task = sch.fuse(p, h) if kernel.whole_batch else sch.fuse(p, h, j_task)
    sch.parallel(task)
    columns = j_task if kernel.whole_batch else task

    # the column task's y columns, laid out [K, columns] (NT transposes while fetching). NT fetches them even
    # where nothing is padded: read in place, its y gathers every vector (a static NT build at T = 128 ran
    # 1.45x its symbolic build's time); NN's y rows are vectors as stored
    y_fetch = optional_block(sch, "y_pad")
    if workload.transpose_b:
        if y_fetch is None:
            y_fetch = sch.cache_read(block, 1, "global")
        fetch_into_local(sch, y_fetch, columns, lambda q, g, c, d: (q, g, d, c))
    else:
        fetch_into_local(sch, y_fetch, columns)
    # x is read one element at a time (broadcast), in place, rows past M clamped (K is never padded)
    x_fetch = optional_block(sch, "x_pad")
    if x_fetch is not None:
        read_in_place_clamped(sch, x_fetch, 3)
    accumulate_locally(sch, block, i_outer, sch.get_sblock("out"), j_inner, i_inner, middle[0],
                       kernel.task_n == 1)
    partition_the_reduction(sch, block)
    return sch.mod


def partition_the_reduction(sch: s_tir.Schedule, update) -> None:
    """Mark the update's bound check on K (tile_k not dividing a dynamic K) `likely`, after the
    schedule is done (marked earlier, it hides the block's region from cache_write): LoopPartition
    then splits the whole K blocks off, unchecked, and ShrinkGuardedLoops turns the last block's
    check into the bound of a shorter loop. K is never padded.

    Why not pad K: padding the reduction needs zeros in both operands, so x (read one element at a
    time, in place where only rows are padded) had to be fetched into a zero-padded tile for every
    row tile, and a static build at a K that tile_k divides read it in place: NN's symbolic kernels
    ran 1.04-1.14x their static builds (T = 17-128), and the copy was 14% of their time."""
    innermost = sch.get_loops(update)[-1]
    predicate = sch.get(innermost).body.predicate
    if not (isinstance(predicate, tirx.IntImm) and int(predicate)):
        set_predicate(sch, innermost, tirx.likely(predicate))


def random_operands(workload: Workload, dims: dict[str, int], rng: np.random.Generator) -> dict:
    """x, y, [addend] with the batch as [b, 1] (compact layouts), and alpha: the kernel's parameter order."""
    b, m, n, k = (dims[d] for d in ("b", "m", "n", "k"))
    operands = {"x": rng.uniform(-1, 1, (b, 1, m, k)).astype(np.float32),
                "y": rng.uniform(-1, 1, (b, 1, n, k) if workload.transpose_b else (b, 1, k, n)).astype(np.float32)}
    if workload.bias:
        operands["addend"] = rng.uniform(-1, 1, (b, 1, m, n)).astype(np.float32)
    operands["alpha"] = float(rng.uniform(0.5, 2.0))
    return operands


def kernel_arguments(operands: dict, workload: Workload, kernel: MicroKernel, device=None) -> list:
    """x, y, [addend], alpha and a zeroed output, in the kernel's parameter order."""
    del kernel  # no operand depends on the micro-kernel's layout
    x, y = operands["x"], operands["y"]
    n = y.shape[2] if workload.transpose_b else y.shape[3]
    arrays = [x, y, *([operands["addend"]] if workload.bias else [])]
    tensors = [tvm.runtime.tensor(a, device or tvm.cpu()) for a in arrays]
    out = tvm.runtime.tensor(np.zeros((*x.shape[:3], n), np.float32), device or tvm.cpu())
    return [*tensors, operands["alpha"], out]


def reference_output(operands: dict, workload: Workload) -> np.ndarray:
    y = operands["y"].astype(np.float64)
    product = operands["alpha"] * (operands["x"].astype(np.float64) @ (np.swapaxes(y, 2, 3) if workload.transpose_b
                                                                        else y))
    return product + operands["addend"] if workload.bias else product


def task_count(workload: Workload, kernel: MicroKernel, dims: dict) -> int:
    """Parallel tasks: batches (whole_batch), else batches times column tasks (dims: ints or arrays)."""
    return dims["b"] * (1 if kernel.whole_batch else -(-dims["n"] // (kernel.tile_n * kernel.task_n)))


def computed_elements(workload: Workload, kernel: MicroKernel, dims: dict) -> int:
    """Output elements computed including padding (rows to tile_m, columns to whole tasks)."""
    columns = kernel.tile_n * kernel.task_n
    return dims["b"] * -(-dims["m"] // kernel.tile_m) * kernel.tile_m * -(-dims["n"] // columns) * columns
