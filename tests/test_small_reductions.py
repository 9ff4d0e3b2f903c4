"""VersionSmallReductions: a symbolic kernel with a dynamic reduction gets a copy of its parallel
loop for each size 1..SMALL_REDUCTIONS of K (with the dims tied to K fixed too), each with
constant sizes; the kernels so built compute the product in every copy and past them."""

import numpy as np
import pytest
from tvm import tirx
from tvm.tirx import stmt as tir_stmt

from lowered_kernels import assert_computes_the_product, build_seen_after, small_reduction_copies
from tf_dietcode.tuning import templates
from tf_dietcode.tuning.micro_kernel import MicroKernel
from tf_dietcode.tuning.tir_passes.markers import SMALL_REDUCTIONS
from tf_dietcode.tuning.workload import Workload

PASS = "tf_dietcode.VersionSmallReductions"
NN = Workload("batch_matmul", (1, 20), 32, (1, 20), b=3, transpose_b=False, ties=("m", "k"))
NN_ADDEND = Workload("batch_matmul", (1, 20), 32, (1, 20), b=(1, 3), bias=True, transpose_b=False, ties=("m", "k"))
K_ONLY = Workload("batch_matmul", 7, 24, (3, 20), b=2, transpose_b=False)  # M static, K dynamic alone, K >= 3
NT = Workload("batch_matmul", (1, 20), (1, 20), 32, b=3, ties=("m", "n"))  # a static K


@pytest.mark.parametrize("workload, kernel", [(NN, MicroKernel(5, 16, 20, 1, True, whole_batch=True)),
                                              (NN, MicroKernel(1, 32, 20, 1, True)),
                                              (NN_ADDEND, MicroKernel(2, 16, 8, 2, True))],
                         ids=["m5_b", "m1", "addend_blocked_k"])
def test_tied_dims_get_a_copy_per_small_size(workload, kernel):
    executable, main = build_seen_after(PASS, workload, kernel)
    versions = small_reduction_copies(main.body)
    assert sorted(versions) == [(("K", "M"), size) for size in range(1, SMALL_REDUCTIONS + 1)]
    for copy in versions.values():  # the parallel loop, over the batch's B * H tasks, with constant loops inside
        assert isinstance(copy, tir_stmt.For) and copy.kind == tir_stmt.ForKind.PARALLEL
        assert not {"K", "M"} & {var.name for var in tirx.analysis.undefined_vars(copy, [])}, "not fixed"
    assert_computes_the_product(executable, workload, kernel, range(1, 21))


def test_a_dynamic_reduction_alone_is_versioned_alone_within_its_range():
    kernel = MicroKernel(3, 8, 20, 1, False)
    executable, main = build_seen_after(PASS, K_ONLY, kernel)
    assert sorted(small_reduction_copies(main.body)) == [(("K",), size) for size in range(3, SMALL_REDUCTIONS + 1)]
    assert_computes_the_product(executable, K_ONLY, kernel, [3, 5, 8, 9, 13, 20])


@pytest.mark.parametrize("workload, dims", [(NT, None), (NN, NN.dims_at((5,)))], ids=["static_k", "static_build"])
def test_kernels_without_a_dynamic_reduction_are_left_alone(workload, dims):
    _, main = build_seen_after(PASS, workload, MicroKernel(2, 16, 32, 1, True), dims)
    assert not small_reduction_copies(main.body)


def test_an_empty_reduction_takes_the_symbolic_loop():
    """K = 0 (no copy of its own) writes alpha * 0 (+ addend): the loop the copies fall back to."""
    kernel = MicroKernel(2, 16, 8, 2, True)
    workload = Workload("batch_matmul", (1, 20), 32, (0, 20), b=2, bias=True, transpose_b=False)
    executable, _ = build_seen_after(PASS, workload, kernel)
    template = templates.for_workload(workload)
    operands = template.random_operands(workload, workload.dims_at((3, 0)), np.random.default_rng(0))
    arguments = template.kernel_arguments(operands, workload, kernel)
    executable["main"](*arguments)
    np.testing.assert_allclose(arguments[-1].numpy(), template.reference_output(operands, workload), atol=1e-6)
