"""DivideTaskIndexByReciprocal: a batch matmul's parallel tasks split their index by the symbolic
batch dims once per task, as a multiply where that is exact; kernels so built compute the product
with several heads (the multiply) and with more heads than it is exact for (the division). In the
copies for small sizes, each operand's offset is one linear form in the task index and quotient,
bound once per task, also for operands read in place through attention's layouts."""

import functools

import numpy as np
import pytest
from tvm import tirx
from tvm.tirx import stmt as tir_stmt

from lowered_kernels import (assert_computes_on_attention_layouts, build_seen_after, nodes, parallel_loops,
                             small_reduction_copies)
from tf_dietcode.tuning import templates
from tf_dietcode.tuning.micro_kernel import MicroKernel
from tf_dietcode.tuning.workload import Workload

PASS = "tf_dietcode.DivideTaskIndexByReciprocal"
NN = Workload("batch_matmul", (1, 20), 32, (1, 20), b=(1, 1 << 17), transpose_b=False, ties=("m", "k"))
NT = Workload("batch_matmul", (1, 20), (1, 20), 16, b=(1, 1 << 17), bias=True, ties=("m", "n"))
KERNELS = [(NN, MicroKernel(2, 8, 32, 1, True, whole_batch=True)), (NN, MicroKernel(1, 16, 32, 2, True)),
           (NT, MicroKernel(3, 8, 16, 1, False))]


def _task_divisions(body, task: tirx.Var) -> list:
    """Divisions of the task index by a symbolic divisor in body."""
    return [node for node in nodes(body, (tirx.FloorDiv, tirx.FloorMod)) if not isinstance(node.b, tirx.IntImm)
            and any(v.same_as(task) for v in nodes(node.a, tirx.Var))]


@functools.cache
def _built(workload, kernel):
    """Each kernel compiled once for the tests below: (the executable, its "main" after the pass)."""
    return build_seen_after(PASS, workload, kernel)


@pytest.mark.parametrize("workload, kernel", KERNELS, ids=lambda value: getattr(value, "name", None))
def test_each_task_divides_once(workload, kernel):
    _, main = _built(workload, kernel)
    parallel = parallel_loops(main.body)
    assert parallel
    for loop in parallel:
        quotients = [s for s in nodes(loop.body, tir_stmt.Bind) if s.var.name.startswith("task_quotient")]
        assert quotients, "the task's index is not split once"
        # the divisions left are the per-task quotients' fallbacks (past exactness), one per quotient
        fallbacks = [node for binding in quotients for node in _task_divisions(binding.value, loop.loop_var)]
        assert len(fallbacks) == len(quotients)
        assert all(any(node.same_as(f) for f in fallbacks) for node in _task_divisions(loop.body, loop.loop_var))


@pytest.mark.parametrize("workload, kernel", KERNELS, ids=lambda value: getattr(value, "name", None))
@pytest.mark.parametrize("batches, heads, t", [(2, 3, 1), (3, 5, 9), (1, 1 << 16, 1), (2, 1 << 16, 2)],
                         ids=["heads3_t1", "heads5_t9", "past_exact_t1", "past_exact_t2"])
def test_kernels_compute_the_product_with_heads(workload, kernel, batches, heads, t):
    """[batches, heads] batch dims; 2^16 heads put batches * heads^2 past 2^31, where each task divides."""
    executable, _ = _built(workload, kernel)
    dims = workload.dims_at((t,))
    rng = np.random.default_rng(t)
    shapes = {"x": (dims["m"], dims["k"]), "y": (dims["n"], dims["k"]) if workload.transpose_b
              else (dims["k"], dims["n"]), "addend": (dims["m"], dims["n"])}
    operands = {name: rng.uniform(-1, 1, (batches, heads, *shape)).astype(np.float32) for name, shape in shapes.items()
                if name != "addend" or workload.bias}
    operands["alpha"] = 0.75
    template = templates.for_workload(workload)
    arguments = template.kernel_arguments(operands, workload, kernel)
    executable["main"](*arguments)
    np.testing.assert_allclose(arguments[-1].numpy(), template.reference_output(operands, workload),
                               rtol=1e-5, atol=1e-5)


def _reads_a_quotient(node) -> bool:
    return any(v.name.startswith("task_quotient") for v in nodes(node, tirx.Var))


def test_small_copies_bind_each_operands_offset_once_per_task():
    """The whole-batch NN kernel: in each copy for a small K, the task quotient is multiplied only in
    the offsets bound at the top of the task, once in each (x's, y's and out's, and the head
    index's); the loop over the other sizes keeps its offsets as written (LLVM's strength
    reduction chooses differently there)."""
    _, main = _built(*KERNELS[0])
    copies = small_reduction_copies(main.body)
    assert copies
    for copy in copies.values():
        (loop,) = parallel_loops(copy)
        offsets = [s for s in nodes(loop.body, tir_stmt.Bind) if s.var.name.startswith("task_offset")]
        assert {v.name for o in offsets for v in nodes(o.value, tirx.Var)} >= {"x_stride1", "y_stride1", "out_stride1"}
        products = [m for m in nodes(loop.body, tirx.Mul) if _reads_a_quotient(m)]
        in_offsets = [[m for m in nodes(o.value, tirx.Mul) if _reads_a_quotient(m)] for o in offsets]
        assert all(len(found) == 1 for found in in_offsets)
        assert len(products) == len(offsets)
    others = [loop for loop in parallel_loops(main.body)
              if not any(loop.same_as(inner) for copy in copies.values() for inner in parallel_loops(copy))]
    assert others and not any(s.var.name.startswith("task_offset") for loop in others
                              for s in nodes(loop.body, tir_stmt.Bind))


@pytest.mark.parametrize("workload, kernel", KERNELS[:2], ids=lambda value: getattr(value, "name", None))
@pytest.mark.parametrize("heads", [3, 1 << 16], ids=["heads3", "past_exact"])
@pytest.mark.parametrize("t", [1, 2, 3, 7])
def test_kernels_read_and_write_attention_layouts_in_place(workload, kernel, heads, t):
    """x, y and out as [B, H, T, *] views of [batch, time, heads, depth] arrays: batch strides that are
    not the compact ones, so each offset's stride for the quotient (s0 - H * s1) is not zero."""
    assert_computes_on_attention_layouts(_built(workload, kernel)[0], workload, t, heads)
