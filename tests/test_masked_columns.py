"""MaskPartialColumns: where N is symbolic, a tile's partial columns are written back with
masked vector stores (every index into the accumulator constant), and the kernels so built
compute the product at every T; what it cannot mask it leaves as it was."""

import pytest
import tvm
import tvm_ffi
from tvm import tirx
from tvm.tirx import stmt as tir_stmt

from lowered_kernels import assert_computes_the_product, build_seen_after
from tf_dietcode.tuning import hardware
from tf_dietcode.tuning.guarded_loops import whole_vectors_up_to_a_bound
from tf_dietcode.tuning.micro_kernel import MicroKernel
from tf_dietcode.tuning.workload import Workload

NT = Workload("batch_matmul", (1, 40), (1, 40), 64, b=3, ties=("m", "n"))
NT_MASKED = Workload("batch_matmul", (1, 40), (1, 40), 16, b=(2, 3), bias=True, ties=("m", "n"))
LANES = hardware.detect().vector_lanes
_MASKED_STORE = tvm.ir.Op.get("tirx.masked_store")


def _masked_stores_and_partial_loops(body) -> tuple[list, list]:
    calls, loops = [], []
    tvm_ffi.structural_walk(body, ((tvm.ir.Call, tir_stmt.For), lambda node: (
        loops if isinstance(node, tir_stmt.For) else calls).append(node)))
    partial = [loop for loop in loops if whole_vectors_up_to_a_bound(loop.extent, LANES)
               and isinstance(loop.body, (tir_stmt.BufferStore, tir_stmt.SeqStmt))
               and any(isinstance(s, tir_stmt.BufferStore) and s.buffer.name.startswith("out")
                       for s in (loop.body.seq if isinstance(loop.body, tir_stmt.SeqStmt) else [loop.body]))]
    return [call for call in calls if call.op.same_as(_MASKED_STORE)], partial


@pytest.mark.parametrize("kernel", [MicroKernel(4, 2 * LANES, 64, 1, False, whole_batch=True),
                                    MicroKernel(3, LANES, 64, 2, True)], ids=lambda kernel: kernel.name)
def test_partial_columns_are_written_back_with_masked_stores(kernel):
    executable, main = build_seen_after("tf_dietcode.MaskPartialColumns", NT, kernel)
    masked, partial = _masked_stores_and_partial_loops(main.body)
    assert masked, "no write-back was masked"
    assert not partial, "a write-back still loops over a partial tile's columns"
    assert_computes_the_product(executable, NT, kernel, range(1, 41))


def test_a_strided_addend_is_left_element_by_element():
    """Batch matmul's addend has a symbolic column stride (a broadcast mask's may be 0): a masked
    load reads consecutive elements, so its write-back keeps the loop over the columns."""
    kernel = MicroKernel(2, LANES, 16, 1, False, whole_batch=True)
    executable, main = build_seen_after("tf_dietcode.MaskPartialColumns", NT_MASKED, kernel)
    masked, partial = _masked_stores_and_partial_loops(main.body)
    assert partial and not masked
    assert_computes_the_product(executable, NT_MASKED, kernel, range(1, 41))


def test_static_builds_have_nothing_to_mask():
    kernel = MicroKernel(4, 2 * LANES, 64, 1, False, whole_batch=True)
    _, main = build_seen_after("tf_dietcode.MaskPartialColumns", NT, kernel, NT.dims_at((37,)))
    assert _masked_stores_and_partial_loops(main.body) == ([], [])


def test_only_whole_vectors_up_to_a_symbolic_bound_are_masked():
    n = tirx.Var("n", "int64")
    assert whole_vectors_up_to_a_bound(tirx.Min(tirx.const(2 * LANES, "int64"), n), LANES)[0] == 2 * LANES
    assert whole_vectors_up_to_a_bound(tirx.Max(tirx.Min(n, tirx.const(LANES, "int64")), tirx.const(0, "int64")),
                                       LANES)[0] == LANES
    assert whole_vectors_up_to_a_bound(tirx.Min(tirx.const(LANES + 1, "int64"), n), LANES) is None
    assert whole_vectors_up_to_a_bound(tirx.Min(tirx.const(LANES, "int64"), tirx.const(3, "int64")), LANES) is None
    assert whole_vectors_up_to_a_bound(n, LANES) is None
