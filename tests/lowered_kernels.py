"""Kernels built the way tuning builds them, with the kernel as one of our TIR passes left it, and
checked against the reference: for the tests of those passes."""

import numpy as np
import tvm
import tvm_ffi

from tf_dietcode.tuning import hardware, templates
from tf_dietcode.tuning.micro_kernel import MicroKernel
from tf_dietcode.tuning.tir_passes import pipeline
from tf_dietcode.tuning.tir_passes.ir import conjunction_terms
from tf_dietcode.tuning.workload import Workload


def nodes(body, kind) -> list:
    """Every node of the given kind(s) in body, in walk order."""
    found = []
    tvm_ffi.structural_walk(body, (kind, found.append))
    return found


def parallel_loops(body) -> list:
    """Every parallel loop in body, in walk order."""
    return [loop for loop in nodes(body, tvm.tirx.stmt.For) if loop.kind == tvm.tirx.stmt.ForKind.PARALLEL]


def small_reduction_copies(body) -> dict:
    """{(the dims a branch fixes, their size): the branch's copy} for each branch fixing dims to one size
    (small_reductions' copies: `if K == 3 and M == 3: ...`)."""
    found = {}
    for branch in nodes(body, tvm.tirx.stmt.IfThenElse):
        terms = conjunction_terms(branch.condition)
        if all(isinstance(t, tvm.tirx.EQ) and isinstance(t.a, tvm.tirx.Var) and isinstance(t.b, tvm.tirx.IntImm)
               for t in terms):
            sizes = {int(t.b) for t in terms}
            if len(sizes) == 1:
                found[tuple(sorted(t.a.name for t in terms)), sizes.pop()] = branch.then_case
    return found


def compile_seen_after(pass_name: str, function: tvm.tirx.PrimFunc, target: tvm.target.Target):
    """(`function` compiled as tuning compiles kernels, the module right after the pass named `pass_name`)."""
    seen = {}

    @tvm.instrument.pass_instrument
    class AfterThePass:
        def run_after_pass(self, mod, info):
            if info.name == pass_name:
                seen["module"] = mod

    with tvm.transform.PassContext(config=pipeline.PASS_CONFIG, instruments=[AfterThePass()]):
        executable = tvm.compile(function, target=target, tir_pipeline=pipeline.register())
    return executable, seen["module"]


def build_seen_after(pass_name: str, workload: Workload, kernel: MicroKernel, dims: dict | None = None):
    """(the compiled kernel, its "main" right after the pass named `pass_name`)."""
    function = templates.for_workload(workload).schedule(workload, kernel, dims)
    executable, module = compile_seen_after(pass_name, function, hardware.detect().target())
    return executable, module["main"]


def assert_computes_the_product(executable, workload: Workload, kernel: MicroKernel, sequence_lengths) -> None:
    """The kernel's output against the float64 reference at each T (one dynamic dim, or dims tied to it)."""
    template = templates.for_workload(workload)
    rng = np.random.default_rng(0)
    for t in sequence_lengths:
        operands = template.random_operands(workload, workload.dims_at((t,)), rng)
        arguments = template.kernel_arguments(operands, workload, kernel)
        executable["main"](*arguments)
        np.testing.assert_allclose(arguments[-1].numpy(), template.reference_output(operands, workload),
                                   rtol=1e-5, atol=1e-5, err_msg=f"T={t}")


def assert_computes_on_attention_layouts(executable, workload: Workload, t: int, heads: int) -> None:
    """x, y and out as [B, H, T, *] views of [batch, time, heads, depth] arrays (2 batches), read and
    written in place: strides that are not the compact ones. Against the float64 product, alpha 0.75."""
    dims = workload.dims_at((t,))
    rng = np.random.default_rng(t)
    x, y = (rng.uniform(-1, 1, (2, rows, heads, columns)).astype(np.float32).transpose(0, 2, 1, 3)
            for rows, columns in ((dims["m"], dims["k"]), (dims["k"], dims["n"])))
    out = np.full((2, dims["m"], heads, dims["n"]), np.nan, np.float32).transpose(0, 2, 1, 3)
    executable["main"](tvm_ffi.from_dlpack(x), tvm_ffi.from_dlpack(y), 0.75, tvm_ffi.from_dlpack(out))
    np.testing.assert_allclose(out, 0.75 * np.matmul(x.astype(np.float64), y.astype(np.float64)),
                               rtol=1e-5, atol=1e-5)
