"""OwnRowPointers: in symbolic kernels, the loops that read 5 or more of x's rows a symbolic stride
apart read each row through its own (laundered) pointer, and write-backs of as many rows store through
the first row's; static builds, smaller tiles and rows at one address (a small size's copy) keep their
loads; the kernels so built compute the product, also on attention's layouts read in place."""

import functools

import pytest
import tvm
from tvm import sym, tirx
from tvm.tirx import stmt as tir_stmt

from lowered_kernels import (assert_computes_on_attention_layouts, assert_computes_the_product, build_seen_after,
                             nodes, small_reduction_copies)
from tf_dietcode.tuning.micro_kernel import MicroKernel
from tf_dietcode.tuning.tir_passes.ir import in_scope, rebuild_loops, uses
from tf_dietcode.tuning.tir_passes.row_pointers import MIN_ROWS
from tf_dietcode.tuning.workload import Workload

PASS = "tf_dietcode.OwnRowPointers"
NN = Workload("batch_matmul", (1, 24), 32, (1, 24), b=(1, 6), transpose_b=False, ties=("m", "k"))
NT = Workload("batch_matmul", (1, 24), (1, 24), 16, b=(1, 6), ties=("m", "n"))
SIX_ROWS = MicroKernel(6, 16, 32, 1, False, whole_batch=True)
FIVE_ROWS = MicroKernel(5, 8, 16, 1, False)
FOUR_ROWS = MicroKernel(4, 16, 32, 1, False, whole_batch=True)


@functools.cache
def _built(workload, kernel, t=None):
    """(the kernel compiled symbolic, or for T = t; its "main" after the pass)."""
    return build_seen_after(PASS, workload, kernel, None if t is None else workload.dims_at((t,)))


def _laundered(body) -> list:
    """The buffers declared on a laundered row address."""
    return [d for d in nodes(body, tir_stmt.DeclBuffer) if "llvm.launder.invariant.group" in str(d.data)]


def _rows_read_in_place(body) -> list[int]:
    """For each serial loop: how many x rows (at addresses a symbolic distance apart) it reads at
    base + its variable."""
    counts = []

    def visit(loop, enclosing):
        if loop.kind == tir_stmt.ForKind.SERIAL:
            analyzer, bases = in_scope(enclosing), []
            for load in nodes(loop.body, tvm.ir.TensorLoad):
                if load.source.name.startswith("x") and not isinstance(load.indices[0], tirx.Ramp):
                    scale, base = sym.detect_linear_equation(load.indices[0], [loop.loop_var]) or (None, None)
                    if isinstance(scale, tirx.IntImm) and int(scale) == 1 and not any(
                            analyzer.can_prove_equal(base, b) for b in bases):
                        bases.append(base)
            counts.append(len(bases))
        return loop

    rebuild_loops(body, visit)
    return counts


@pytest.mark.parametrize("workload, kernel", [(NN, SIX_ROWS), (NN, FIVE_ROWS), (NT, SIX_ROWS)],
                         ids=["nn_6_rows", "nn_5_rows", "nt_6_rows"])
def test_loops_over_many_rows_read_each_through_its_own_pointer(workload, kernel):
    _, main = _built(workload, kernel)
    rows = _rows_read_in_place(main.body)
    assert len(_laundered(main.body)) >= kernel.tile_m  # at least the whole row tiles' reduction
    assert rows and max(rows) < MIN_ROWS


@pytest.mark.parametrize("workload, kernel, t", [(NN, FOUR_ROWS, None), (NN, SIX_ROWS, 17), (NT, SIX_ROWS, 17)],
                         ids=["four_rows", "nn_static", "nt_static"])
def test_fewer_rows_and_static_builds_keep_their_loads(workload, kernel, t):
    """Four rows: LLVM keeps a pointer per row itself. Static: rows a constant distance apart."""
    _, main = _built(workload, kernel, t)
    assert not _laundered(main.body)


def test_whole_tiles_place_each_row_at_its_distance_from_the_first():
    """Laundered at a distance free of the loops' variables from the first row's laundered address,
    the rows cost LLVM one add per tile each, not (first + i) * stride."""
    _, main = _built(NN, SIX_ROWS)
    loop_vars = [loop.loop_var for loop in nodes(main.body, tir_stmt.For)]
    derived = [load for d in _laundered(main.body) for load in nodes(d.data, tvm.ir.TensorLoad)
               if load.source.name.startswith("x_row")]
    assert len(derived) >= SIX_ROWS.tile_m - 1  # at least the whole row tiles' reduction
    assert all(not uses(load.indices[0], loop_vars) for load in derived)  # test_kernels_compute_the_product runs it


@pytest.mark.parametrize("workload, kernel", [(NN, SIX_ROWS), (NN, FIVE_ROWS), (NT, SIX_ROWS)],
                         ids=["nn_6_rows", "nn_5_rows", "nt_6_rows"])
def test_write_backs_of_many_rows_store_through_the_first_rows_pointer(workload, kernel):
    """Stored at (first + i) * stride, each row cost an `imul` per tile; through the first row's
    laundered address, row i lies at i * stride from it. Partial tiles of fewer rows keep theirs."""
    _, main = _built(workload, kernel)
    rows_loops = [loop for loop in nodes(main.body, tir_stmt.For)
                  if isinstance(loop.body, tir_stmt.For) and isinstance(loop.body.body, tir_stmt.BufferStore)
                  and loop.body.body.buffer.name.startswith("out")]
    assert rows_loops
    for loop in rows_loops:
        through_row = loop.body.body.buffer.name.startswith("out_row")
        assert through_row == (isinstance(loop.extent, tirx.IntImm) and int(loop.extent) >= MIN_ROWS), loop
    assert any(int(loop.extent) == kernel.tile_m for loop in rows_loops if isinstance(loop.extent, tirx.IntImm))


@pytest.mark.parametrize("size", range(1, 6))
def test_rows_clamped_to_one_address_share_its_pointer(size):
    """In the copy for M = K = size (small_reductions), the tile's rows past M read row M - 1. Each
    row tile loop that runs gets one pointer per distinct row, none where fewer than MIN_ROWS
    remain: 8 laundered copies of one pointer cost NN's m8_n8_k128_t1_ko_b 8 loads of x per K step
    where its static build has 1 (1.08-1.19x the static build's time at T = 1-3; 0.98-1.06x since)."""
    _, main = _built(NN, SIX_ROWS)
    copy = small_reduction_copies(main.body)[(("K", "M"), size)]
    running = []  # per row tile loop that runs: the laundered pointers declared in its body

    def visit(loop, enclosing):
        deeper = [d for inner in nodes(loop.body, tir_stmt.For) for d in _laundered(inner.body)]
        here = [d for d in _laundered(loop.body) if not any(d.same_as(e) for e in deeper)]
        if here and not in_scope(enclosing).can_prove(loop.extent == 0):
            running.append(len(here))
        return loop

    rebuild_loops(copy, visit)
    rows = min(size, SIX_ROWS.tile_m)
    assert running == ([rows] if rows >= MIN_ROWS else [])


@pytest.mark.parametrize("workload, kernel", [(NN, SIX_ROWS), (NN, FIVE_ROWS), (NT, SIX_ROWS)],
                         ids=["nn_6_rows", "nn_5_rows", "nt_6_rows"])
def test_kernels_compute_the_product(workload, kernel):
    executable, _ = _built(workload, kernel)
    assert_computes_the_product(executable, workload, kernel, [1, 2, 4, 5, 6, 7, 11, 12, 13, 23, 24])


@pytest.mark.parametrize("t", [1, 5, 7, 24])
def test_kernels_read_attention_layouts_in_place(t):
    """x as a [B, H, T, K] view of [batch, time, heads, depth]: rows a stride of heads * depth apart."""
    assert_computes_on_attention_layouts(_built(NN, SIX_ROWS)[0], NN, t, heads=3)
