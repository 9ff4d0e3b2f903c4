"""VectorWriteBacks: where N is symbolic, a tile's partial columns are written back in vector
stores, whole or masked, and write-backs reading a strided addend as vector stores in versions by
its stride (every index into the accumulator constant); the kernels so built compute the product
at every T."""

import pytest
import tvm
import tvm_ffi
from tvm import tirx
from tvm.tirx import stmt as tir_stmt

from lowered_kernels import assert_computes_the_product, build_seen_after, nodes
from tf_dietcode.tuning import hardware, micro_kernel
from tf_dietcode.tuning.micro_kernel import MicroKernel
from tf_dietcode.tuning.tir_passes.ir import statements, whole_vectors_up_to_a_bound
from tf_dietcode.tuning.workload import Workload

NT = Workload("batch_matmul", (1, 40), (1, 40), 64, b=3, ties=("m", "n"))
NT_MASKED = Workload("batch_matmul", (1, 40), (1, 40), 16, b=(2, 3), bias=True, ties=("m", "n"))
LANES = hardware.detect().vector_lanes
_MASKED_STORE = tvm.ir.Op.get("tirx.masked_store")
_MASKED_LOAD = tvm.ir.Op.get("tirx.masked_load")


def _calls(body) -> list:
    return nodes(body, tvm.ir.Call)


def _loads(value) -> list:
    return nodes(value, tvm.ir.TensorLoad)


def _masked_stores_and_partial_loops(body) -> tuple[list, list]:
    partial = [loop for loop in nodes(body, tir_stmt.For) if whole_vectors_up_to_a_bound(loop.extent, LANES)
               and any(isinstance(s, tir_stmt.BufferStore) and s.buffer.name.startswith("out")
                       for s in statements(loop.body))]
    return [call for call in _calls(body) if call.op.same_as(_MASKED_STORE)], partial


@pytest.mark.parametrize("kernel", [MicroKernel(4, 2 * LANES, 64, 1, False, whole_batch=True),
                                    MicroKernel(3, LANES, 64, 2, True)], ids=lambda kernel: kernel.name)
def test_partial_columns_are_written_back_with_masked_stores(kernel):
    executable, main = build_seen_after("tf_dietcode.VectorWriteBacks", NT, kernel)
    masked, partial = _masked_stores_and_partial_loops(main.body)
    assert masked, "no write-back was masked"
    assert not partial, "a write-back still loops over a partial tile's columns"
    assert_computes_the_product(executable, NT, kernel, range(1, 41))


@pytest.mark.parametrize("kernel", [MicroKernel(4, 3 * LANES, 64, 1, True, whole_batch=True),
                                    MicroKernel(3, LANES, 64, 2, True)], ids=lambda kernel: kernel.name)
def test_partial_write_backs_store_whole_vectors_where_all_their_columns_are_inside(kernel):
    """Each vector of a partial column task's write-back is stored plainly where all its columns
    are below the bound, and masked only where some are (a masked store is microcoded on AMD Zen);
    the masks compare 32-bit lanes."""
    executable, main = build_seen_after("tf_dietcode.VectorWriteBacks", NT, kernel)
    masked = [call for call in _calls(main.body) if call.op.same_as(_MASKED_STORE)]
    whole_or_masked = [branch for branch in nodes(main.body, tir_stmt.IfThenElse)
                       if isinstance(branch.then_case, tir_stmt.BufferStore)
                       and branch.then_case.buffer.name.startswith("out")]
    assert masked and len(whole_or_masked) == len(masked)
    for branch in whole_or_masked:
        assert isinstance(branch.then_case.indices[-1], tirx.Ramp)
        assert [call for call in _calls(branch.else_case) if call.op.same_as(_MASKED_STORE)]
    assert all(str(call.args[-1].a.ty.dtype) == f"int32x{LANES}" for call in masked)
    assert_computes_the_product(executable, NT, kernel, range(1, 41))


def test_an_addend_of_symbolic_column_stride_is_read_by_version():
    """Batch matmul's addend has a symbolic column stride (1 in the usual layout, 0 for a mask
    broadcast along the columns). Each write-back that reads it, whole or partial, becomes vector
    stores in two versions: for a unit stride, vector loads (masked where partial); else gathers,
    their columns clamped to the last one. No write-back keeps a loop over the columns or rows."""
    kernel = MicroKernel(2, LANES, 16, 1, False, whole_batch=True)
    executable, main = build_seen_after("tf_dietcode.VectorWriteBacks", NT_MASKED, kernel)
    masked, partial = _masked_stores_and_partial_loops(main.body)
    assert masked and not partial
    branches = []
    tvm_ffi.structural_walk(main.body, (tir_stmt.IfThenElse, branches.append))
    assert any("addend_stride3 == " in str(branch.condition) for branch in branches)
    loads = [load for call in masked for load in _loads(call.args[1]) if load.source.name.startswith("addend")]
    assert any(not isinstance(load.indices[-1], tirx.Ramp) for load in loads)  # the gathers
    masked_loads = [call for call in _calls(main.body) if call.op.same_as(_MASKED_LOAD)]
    assert masked_loads  # the unit stride's partial columns
    scalar_stores = [store for store in nodes(main.body, tir_stmt.BufferStore) if store.buffer.name.startswith("out")
                     and tvm.DataType(str(store.value.ty.dtype)).lanes == 1]
    assert not scalar_stores
    rolled_rows = [loop for loop in nodes(main.body, tir_stmt.For) if isinstance(loop.extent, tirx.IntImm)
                   and not nodes(loop, tir_stmt.BufferStore)
                   and any(call.op.same_as(_MASKED_STORE) for call in _calls(loop))]
    assert not rolled_rows
    assert_computes_the_product(executable, NT_MASKED, kernel, range(1, 41))


def test_static_builds_have_nothing_to_mask():
    kernel = MicroKernel(4, 2 * LANES, 64, 1, False, whole_batch=True)
    _, main = build_seen_after("tf_dietcode.VectorWriteBacks", NT, kernel, NT.dims_at((37,)))
    assert _masked_stores_and_partial_loops(main.body) == ([], [])


def test_only_whole_vectors_up_to_a_symbolic_bound_are_masked():
    n = tirx.Var("n", "int64")
    assert whole_vectors_up_to_a_bound(tirx.Min(tirx.const(2 * LANES, "int64"), n), LANES)[0] == 2 * LANES
    assert whole_vectors_up_to_a_bound(tirx.Max(tirx.Min(n, tirx.const(LANES, "int64")), tirx.const(0, "int64")),
                                       LANES)[0] == LANES
    assert whole_vectors_up_to_a_bound(tirx.Min(tirx.const(LANES + 1, "int64"), n), LANES) is None
    assert whole_vectors_up_to_a_bound(tirx.Min(tirx.const(LANES, "int64"), tirx.const(3, "int64")), LANES) is None
    assert whole_vectors_up_to_a_bound(n, LANES) is None


@pytest.mark.parametrize("workload", [Workload("dense", (1, 128), 96, 64), Workload("dense", (1, 16), 9, 16,
                                                                                     activation="sigmoid")],
                         ids=["dense_96", "dense_9"])
def test_write_backs_already_in_vectors_are_left_alone(workload):
    """A dense write-back is vectorized by its schedule: its loops run over rows or vectors, not one
    column per iteration. Taking such a loop for columns vectorized a vector (a failed compile)."""
    space = micro_kernel.space(hardware.detect(), workload)
    for kernel in space[::max(1, len(space) // 12)]:
        executable, main = build_seen_after("tf_dietcode.VectorWriteBacks", workload, kernel)
        assert _masked_stores_and_partial_loops(main.body)[0] == [], kernel.name
        assert_computes_the_product(executable, workload, kernel, (1, 7, workload.m.hi))
