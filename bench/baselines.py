"""Baselines the DietCode search is compared with.

largest_shape (Nimble-like): tune for the largest shape of the range only and
let its best micro-kernel serve every shape (compiled with symbolic dims, so it
runs anywhere in the range).

per_shape_metaschedule (Ansor-like): TVM's MetaSchedule tunes one static shape
at a time from the plain computation (operands as the TF op gets them, no
pre-packing), so each shape costs a full tuning run.
"""

import importlib
import importlib.util
import platform
import sys
import time

import numpy as np
import tvm
from tvm import te, tirx
from sklearn.tree import DecisionTreeClassifier

from tf_dietcode.tuning.database import Database
from tf_dietcode.tuning.dispatch import Dispatch
from tf_dietcode.tuning.hardware import Hardware
from tf_dietcode.tuning.search import SearchOptions, SearchResult, search
from tf_dietcode.tuning.workload import Workload


def largest_shape(workload: Workload, hw: Hardware, runner, options: SearchOptions = SearchOptions(),
                  database: Database | None = None, progress: bool = True) -> tuple[SearchResult, Dispatch]:
    """The search at the range's largest shape, and a dispatch that always picks its winner."""
    largest = tuple(size.hi for _, size in workload.variables())
    result = search(workload, hw, runner, options, database, progress, shapes=[largest])
    timed = [r for r in result.measurements if r.seconds and r.shape == largest]
    if not timed:
        raise RuntimeError(f"no micro-kernel of {workload.key()} ran at its largest shape")
    fastest = min(timed, key=lambda r: r.seconds)
    tree = DecisionTreeClassifier().fit(np.zeros((1, max(len(workload.dynamic_dims), 1))), [0])
    gflops = workload.flops(workload.dims_at(largest)) / fastest.seconds / 1e9
    return result, Dispatch(workload, [fastest.kernel], tree, {largest: gflops})


def plain_output_shape(workload: Workload, dims: dict[str, int]) -> tuple[int, ...]:
    """The output shape of plain_prim_func: [M, N] for dense, [b, 1, M, N] for batch matmul."""
    if workload.kind == "dense":
        return dims["m"], dims["n"]
    return dims["b"], 1, dims["m"], dims["n"]


def plain_prim_func(workload: Workload, dims: dict[str, int]):
    """The workload at fixed dims as TE, parameters as the template's operands (x, w|y, [bias|addend],
    [alpha]); no layout choice made."""
    from tf_dietcode.tuning.templates import activation

    b, m, n, k = (dims[d] for d in ("b", "m", "n", "k"))
    r = te.reduce_axis((0, k), "k")
    shape = plain_output_shape(workload, dims)
    if workload.kind == "dense":
        x = te.placeholder((m, k), "float32", name="x")
        w = te.placeholder((n, k), "float32", name="w")
        params = [x, w]
        product = te.compute(shape, lambda i, j: te.sum(x[i, r] * w[j, r], axis=r), name="product")
        if workload.bias:
            bias = te.placeholder((n,), "float32", name="bias")
            params.append(bias)
        out = te.compute(product.shape, lambda i, j: activation.apply(
            workload.activation, product[i, j] + bias[j] if workload.bias else product[i, j]), name="out")
        return te.create_prim_func([*params, out])
    x = te.placeholder((b, 1, m, k), "float32", name="x")
    y = te.placeholder((b, 1, n, k) if workload.transpose_b else (b, 1, k, n), "float32", name="y")
    product = te.compute(shape, lambda p, h, i, j: te.sum(
        x[p, h, i, r] * (y[p, h, j, r] if workload.transpose_b else y[p, h, r, j]), axis=r))
    alpha = tirx.Var("alpha", "float32")
    params = [x, y]
    if workload.bias:
        addend = te.placeholder(product.shape, "float32", name="addend")
        params.append(addend)
        out = te.compute(product.shape, lambda *i: product[i] * alpha + addend[i], name="out")
    else:
        out = te.compute(product.shape, lambda *i: product[i] * alpha, name="out")
    return te.create_prim_func([*params, alpha, out])


def plain_arguments(operands: dict, workload: Workload, dims: dict[str, int]) -> list:
    """Arguments of plain_prim_func: the template's operands in order (scalars as they are), then
    a zeroed output (its shape derived, not from a float64 reference: that matmul would cost time
    and leave numpy's BLAS threads spinning beside the kernel timed next)."""
    return [value if isinstance(value, float) else tvm.runtime.tensor(value)
            for value in (*operands.values(), np.zeros(plain_output_shape(workload, dims), np.float32))]


# MetaSchedule's default of 30 s per build timed out all 12 candidates of a [992,768]x[2304,768] dense on a
# 2-core Zen 1 (two builds at once, unroll up to 512): a slow build is part of its cost, not a failure.
BUILD_TIMEOUT_SECONDS = 300


class MetaScheduleFailed(RuntimeError):
    """No candidate of a MetaSchedule run built and ran; `seconds` is the time it spent."""

    def __init__(self, message: str, seconds: float):
        super().__init__(message)
        self.seconds = seconds


# tvm.s_tir.tensor_intrin's module holding the tensor intrinsics of each CPU architecture.
CPU_TENSOR_INTRINSICS = {"x86_64": "x86", "AMD64": "x86", "aarch64": "arm_cpu", "arm64": "arm_cpu",
                         "riscv64": "riscv_cpu"}


def register_cpu_tensor_intrinsics() -> None:
    """Registers this CPU's tensor intrinsics for MetaSchedule, and only those.

    MetaSchedule imports tvm.s_tir.tensor_intrin, in the tuning process and again in
    each builder worker. Its __init__ parses every target's intrinsics from TVMScript
    (CUDA, ROCm, Hexagon, Arm, x86), and each parse calls inspect.stack(), which walks
    every loaded module: 39 s on a 2-core Zen 1, 28 s of it CUDA's. A CPU tune uses only
    its own architecture's intrinsics, so the package is registered without running
    its __init__, and then that one module is imported (about 1 s)."""
    package = "tvm.s_tir.tensor_intrin"
    if package not in sys.modules:
        module = importlib.util.module_from_spec(importlib.util.find_spec(package))
        sys.modules[package] = module
        setattr(importlib.import_module("tvm.s_tir"), "tensor_intrin", module)
    architecture = CPU_TENSOR_INTRINSICS.get(platform.machine())
    if architecture:
        importlib.import_module(f"{package}.{architecture}")


def per_shape_metaschedule(workload: Workload, hw: Hardware, dims: dict[str, int], trials: int,
                           work_dir: str, seed: int = 0):
    """MetaSchedule's best kernel for these static dims, and the tuning wall time in seconds."""
    from tvm.s_tir import meta_schedule as ms

    register_cpu_tensor_intrinsics()
    mod = tvm.IRModule({"main": plain_prim_func(workload, dims)})
    target = hw.target()
    started = time.perf_counter()
    builder = ms.builder.LocalBuilder(timeout_sec=BUILD_TIMEOUT_SECONDS, initializer=register_cpu_tensor_intrinsics)
    database = ms.tune_tir(mod, target, work_dir, max_trials_global=trials, num_trials_per_iter=min(trials, 16),
                           builder=builder,
                           num_tuning_cores=hw.cores, seed=seed)
    schedule = ms.tir_integration.compile_tir(database, mod, target)
    seconds = time.perf_counter() - started
    if schedule is None:
        raise MetaScheduleFailed(f"MetaSchedule built and ran none of its {trials} candidates for {dims} "
                                 f"in {seconds:.0f} s", seconds)
    return tvm.compile(schedule.mod, target=target), seconds
