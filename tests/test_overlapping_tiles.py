"""OverlapPartialTiles: a symbolic kernel's last, partial output tile runs as a whole tile
shifted back to end at the bound (where the extent holds a whole tile), never a reduction's
last block or a tile that reads what it writes; the kernels so built compute the product at
every T, below, at and past each tile width."""

import pytest
import tvm_ffi
from tvm import tirx
from tvm.tirx import stmt as tir_stmt

from lowered_kernels import assert_computes_the_product, build_seen_after
from tf_dietcode.tuning import hardware
from tf_dietcode.tuning.micro_kernel import MicroKernel
from tf_dietcode.tuning.overlapping_tiles import overlap_partial_tiles
from tf_dietcode.tuning.workload import Workload

LANES = hardware.detect().vector_lanes
PASS = "tf_dietcode.OverlapPartialTiles"
NT = Workload("batch_matmul", (1, 40), (1, 40), 64, b=3, ties=("m", "n"))
NN = Workload("batch_matmul", (1, 40), 64, (1, 40), b=3, transpose_b=False, ties=("m", "k"))
DENSE = Workload("dense", (1, 40), 96, 64, bias=True, activation="relu", weight_layout="packed")


def _tile_starts(body) -> list[str]:
    """The last tile's start, E - W, for each loop over tiles that end at E (starting at
    min(a * W, E - W)), as text."""
    found = []
    tvm_ffi.structural_walk(body, (tir_stmt.Bind, found.append))
    starts = [binding.value for binding in found if binding.var.name == "tile_start"]
    assert all(isinstance(start, tirx.Min) for start in starts)
    return sorted(str(start.b) for start in starts)


@pytest.mark.parametrize("workload, kernel, starts", [
    # a whole batch per task: its column tasks, and each one's row tiles
    (NT, MicroKernel(4, 2 * LANES, 64, 1, False, whole_batch=True), ["M - T.int64(4)", f"N - T.int64({2 * LANES})"]),
    # column tasks in parallel: only the row tiles of a task
    (NT, MicroKernel(3, LANES, 64, 2, True), ["M - T.int64(3)"]),
    (NN, MicroKernel(5, 16, 16, 1, True), ["M - T.int64(5)"]),
    (DENSE, MicroKernel(6, 16, 32, 1, False, packed=True, task_m=0), ["M - T.int64(6)"]),
], ids=lambda value: getattr(value, "name", None) if isinstance(value, MicroKernel) else None)
def test_last_partial_tiles_run_as_whole_tiles_shifted_back(workload, kernel, starts):
    executable, main = build_seen_after(PASS, workload, kernel)
    assert _tile_starts(main.body) == starts  # never K: NN's last K block accumulates, it is left alone
    assert_computes_the_product(executable, workload, kernel, range(1, 41))


def test_whole_tiles_read_their_rows_unclamped():
    """Every tile of the new loop is whole, so x's rows need no clamp to M - 1 there."""
    kernel = MicroKernel(3, 3 * LANES, 64, 1, False, whole_batch=True)
    _, main = build_seen_after(PASS, NT, kernel)
    loops = []
    tvm_ffi.structural_walk(main.body, (tir_stmt.For, loops.append))
    [row_tiles] = [loop for loop in loops if _tile_starts(loop.body) == ["M - T.int64(3)"]]
    clamps = []
    tvm_ffi.structural_walk(row_tiles.body, (tirx.Min, clamps.append))
    assert len(clamps) == 1  # the tile's start, min(a * 3, M - 3)


def test_static_builds_are_left_alone():
    """A static build's tiles have constant extents: LoopPartition leaves no pair to shift."""
    kernel = MicroKernel(4, 2 * LANES, 64, 1, False, whole_batch=True)
    _, main = build_seen_after(PASS, NT, kernel, NT.dims_at((37,)))
    assert _tile_starts(main.body) == []


def _split_loops(accumulate: bool) -> tir_stmt.Stmt:
    """out[i] = x[i] (or out[i] += x[i]) over E elements in tiles of 4: the whole tiles' loop and
    the partial tile's, as LoopPartition and ShrinkGuardedLoops leave them, inside a batch loop."""
    extent = tirx.Var("E", "int64")
    out = tirx.decl_buffer((extent,), "float32", "out")
    x = tirx.decl_buffer((extent,), "float32", "x")
    tile, column, rest = (tirx.Var(name, "int64") for name in ("tile", "column", "rest"))
    start = tirx.Var("start", "int64")

    def copy(first):
        value = x[first + column] + (out[first + column] if accumulate else tirx.const(0, "float32"))
        return tir_stmt.For(column, tirx.const(0, "int64"), tirx.const(4, "int64"), tir_stmt.ForKind.SERIAL,
                            tir_stmt.BufferStore(out, value, [first + column]))
    whole = tir_stmt.For(tile, tirx.const(0, "int64"), tirx.floordiv(extent, 4), tir_stmt.ForKind.SERIAL,
                         tir_stmt.SeqStmt([tir_stmt.Bind(start, tile * 4), copy(start)]))
    partial = tir_stmt.For(rest, tirx.const(0, "int64"), tirx.floordiv(tirx.floormod(extent, 4) + 3, 4),
                           tir_stmt.ForKind.SERIAL, tir_stmt.Evaluate(tirx.const(0, "int32")))
    batch = tirx.Var("batch", "int64")
    return tir_stmt.For(batch, tirx.const(0, "int64"), tirx.const(2, "int64"), tir_stmt.ForKind.SERIAL,
                        tir_stmt.SeqStmt([whole, partial]))


@pytest.mark.parametrize("accumulate, shifted", [(False, True), (True, False)], ids=["writes", "accumulates"])
def test_only_tiles_that_write_their_output_without_reading_it_are_shifted(accumulate, shifted):
    """A tile that reads what it writes would add twice where two tiles overlap."""
    shifted_loops = overlap_partial_tiles(_split_loops(accumulate))
    assert (_tile_starts(shifted_loops) == ["E - T.int64(4)"]) == shifted
