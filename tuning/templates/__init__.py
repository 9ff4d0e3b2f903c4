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
# 6: tanh (and GELU's tanh form) became a rational form, erf's keeps NaN explicitly).
TEMPLATES_VERSION = 6

from tvm import s_tir, tirx


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
    return block


def accumulate_locally(sch: s_tir.Schedule, block, loop, write_back, vector_loop, unroll_loop, reduction_loop):
    """Local padding, output side: a local accumulator tile per iteration of `loop`,
    written back by `write_back` (the only output bound check) straight from it;
    then the register tile's vector and unrolled loops, and its zero-init."""
    accumulator = sch.cache_write(block, 0, "local")
    sch.reverse_compute_at(accumulator, loop)
    if write_back is not None:
        sch.reverse_compute_at(write_back, loop)
        sch.compute_inline(accumulator)  # the write-back reads the local tile directly
    sch.vectorize(vector_loop)
    sch.unroll(unroll_loop)
    sch.decompose_reduction(block, reduction_loop)
