"""SplitReductionChains: a reduction loop whose live accumulator vectors are fewer than
CHAINS_IN_FLIGHT adds into partial accumulators, summed after the loop; one with enough live
chains, or none of constant trip count, is left alone; kernels compute what they did."""

import numpy as np
import pytest
import tvm
from tvm.script import tirx as T
from tvm.tirx import stmt as tir_stmt

from lowered_kernels import assert_computes_the_product, build_seen_after, compile_seen_after, nodes
from tf_dietcode.tuning import hardware
from tf_dietcode.tuning.micro_kernel import MicroKernel
from tf_dietcode.tuning.tir_passes.reduction_chains import CHAINS_IN_FLIGHT, ways
from tf_dietcode.tuning.workload import Workload


@T.macro
def four_chains(tile, x, y):
    """tile [4, 8] = x^T y for x [64, 4], y [64, 8]: four 8-lane accumulators over K = 64."""
    for i in T.unroll(4):
        tile[T.Ramp(i * 8, 1, 8)] = T.Broadcast(T.float32(0), 8)
    for k in range(64):
        for i in T.unroll(4):
            tile[T.Ramp(i * 8, 1, 8)] = (tile[T.Ramp(i * 8, 1, 8)]
                                         + T.Broadcast(x[k * 4 + i], 8) * y[T.Ramp(k * 8, 1, 8)])


@T.prim_func
def products(x: T.Buffer((256,), "float32"), y: T.Buffer((512,), "float32"), z: T.Buffer((2048,), "float32"),
             rows: T.int64,
             one: T.Buffer((8,), "float32"), first: T.Buffer((8,), "float32"), every: T.Buffer((32,), "float32"),
             wide_out: T.Buffer((32,), "float32")):
    """x [64, 4], y [64, 8] and z [64, 32] row-major; outputs hold rows of x^T y (wide_out: of x^T z)."""
    acc = T.alloc_buffer((8,), "float32")  # one chain, read after the loop: split
    acc[T.Ramp(0, 1, 8)] = T.Broadcast(T.float32(0), 8)
    for k in range(64):
        acc[T.Ramp(0, 1, 8)] = acc[T.Ramp(0, 1, 8)] + T.Broadcast(x[k * 4], 8) * y[T.Ramp(k * 8, 1, 8)]
    one[T.Ramp(0, 1, 8)] = acc[T.Ramp(0, 1, 8)]
    tile = T.alloc_buffer((32,), "float32")  # four chains, only the first read after the loop: split for one
    four_chains(tile, x, y)
    first[T.Ramp(0, 1, 8)] = tile[T.Ramp(0, 1, 8)]
    whole = T.alloc_buffer((32,), "float32")  # four chains read by a loop of symbolic extent: split for four
    four_chains(whole, x, y)
    for i in range(rows):
        every[T.Ramp(i * 8, 1, 8)] = whole[T.Ramp(i * 8, 1, 8)]
    wide = T.alloc_buffer((32,), "float32")  # one update of 32 lanes: 4 AVX2 chains, split in 2
    wide[T.Ramp(0, 1, 32)] = T.Broadcast(T.float32(0), 32)
    for k in range(64):
        wide[T.Ramp(0, 1, 32)] = wide[T.Ramp(0, 1, 32)] + T.Broadcast(x[k * 4], 32) * z[T.Ramp(k * 32, 1, 32)]
    wide_out[T.Ramp(0, 1, 32)] = wide[T.Ramp(0, 1, 32)]


def test_ways_fill_the_chains_in_flight_without_exceeding_them():
    assert [ways(live) for live in range(1, 10)] == [8, 4, 2, 2, 1, 1, 1, 1, 1]
    assert all(live * ways(live) <= max(live, CHAINS_IN_FLIGHT) for live in range(1, 17))


def test_loops_with_few_live_chains_split_and_compute_the_same():
    if not {"avx2", "fma"} <= set(hardware.detect().features):
        pytest.skip("the loops are written for 8-lane vectors: AVX2 (compiled for Haswell, also on AVX-512 hosts)")
    eight_lanes = tvm.target.Target({"kind": "llvm", "mcpu": "haswell"})
    executable, module = compile_seen_after("tf_dietcode.SplitReductionChains", products, eight_lanes)
    body = module["products"].body
    partials = sorted(int(allocation.buffer.shape[0]) for allocation in nodes(body, tir_stmt.AllocBuffer)
                      if allocation.buffer.name.endswith("_partial"))
    assert partials == [32, 32, 7 * 8, 7 * 32]  # 4 live chains in 2 (twice: 4 x 8 and 1 x 32 lanes); 1 in 8;
    #                                             1 live of 4 in 8
    trips = sorted(int(loop.extent) for loop in nodes(body, tir_stmt.For) if isinstance(loop.extent, tvm.tirx.IntImm))
    assert trips == [8, 8, 32, 32]
    rng = np.random.default_rng(0)
    x, y, z = (rng.standard_normal(shape).astype(np.float32) for shape in ((64, 4), (64, 8), (64, 32)))
    tensors = [tvm.runtime.tensor(array.ravel()) for array in (x, y, z)]
    results = [tvm.runtime.tensor(np.zeros(size, np.float32)) for size in (8, 8, 32, 32)]
    executable["products"](*tensors, 4, *results)
    expected = x.astype(np.float64).T @ y.astype(np.float64)  # [4, 8]
    wide = x[:, 0].astype(np.float64) @ z.astype(np.float64)
    for got, want in zip((r.numpy() for r in results), (expected[0], expected[0], expected.ravel(), wide)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


NT = Workload("batch_matmul", (1, 128), (1, 128), 64, b=192, ties=("m", "n"))
DENSE = Workload("dense", (1, 128), 768, 768)


@pytest.mark.parametrize("workload,kernel,sizes", [
    (NT, MicroKernel(5, 8, 64, 1, False, whole_batch=True), [1, 2, 3, 4, 5, 6, 9, 17]),
    (NT, MicroKernel(1, 8, 64, 1, False, whole_batch=True), [1, 2, 8]),
    (DENSE, MicroKernel(3, 24, 384, 1, True, packed=True), [1, 2, 4, 7])],
    ids=["nt_remainder_rows", "nt_one_row", "dense_remainder_rows"])
def test_kernels_with_few_rows_split_their_chains(workload, kernel, sizes):
    """A 5-row tile's remainders of 1-4 rows split (its whole tiles of 5 chains do not); a 1-row
    tile's one chain splits; the numbers match the float64 product at each size."""
    executable, lowered = build_seen_after("tf_dietcode.SplitReductionChains", workload, kernel)
    assert any(allocation.buffer.name.endswith("_partial") for allocation in nodes(lowered.body, tir_stmt.AllocBuffer))
    assert_computes_the_product(executable, workload, kernel, sizes)
