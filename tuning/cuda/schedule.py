"""A GPU micro-kernel as a TVM schedule, dims symbolic or fixed.

The computation (contiguous operands):
    dense:        out[1, M, N] = act(x[1, M, K] @ w[K, N] + bias[N])     (w as Keras stores it)
    batch matmul: out[B, M, N] = alpha * x[B, M, K] @ y[B, K, N] (NN) or y[B, N, K]^T (NT) (+ addend[B, M, N])

Local padding: pad_einsum pads M, N (and a dynamic or non-dividing K) to whole
tiles; the padded operand copies become the shared-memory fetches (the only
reads with bound checks), each thread accumulates its register tile with no
checks, and the epilogue (bias or scale and addend, activation) is the
write-back of that tile, which alone checks M and N.

Pipelined (kernel.stages > 1): TVM's software pipeline gives each shared tile
`stages` buffers and copies the next K steps' tiles with cp.async (predicated
zero-fill where padded) while the threads compute on the current one, so the
global loads' latency is hidden inside each block, not only by other blocks
sharing the SM. build.cuda_source compiles with async copies enabled.
"""

import tvm
from tvm import s_tir, te, tirx

from tf_dietcode.tuning.cuda import space
from tf_dietcode.tuning.cuda.space import GpuKernel
from tf_dietcode.tuning.templates import activation, dim, optional_block
from tf_dietcode.tuning.workload import Workload

VECTOR = 4  # floats per 16-byte copy (cp.async and ld.global move at most 16 bytes)
ACCUMULATE = "acc"
WRITE_BACK = "out"
LOOPS_TO_K_OUTER = 6  # batch, block row, block column, thread row, thread column, K step


def prim_func(workload: Workload, dims: dict[str, int] | None = None) -> tirx.PrimFunc:
    """The fused product; params x, y (w), [bias or addend], [alpha], out."""
    b, m, n, k = (dim(workload, d, dims, "int32") for d in ("b", "m", "n", "k"))
    x = te.placeholder((b, m, k), "float32", name="x")
    r = te.reduce_axis((0, k), "k")
    if workload.kind == "dense":
        y = te.placeholder((k, n), "float32", name="w")
        acc = te.compute((b, m, n), lambda p, i, j: te.sum(x[p, i, r] * y[r, j], axis=r), name=ACCUMULATE)
        bias = te.placeholder((n,), "float32", name="bias") if workload.bias else None
        out = te.compute((b, m, n), lambda p, i, j: activation.apply(
            workload.activation, acc[p, i, j] + bias[j] if bias is not None else acc[p, i, j]), name=WRITE_BACK)
        return te.create_prim_func([x, y, *([bias] if bias is not None else []), out])
    y = te.placeholder((b, n, k) if workload.transpose_b else (b, k, n), "float32", name="y")
    acc = te.compute((b, m, n), lambda p, i, j: te.sum(
        x[p, i, r] * (y[p, j, r] if workload.transpose_b else y[p, r, j]), axis=r), name=ACCUMULATE)
    alpha = tirx.Var("alpha", "float32")
    addend = te.placeholder((b, m, n), "float32", name="addend") if workload.bias else None
    out = te.compute((b, m, n), lambda p, i, j: alpha * acc[p, i, j] + addend[p, i, j] if addend is not None
                     else alpha * acc[p, i, j], name=WRITE_BACK)
    return te.create_prim_func([x, y, *([addend] if addend is not None else []), alpha, out])


def operands(workload: Workload) -> tuple[str, str]:
    """The two operands a kernel stages through shared memory, in the product's order."""
    return "x", "w" if workload.kind == "dense" else "y"


def vector_width(workload: Workload, operand: str, kernel: GpuKernel) -> int:
    """Floats per copy when fetching `operand`'s tile. VECTOR for a pipelined kernel's
    cp.async copies wherever every vector is 16 aligned bytes of one row under one pad
    condition: the operand's innermost dim is static and a multiple of VECTOR (so are
    its row strides and any padding boundary; the base pointer must be 16-byte aligned,
    as TF's and torch's buffers are) and so is the tile's width along it. Else 1:
    - NT's y is transposed into its tile, so a vector of its K would land in four rows;
    - a one-stage kernel's copies pass through registers, and 16-byte ones gained
      nothing there on an H200 (0.99-1.03x geomean per workload, 0.79x at worst),
      where the cp.async ones ran 1.23-1.38x (docs/decisions.md, "CUDA").
    Decided from the workload and kernel alone, never from fixed dims, so a symbolic
    kernel and its static builds fetch alike."""
    if kernel.stages == 1 or (operand == "y" and workload.transpose_b):
        return 1
    inner, width = ("k", kernel.tile_k) if operand == "x" else ("n", kernel.block_n)
    size = getattr(workload, inner)
    return VECTOR if size.static and size.lo % VECTOR == 0 and width % VECTOR == 0 else 1


def _fetch_to_shared(sch: s_tir.Schedule, fetch, k_outer, kernel: GpuKernel, vector: int,
                     k_major: bool = False) -> None:
    """Stage an operand tile in shared memory once per K step, every thread of the
    block copying a strided share (consecutive threads read consecutive addresses),
    `vector` floats at a time (vector_width): a kernel with a few warps per SM is bound
    by its instruction stream, and 16-byte copies issue a quarter of the fetch's.
    `k_major`: an operand stored [.., column, K]
    (NT's y) is laid out [K, column] in the tile, so that the threads of a warp, which
    run along columns, read consecutive words (stored as it comes, a tile_k-word
    stride put up to 16 of them in one bank: NT ran at 0.6x cuBLAS from T = 81 on an
    H200); its rows are padded to K_MAJOR_PADDING words past a multiple of the banks, so
    that the transposing stores spread over the banks too, and stay 16-byte aligned for
    vector loads."""
    sch.set_scope(fetch, 0, "shared")  # first: compute_at then sizes the tile for the whole block
    sch.compute_at(fetch, k_outer)
    if k_major:
        sch.transform_layout(fetch, ("write", 0), lambda p, j, r: (p, r, j))
        sch.storage_align(fetch, 0, axis=1, factor=space.SHARED_BANKS, offset=space.K_MAJOR_PADDING)
    threads_x, threads_y = kernel.threads
    axes = sch.get_loops(fetch)[LOOPS_TO_K_OUTER:]
    _, ty, tx, lanes = sch.split(sch.fuse(*axes), [None, threads_y, threads_x, vector])
    sch.bind(ty, "threadIdx.y")
    sch.bind(tx, "threadIdx.x")
    sch.vectorize(lanes)


def schedule(workload: Workload, kernel: GpuKernel, dims: dict[str, int] | None = None) -> tvm.IRModule:
    sch = s_tir.Schedule(tvm.IRModule({"main": prim_func(workload, dims).with_attr("global_symbol", "main")}))
    acc = sch.get_sblock(ACCUMULATE)
    sch.pad_einsum(acc, [1, kernel.block_m, kernel.block_n, kernel.tile_k])
    padded_out = optional_block(sch, f"{ACCUMULATE}_pad")
    if padded_out is not None:
        sch.compute_inline(padded_out)  # the write-back reads the padded tile
    threads_x, threads_y = kernel.threads
    p, i, j, r = sch.get_loops(acc)
    i_block, i_thread, i_tile = sch.split(i, [None, threads_y, kernel.thread_m])
    j_block, j_thread, j_tile = sch.split(j, [None, threads_x, kernel.thread_n])
    k_outer, k_inner = sch.split(r, [None, kernel.tile_k])
    sch.reorder(p, i_block, j_block, i_thread, j_thread, k_outer, k_inner, i_tile, j_tile)
    for loop, axis in ((p, "blockIdx.z"), (i_block, "blockIdx.y"), (j_block, "blockIdx.x"),
                       (i_thread, "threadIdx.y"), (j_thread, "threadIdx.x")):
        sch.bind(loop, axis)
    # a thread's accumulators stay in registers; the write-back with the epilogue follows its K loop
    sch.reverse_compute_at(sch.get_sblock(WRITE_BACK), j_thread)
    sch.set_scope(acc, 0, "local")
    for index, name in enumerate(operands(workload)):
        fetch = optional_block(sch, f"{name}_pad")
        if fetch is None:  # nothing padded: a plain copy
            fetch = sch.cache_read(acc, index, "shared")
        _fetch_to_shared(sch, fetch, k_outer, kernel, vector_width(workload, name, kernel),
                         k_major=name == "y" and workload.transpose_b)
    sch.decompose_reduction(acc, k_outer)
    for loop in (k_inner, i_tile, j_tile):
        sch.unroll(loop)
    if kernel.stages > 1:  # k_outer's body: fetch x, fetch y (w), the K step's FMAs
        sch.annotate(k_outer, "software_pipeline_stage", [0, 0, kernel.stages - 1])
        sch.annotate(k_outer, "software_pipeline_order", [0, 1, 2])
        sch.annotate(k_outer, "software_pipeline_async_stages", [0])
    return sch.mod
