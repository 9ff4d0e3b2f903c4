"""OverlapPartialTiles: a symbolic kernel's last, partial column tile runs as a whole tile
shifted back to end at the bound (where the extent holds a whole tile); a register tile's
last rows stay as they are, its whole row tiles losing the clamps they never need; never a
reduction's last block or a tile that reads what it writes. The kernels so built compute the
product at every T, below, at and past each tile width."""

import pytest
import tvm
from tvm import tirx
from tvm.tirx import stmt as tir_stmt

from lowered_kernels import assert_computes_the_product, build_seen_after, nodes
from tf_dietcode.tuning import hardware
from tf_dietcode.tuning.micro_kernel import MicroKernel
from tf_dietcode.tuning.tir_passes.overlapping_tiles import overlap_partial_tiles
from tf_dietcode.tuning.workload import Workload

LANES = hardware.detect().vector_lanes
PASS = "tf_dietcode.OverlapPartialTiles"
NT = Workload("batch_matmul", (1, 40), (1, 40), 64, b=3, ties=("m", "n"))
NN = Workload("batch_matmul", (1, 40), 64, (1, 40), b=3, transpose_b=False, ties=("m", "k"))
DENSE = Workload("dense", (1, 40), 96, 64, bias=True, activation="relu", weight_layout="packed")


def _tile_starts(body) -> list[str]:
    """The last tile's start, E - W, for each loop over tiles that end at E (starting at
    min(a * W, E - W)), as text."""
    starts = [binding.value for binding in nodes(body, tir_stmt.Bind) if binding.var.name == "tile_start"]
    assert all(isinstance(start, tirx.Min) for start in starts)
    return sorted(str(start.b) for start in starts)


def _clamped_row_reads(body) -> int:
    """Reads of x whose index holds a min (a row clamped to M - 1)."""
    return sum(1 for load in nodes(body, tvm.ir.TensorLoad)
               if load.source.name.startswith("x") and nodes(load.indices[-1], tirx.Min))


@pytest.mark.parametrize("workload, kernel, starts", [
    # a whole batch per task: its column tasks end at N
    (NT, MicroKernel(4, 2 * LANES, 64, 1, False, whole_batch=True), [f"N - T.int64({2 * LANES})"]),
    # column tasks in parallel, and row tiles: none shifted (rows stay to SpecializeRemainderRows)
    (NT, MicroKernel(3, LANES, 64, 2, True), []),
    (NN, MicroKernel(5, 16, 16, 1, True), []),  # nor NN's last K block, which accumulates
    (DENSE, MicroKernel(6, 16, 32, 1, False, packed=True, task_m=0), []),
], ids=lambda value: getattr(value, "name", None) if isinstance(value, MicroKernel) else None)
def test_partial_column_tasks_end_at_the_bound_and_whole_row_tiles_lose_their_clamps(workload, kernel, starts):
    executable, main = build_seen_after(PASS, workload, kernel)
    assert _tile_starts(main.body) == starts
    _, before = build_seen_after("tf_dietcode.ShrinkGuardedLoops", workload, kernel)
    assert _clamped_row_reads(main.body) < _clamped_row_reads(before.body)
    assert_computes_the_product(executable, workload, kernel, range(1, 41))


def test_static_builds_are_left_alone():
    """A static build's tiles have constant extents: LoopPartition leaves no pair to rewrite."""
    kernel = MicroKernel(4, 2 * LANES, 64, 1, False, whole_batch=True)
    _, main = build_seen_after(PASS, NT, kernel, NT.dims_at((37,)))
    assert _tile_starts(main.body) == []


def _split_loops(accumulate: bool = False, rows: bool = False) -> tir_stmt.Stmt:
    """out[i] = x[min(i, E - 1)] (or out[i] += ...) over E elements in tiles of 4: the whole tiles'
    loop and the partial tile's (for rows, a write-back of min(4, E - 4 * tiles) elements), as
    LoopPartition and ShrinkGuardedLoops leave them, inside a batch loop."""
    extent = tirx.Var("E", "int64")
    out = tirx.decl_buffer((extent,), "float32", "out")
    x = tirx.decl_buffer((extent,), "float32", "x")
    tile, rest, start = (tirx.Var(name, "int64") for name in ("tile", "rest", "start"))
    zero, four = tirx.const(0, "int64"), tirx.const(4, "int64")

    def copy(first, count):
        element = tirx.Var("element", "int64")
        value = x[tirx.min(first + element, extent - 1)]
        value = value + out[first + element] if accumulate else value
        return tir_stmt.For(element, zero, count, tir_stmt.ForKind.SERIAL,
                            tir_stmt.BufferStore(out, value, [first + element]))
    whole = tir_stmt.For(tile, zero, tirx.floordiv(extent, 4), tir_stmt.ForKind.SERIAL,
                         tir_stmt.SeqStmt([tir_stmt.Bind(start, tile * 4), copy(start, four)]))
    last = tirx.floordiv(extent, 4) * 4
    partial = tir_stmt.For(rest, zero, tirx.floordiv(tirx.floormod(extent, 4) + 3, 4), tir_stmt.ForKind.SERIAL,
                           copy(last, tirx.min(four, extent - last)) if rows
                           else tir_stmt.Evaluate(tirx.const(0, "int32")))
    batch = tirx.Var("batch", "int64")
    return tir_stmt.For(batch, zero, tirx.const(2, "int64"), tir_stmt.ForKind.SERIAL, tir_stmt.SeqStmt([whole, partial]))


@pytest.mark.parametrize("accumulate, shifted", [(False, True), (True, False)], ids=["writes", "accumulates"])
def test_only_tiles_that_write_their_output_without_reading_it_are_shifted(accumulate, shifted):
    """A tile that reads what it writes would add twice where two tiles overlap."""
    rewritten = overlap_partial_tiles(_split_loops(accumulate=accumulate))
    assert (_tile_starts(rewritten) == ["E - T.int64(4)"]) == shifted


def test_a_row_remainder_stays_and_its_whole_tiles_lose_their_clamps():
    rewritten = overlap_partial_tiles(_split_loops(rows=True))
    assert _tile_starts(rewritten) == []
    whole, partial = rewritten.body.seq
    assert not nodes(whole, tirx.Min)  # x[min(4 * tile + element, E - 1)]: 4 * tile + element < E there
    assert len(nodes(partial, tirx.Min)) == 2  # its clamp and its row count
