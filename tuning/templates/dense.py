"""Dense micro-kernels: out[M, N] = act(x[M, K] @ w[N, K]^T + bias), M symbolic.

Layers side by side in w (a workload's `groups`, horizontal fusion) write
out[groups, M, N / groups] instead, each layer's output one contiguous block
(so TF splits it into the layers' outputs without a copy); their tasks split
each group's columns exactly and run one product over all of them.

A constant weight may be pre-packed into blocks `wp[NB, K, tile_n]` (zero
padded to whole parallel tasks), so a task's panel is contiguous; or it is read
in place as stored, w[K, N] (a trainable variable, which nothing may repack),
its tasks then splitting N exactly. A parallel task computes task_m row tiles
of tile_m rows (task_m = 0: every row tile, the tasks splitting N only) by
task_n blocks of tile_n columns; with a weight read in place
and task_m != 1 it first copies its panel into a contiguous local one that its
row tiles share (GotoBLAS' packing of B, per call). Local padding: rows are
padded to whole row tasks, and a padded row reads x's last row in place (a
clamped index, no copy and no check: K is static, so the padding never reaches
a valid output); each row tile accumulates a local tile_m x (task_n * tile_n)
tile with no checks and writes back the valid part with bias and activation
fused (the only bound check). Fetching x's rows into a local tile instead cost
a copy of tile_m x K per row tile and column task: 1.24-1.30x the static
build's time where M divides into whole tiles (m4_n24_k768_t1, M = 128).
"""


import numpy as np
import tvm
from tvm import s_tir, te, tirx

from tf_dietcode.tuning.micro_kernel import MicroKernel
from tf_dietcode.tuning.templates import accumulate_locally, activation, dim, vectorize_in_whole_vectors
from tf_dietcode.tuning.tir_passes import markers
from tf_dietcode.tuning.workload import Workload

COMPUTE_BLOCK = "acc"
WEIGHT_VIEW = "w_blocks"  # the weight as [K, blocks, tile_n], inlined into the compute block


def weight_blocks(workload: Workload, kernel: MicroKernel) -> int:
    """tile_n-column blocks, rounded up to whole parallel tasks (packed: padded with zeros)."""
    tasks = -(-workload.n.hi // (kernel.tile_n * kernel.task_n))
    return tasks * kernel.task_n


def weight_layout(workload: Workload, kernel: MicroKernel) -> dict:
    """The weight operand's layout, as bundles record it for the op and optimize()."""
    if not kernel.packed:
        return {"packed": False}
    return {"packed": True, "tile_n": kernel.tile_n, "blocks": weight_blocks(workload, kernel)}


def pack_weight(weight: np.ndarray, tile_n: int, blocks: int) -> np.ndarray:
    """w[N, K] -> wp[blocks, K, tile_n], zero padded past N: the layout of the
    kernels and of DietcodeFusedMatMul's b with packed_n = N."""
    n, k = weight.shape
    padded = np.zeros((blocks * tile_n, k), dtype=np.float32)
    padded[:n] = weight
    return np.ascontiguousarray(padded.reshape(blocks, tile_n, k).transpose(0, 2, 1))


def weight_operand(weight: np.ndarray, layout: dict) -> tuple[np.ndarray, int]:
    """w[N, K] as the op's b in a bundle's weight layout, and the op's packed_n
    (N when packed; 0 when read in place as [K, N])."""
    if not layout["packed"]:
        return np.ascontiguousarray(weight.T), 0
    return pack_weight(weight, layout["tile_n"], layout["blocks"]), weight.shape[0]


def prim_func(workload: Workload, kernel: MicroKernel, dims: dict[str, int] | None = None) -> tirx.PrimFunc:
    """The computation with M symbolic (dims=None) or fixed; params x, wp (or w), [bias], out."""
    n, k, tile_n, blocks = workload.n.hi, workload.k.hi, kernel.tile_n, weight_blocks(workload, kernel)
    rows = dim(workload, "m", dims)
    x = te.placeholder((rows, k), "float32", name="x")
    per_task = task_rows(kernel)
    padded_rows = (rows + per_task - 1) // per_task * per_task
    if kernel.packed:
        w = te.placeholder((blocks, k, tile_n), "float32", name="wp")
        weight = te.compute((k, blocks, tile_n), lambda r, jo, ji: w[jo, r, ji], name=WEIGHT_VIEW)
    else:
        w = te.placeholder((k, n), "float32", name="w")
        weight = te.compute((k, blocks, tile_n), lambda r, jo, ji: w[r, jo * tile_n + ji], name=WEIGHT_VIEW)
    r = te.reduce_axis((0, k), "k")
    # Rows past M read row M - 1 in place: finite (K is static, never padded) and never written back.
    acc = te.compute((padded_rows, blocks, tile_n),
                     lambda i, jo, ji: te.sum(x[te.min(i, rows - 1), r] * weight[r, jo, ji], axis=r),
                     name=COMPUTE_BLOCK)
    params = [x, w]
    if workload.bias:
        bias = te.placeholder((n,), "float32", name="bias")
        params.append(bias)

    def epilogue(group, i, j):  # column j of the group's; a group's columns fill whole blocks
        value = acc[i, group * (workload.group_n // tile_n) + j // tile_n, j % tile_n]
        column = group * workload.group_n + j
        return activation.apply(workload.activation, value + bias[column] if workload.bias else value)

    if workload.groups == 1:
        out = te.compute((rows, n), lambda i, j: epilogue(0, i, j), name="out")
    else:
        out = te.compute((workload.groups, rows, workload.group_n), epilogue, name="out")
    return te.create_prim_func([*params, out])


def schedule(workload: Workload, kernel: MicroKernel, dims: dict[str, int] | None = None) -> tvm.IRModule:
    """The micro-kernel's schedule applied to prim_func(workload, kernel, dims)."""
    sch = s_tir.Schedule(tvm.IRModule({"main": prim_func(workload, kernel, dims)}))
    block = sch.get_sblock(COMPUTE_BLOCK)
    sch.compute_inline(sch.get_sblock(WEIGHT_VIEW))
    i, jo, ji, k = sch.get_loops(block)
    j_outer, j_inner = sch.split(jo, [None, kernel.task_n])
    if kernel.task_m:
        i_task, i_outer, i_inner = sch.split(i, [None, kernel.task_m, kernel.tile_m])
        tasks = [i_task, j_outer]
    else:  # columns only (fusing j_outer before a symbolic row loop trips TVM's int32 folding)
        i_outer, i_inner = sch.split(i, [None, kernel.tile_m])
        tasks = [j_outer]
    k_outer, k_inner = sch.split(k, [None, kernel.tile_k])
    middle = [k_outer, j_inner] if kernel.k_outer else [j_inner, k_outer]
    sch.reorder(*tasks, i_outer, *middle, k_inner, i_inner, ji)
    task = sch.fuse(*tasks) if len(tasks) > 1 else tasks[0]
    sch.parallel(task)

    if not kernel.packed and kernel.task_m != 1:
        copy_panel(sch, block, task, kernel.tile_n)
    if prefetches_next_panel(workload, kernel):
        depth = workload.k.hi
        rows = dim(workload, "m", dims)
        markers.annotate(sch, i_outer, k_outer, k_inner, depth, kernel.tile_k, kernel.tile_n,
                         weight_blocks(workload, kernel) * depth * kernel.tile_n, "wp",
                         rows.name if isinstance(rows, tirx.Var) else int(rows),
                         0 if workload.cold_weight else WARM_PREFETCH_MIN_ROW_TILES * kernel.tile_m)
    accumulate_locally(sch, block, i_outer, sch.get_sblock("out"), ji, i_inner, middle[0], kernel.task_n == 1)
    return sch.mod


# A weight in the caches is prefetched only where M fills this many row tiles or more.
WARM_PREFETCH_MIN_ROW_TILES = 2


def prefetches_next_panel(workload: Workload, kernel: MicroKernel) -> bool:
    """Whether the kernel prefetches its next task's panel during its compute
    (tuning/tir_passes/prefetch_panel.py): where each task computes one packed panel (task_n = 1, task_m = 0), the next panel in memory
    being the one its thread computes next. Not a tuning choice, so every such kernel has it:
    - From DRAM (`cold_weight`), always: BERT-base optimized from one tuning database, so with
      the same kernels, ran 1.07x as fast with it at batch 1 over T = 1..128 (1.16-1.19x at
      T = 17-24), where as a choice the quick budget found too few prefetching kernels to show a gain.
    - From the last-level cache, from two whole row tiles per task (WARM_PREFETCH_MIN_ROW_TILES):
      BERT's [T, 768] x [2304, 768]^T with the weight warm, the same kernels with and without it,
      interleaved (Emerald Rapids, 2 threads): 1.04-1.25x at M = 12-128 for 6 x 48 tiles, 1.06-1.11x
      at M = 17-128 for 8 x 48, and at M = 16..2048 (batch 16) 0.98-1.08x; with one whole row tile
      (M = 1-11 for 6-row tiles) it lost 2-13%, the panel's stream then being all the task does.
    Only where K blocks split into whole blocks of markers.EVERY steps: a partial block
    would put a bound check in the compute loop."""
    return (kernel.packed and kernel.task_n == 1 and kernel.task_m == 0
            and kernel.tile_k % markers.EVERY == 0)


def copy_panel(sch: s_tir.Schedule, block, task, tile_n: int) -> None:
    """The task's columns of an in-place weight, all of K, copied once per task into
    a local [task_n, K, tile_n] panel that its row tiles then read contiguously."""
    weight = [str(region.source) for region in sch.get(block).reads].index("w")
    panel = sch.cache_read(block, weight, "global")
    sch.compute_at(panel, task)
    sch.transform_layout(panel, ("write", 0), lambda r, j: (j // tile_n, r, j % tile_n))
    vectorize_in_whole_vectors(sch, sch.split(sch.get_loops(panel)[-1], [None, tile_n])[1])


def random_operands(workload: Workload, dims: dict[str, int], rng: np.random.Generator) -> dict[str, np.ndarray]:
    operands = {"x": rng.uniform(-1, 1, (dims["m"], workload.k.hi)).astype(np.float32),
                "w": rng.uniform(-1, 1, (workload.n.hi, workload.k.hi)).astype(np.float32)}
    if workload.bias:
        operands["bias"] = rng.uniform(-1, 1, (workload.n.hi,)).astype(np.float32)
    return operands


def kernel_arguments(operands: dict[str, np.ndarray], workload: Workload, kernel: MicroKernel, device=None):
    """x, the weight in the kernel's layout, [bias] and a zeroed output, as device tensors."""
    arrays = [operands["x"], weight_operand(operands["w"], weight_layout(workload, kernel))[0]]
    if workload.bias:
        arrays.append(operands["bias"])
    arrays.append(np.zeros(output_shape(workload, operands["x"].shape[0]), np.float32))
    return [tvm.runtime.tensor(a, device or tvm.cpu()) for a in arrays]


def reference_output(operands: dict[str, np.ndarray], workload: Workload) -> np.ndarray:
    """The layer in float64 numpy, activations as TF defines them."""
    from scipy.special import erf

    out = operands["x"].astype(np.float64) @ operands["w"].astype(np.float64).T
    if workload.bias:
        out += operands["bias"]
    out = {
        "none": lambda v: v,
        "relu": lambda v: np.maximum(v, 0),
        "tanh": np.tanh,
        "sigmoid": lambda v: 1 / (1 + np.exp(-v)),
        "gelu": lambda v: 0.5 * v * (1 + erf(v / np.sqrt(2))),
        "gelu_tanh": lambda v: 0.5 * v * (1 + np.tanh(np.sqrt(2 / np.pi) * (v + 0.044715 * v ** 3))),
        "silu": lambda v: v / (1 + np.exp(-v)),
    }[workload.activation](out)
    rows = out.shape[0]
    return out.reshape(rows, workload.groups, workload.group_n).transpose(1, 0, 2).reshape(output_shape(workload, rows))


def output_shape(workload: Workload, rows: int) -> tuple[int, ...]:
    """[M, N], or group-major [groups, M, N / groups]."""
    return (rows, workload.n.hi) if workload.groups == 1 else (workload.groups, rows, workload.group_n)


def task_rows(kernel: MicroKernel) -> int:
    """Rows of one row task (task_m row tiles; one tile when tasks split columns only): what rows are padded to."""
    return kernel.tile_m * max(kernel.task_m, 1)


def task_count(workload: Workload, kernel: MicroKernel, dims: dict) -> int:
    """Parallel tasks of one call: row tasks (task_m row tiles each; one when tasks split
    columns only) times column tasks (dims: ints or arrays)."""
    row_tasks = -(-dims["m"] // task_rows(kernel)) if kernel.task_m else 1
    return row_tasks * (weight_blocks(workload, kernel) // kernel.task_n)


def computed_elements(workload: Workload, kernel: MicroKernel, dims: dict) -> int:
    """Output elements computed including padding (rows to whole row tasks, columns to the packed blocks)."""
    rows = task_rows(kernel)
    return -(-dims["m"] // rows) * rows * weight_blocks(workload, kernel) * kernel.tile_n
