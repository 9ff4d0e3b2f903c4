"""Batch-matmul micro-kernels: out[B, M, N] = x[B, M, K] @ y[B, K, N] (NN) or
y[B, N, K]^T (NT); any of B, M, N, K symbolic.

Both operands arrive at run time, so nothing is pre-packed. A parallel task is
one batch and task_n column blocks: it fetches its y panel once into a local,
zero-padded tile laid out [K, columns] (the NT case transposes while fetching),
then walks the rows in tile_m steps, fetching each x row tile into a local
zero-padded tile. The register tile computes with no checks; only the fetches
(zero fill past M, N, K) and the write-back carry bounds.
"""

import math

import numpy as np
import tvm
from tvm import s_tir, te

from tf_dietcode.tuning.micro_kernel import MicroKernel
from tf_dietcode.tuning.templates import accumulate_locally, dim, fetch_into_local, optional_block
from tf_dietcode.tuning.workload import Workload

COMPUTE_BLOCK = "acc"


def prim_func(workload: Workload, kernel: MicroKernel, dims: dict[str, int] | None = None):
    b, m, n, k = (dim(workload, name, dims) for name in ("b", "m", "n", "k"))
    x = te.placeholder((b, m, k), "float32", name="x")
    y = te.placeholder((b, n, k) if workload.transpose_b else (b, k, n), "float32", name="y")
    r = te.reduce_axis((0, k), "k")
    if workload.transpose_b:
        body = lambda p, i, j: te.sum(x[p, i, r] * y[p, j, r], axis=r)  # noqa: E731
    else:
        body = lambda p, i, j: te.sum(x[p, i, r] * y[p, r, j], axis=r)  # noqa: E731
    out = te.compute((b, m, n), body, name=COMPUTE_BLOCK)
    return te.create_prim_func([x, y, out])


def schedule(workload: Workload, kernel: MicroKernel, dims: dict[str, int] | None = None) -> tvm.IRModule:
    sch = s_tir.Schedule(tvm.IRModule({"main": prim_func(workload, kernel, dims)}))
    block = sch.get_sblock(COMPUTE_BLOCK)
    k_padding = 1 if workload.k.static else kernel.tile_k
    # Columns pad to whole tasks, so no task's loops need a bound.
    sch.pad_einsum(block, [1, kernel.tile_m, kernel.tile_n * kernel.task_n, k_padding])
    p, i, j, k = sch.get_loops(block)
    i_outer, i_inner = sch.split(i, [None, kernel.tile_m])
    j_outer, j_inner = sch.split(j, [None, kernel.tile_n])
    j_task, j_block = sch.split(j_outer, [None, kernel.task_n])
    k_outer, k_inner = sch.split(k, [None, kernel.tile_k])
    middle = [k_outer, j_block] if kernel.k_outer else [j_block, k_outer]
    sch.reorder(p, j_task, i_outer, *middle, k_inner, i_inner, j_inner)
    task = sch.fuse(p, j_task)
    sch.parallel(task)

    panel = fetch_into_local(sch, "y_pad", task)    # the task's y columns, laid out [K, columns]
    if panel is not None and workload.transpose_b:
        sch.transform_layout(panel, ("write", 0), lambda q, c, d: (q, d, c))
    fetch_into_local(sch, "x_pad", i_outer)         # tile_m rows of x
    accumulate_locally(sch, block, i_outer, optional_block(sch, f"{COMPUTE_BLOCK}_pad"),
                       j_inner, i_inner, middle[0])
    return sch.mod


def random_operands(workload: Workload, dims: dict[str, int], rng: np.random.Generator) -> dict[str, np.ndarray]:
    b, m, n, k = (dims[d] for d in ("b", "m", "n", "k"))
    return {"x": rng.uniform(-1, 1, (b, m, k)).astype(np.float32),
            "y": rng.uniform(-1, 1, (b, n, k) if workload.transpose_b else (b, k, n)).astype(np.float32)}


def kernel_arguments(operands: dict[str, np.ndarray], workload: Workload, kernel: MicroKernel, device=None):
    del kernel  # no operand depends on the micro-kernel's layout
    x, y = operands["x"], operands["y"]
    n = y.shape[1] if workload.transpose_b else y.shape[2]
    arrays = [x, y, np.zeros((x.shape[0], x.shape[1], n), np.float32)]
    return [tvm.runtime.tensor(a, device or tvm.cpu()) for a in arrays]


def reference_output(operands: dict[str, np.ndarray], workload: Workload) -> np.ndarray:
    y = operands["y"].astype(np.float64)
    return operands["x"].astype(np.float64) @ (np.swapaxes(y, 1, 2) if workload.transpose_b else y)


def task_count(workload: Workload, kernel: MicroKernel, dims: dict[str, int]) -> int:
    """Parallel tasks: batches times column tasks."""
    return dims["b"] * math.ceil(dims["n"] / (kernel.tile_n * kernel.task_n))


def computed_elements(workload: Workload, kernel: MicroKernel, dims: dict[str, int]) -> int:
    """Output elements computed including padding (rows to tile_m, columns to whole tasks)."""
    columns = kernel.tile_n * kernel.task_n
    return dims["b"] * math.ceil(dims["m"] / kernel.tile_m) * kernel.tile_m * math.ceil(dims["n"] / columns) * columns
