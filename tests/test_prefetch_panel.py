"""PrefetchNextPanel: dense kernels whose tasks are one packed panel each ask for the
next task's panel from inside their compute (from their first EVERY row tiles, at
addresses in bounds with no clamp; with a weight in the caches, only tasks of two whole
row tiles or more), and compute what they computed without it; other kernels prefetch
nothing."""

import dataclasses

import numpy as np
import pytest
import tvm
import tvm_ffi
from tvm import sym, tirx
from tvm.tirx import stmt as tir_stmt

from lowered_kernels import build_seen_after
from tf_dietcode.tuning import hardware, measure, templates
from tf_dietcode.tuning.micro_kernel import MicroKernel
from tf_dietcode.tuning.templates import dense
from tf_dietcode.tuning.tir_passes import markers
from tf_dietcode.tuning.workload import Workload

HW = hardware.detect()
FFN_IN = Workload("dense", (1, 2048), 3072, 768, bias=True, activation="gelu_tanh", cold_weight=True)
PREFETCHING = MicroKernel(tile_m=6, tile_n=16, tile_k=256, task_n=1, k_outer=False, packed=True, task_m=0)


def _lowered(workload: Workload, kernel: MicroKernel, dims: dict | None = None) -> tir_stmt.Stmt:
    """The kernel's body right after our PrefetchNextPanel pass."""
    return build_seen_after("tf_dietcode.PrefetchNextPanel", workload, kernel, dims)[1].body


_PREFETCH = tirx.call_llvm_intrin("void", "llvm.prefetch.p0", *[tirx.const(0, "int32")] * 4)


def _prefetches_and_loops(body) -> tuple[list, list]:
    """The prefetch calls and the loops in a lowered body."""
    calls, loops = [], []
    tvm_ffi.structural_walk(body, ((tvm.ir.Call, tir_stmt.For), lambda node: (
        loops if isinstance(node, tir_stmt.For) else calls).append(node)))
    return [call for call in calls if call.op.same_as(_PREFETCH.op)
            and int(call.args[0]) == int(_PREFETCH.args[0])], loops


def test_prefetching_kernels_ask_for_the_next_panel_from_the_compute_loop():
    assert dense.prefetches_next_panel(FFN_IN, PREFETCHING)
    body = _lowered(FFN_IN, PREFETCHING)
    calls, loops = _prefetches_and_loops(body)
    # one per cache line of a k row, in each copy of the compute loop (LoopPartition splits off the last row tile)
    assert calls and len(calls) % (PREFETCHING.tile_n // 16) == 0
    assert not any(key.startswith("tf_dietcode.prefetch") for loop in loops for key in loop.annotations)
    # at the first step of every task t, it asks for the first k row of panel t + 1
    parallel = next(loop for loop in loops if loop.kind == tir_stmt.ForKind.PARALLEL)
    panel = FFN_IN.k.hi * PREFETCHING.tile_n
    for task in (0, 5):
        analyzer = sym.Analyzer()
        analyzer.bind(parallel.loop_var, tirx.const(task, parallel.loop_var.ty.dtype))
        for loop in loops:
            if not loop.loop_var.same_as(parallel.loop_var):
                analyzer.bind(loop.loop_var, loop.min)
        indices = [int(analyzer.simplify(call.args[1].args[0].indices[0])) for call in calls]  # address_of(wp[i])
        assert (task + 1) * panel in indices
        assert all((task + 1) * panel <= index < (task + 2) * panel for index in indices)  # the next panel only


def _guarded_prefetches(body) -> list[tir_stmt.IfThenElse]:
    """The branches whose then-case is prefetches alone."""
    branches = []
    tvm_ffi.structural_walk(body, (tir_stmt.IfThenElse, branches.append))
    return [branch for branch in branches
            if all(isinstance(s, tir_stmt.Evaluate) and _prefetches_and_loops(s)[0]
                   for s in (branch.then_case.seq if isinstance(branch.then_case, tir_stmt.SeqStmt)
                             else [branch.then_case]))]


def _conjuncts(condition) -> list:
    return [*_conjuncts(condition.a), *_conjuncts(condition.b)] if isinstance(condition, tirx.And) else [condition]


def test_only_the_first_row_tiles_prefetch_and_every_address_is_in_bounds():
    """The first EVERY row tiles of a task ask for the next panel's K rows and the later ones for
    nothing, and every address lies in the weight, the last task's too (its own panel again),
    with no clamp per step (prefetch_panel says what the clamps cost)."""
    body = _lowered(FFN_IN, PREFETCHING)
    calls, loops = _prefetches_and_loops(body)
    guarded = _guarded_prefetches(body)
    assert guarded and sum(len(_prefetches_and_loops(g.then_case)[0]) for g in guarded) == len(calls)
    weight_floats = FFN_IN.n.hi * FFN_IN.k.hi
    for branch in guarded:
        row_tiles = [term for term in _conjuncts(branch.condition) if isinstance(term, tirx.LT)]
        assert len(row_tiles) == 1 and int(row_tiles[0].b) == markers.EVERY
        row_tile = row_tiles[0].a.value if isinstance(row_tiles[0].a, tirx.Cast) else row_tiles[0].a
        analyzer = sym.Analyzer()
        for loop in loops:
            extent = tirx.const(markers.EVERY, "int64") if loop.loop_var.same_as(row_tile) else loop.extent
            analyzer.bind(loop.loop_var, tvm.ir.Range.from_min_extent(loop.min, extent))
        for call in _prefetches_and_loops(branch.then_case)[0]:
            index = call.args[1].args[0].indices[0]
            assert analyzer.can_prove(index >= 0) and analyzer.can_prove(index < weight_floats), index
            clamps = []
            tvm_ffi.structural_walk(index, (tirx.Min, clamps.append))
            assert len(clamps) <= 1, index  # the task's: a task's last step asks for a panel in bounds


WARM = dataclasses.replace(FFN_IN, cold_weight=False)


def test_warm_kernels_prefetch_from_two_whole_row_tiles():
    assert dense.prefetches_next_panel(WARM, PREFETCHING)
    symbolic = _lowered(WARM, PREFETCHING)
    calls, loops = _prefetches_and_loops(symbolic)
    guarded = _guarded_prefetches(symbolic)
    assert calls and guarded and sum(len(_prefetches_and_loops(g.then_case)[0]) for g in guarded) == len(calls)
    tile = PREFETCHING.tile_m
    # each guard asks whether M fills two row tiles
    for branch in guarded:
        assert any(isinstance(term, tirx.GE) and isinstance(term.a, tirx.Var) and term.a.name == "M"
                   and int(term.b) == dense.WARM_PREFETCH_MIN_ROW_TILES * tile for term in _conjuncts(branch.condition))
    for m, prefetches in ((tile + tile // 2, False), (2 * tile, True), (97, True)):  # one whole tile and a part: none
        calls, _ = _prefetches_and_loops(_lowered(WARM, PREFETCHING, WARM.dims_at((m,))))
        assert bool(calls) == prefetches, m


@pytest.mark.parametrize("workload, kernel", [
    (FFN_IN, dataclasses.replace(PREFETCHING, task_n=2)),               # two panels per task
    (FFN_IN, dataclasses.replace(PREFETCHING, task_m=1)),               # tasks split rows too
    (FFN_IN, dataclasses.replace(PREFETCHING, packed=False, task_m=1)),  # the weight read in place
    (FFN_IN, dataclasses.replace(PREFETCHING, tile_k=6)),               # K blocks not whole blocks of steps
], ids=["two_panels", "row_tasks", "in_place", "partial_step_blocks"])
def test_other_kernels_ask_for_nothing(workload, kernel):
    assert not dense.prefetches_next_panel(workload, kernel)
    calls, _ = _prefetches_and_loops(_lowered(workload, kernel))
    assert not calls


ONE_TASK = Workload("dense", (1, 20), 24, 16, cold_weight=True)  # one panel: lowering drops the parallel loop


@pytest.mark.parametrize("workload, kernel", [(FFN_IN, PREFETCHING), (WARM, PREFETCHING),
                                              (FFN_IN, MicroKernel(4, 24, 768, 1, True, True, 0)),
                                              (ONE_TASK, MicroKernel(2, 32, 16, 1, False, True, 0))],
                         ids=lambda value: getattr(value, "name", None))
@pytest.mark.parametrize("static", [False, True], ids=["symbolic", "static"])
def test_prefetching_kernels_compute_the_layer(workload, kernel, static):
    rng = np.random.default_rng(7)
    template = templates.for_workload(workload)
    symbolic = None if static else measure.compile_kernel(workload, kernel, HW)
    for m in sorted({1, 7, 13, 97, workload.m.hi} & set(range(1, workload.m.hi + 1))):
        dims = workload.dims_at((m,))
        executable = measure.compile_kernel(workload, kernel, HW, dims) if static else symbolic
        operands = template.random_operands(workload, dims, rng)
        arguments = template.kernel_arguments(operands, workload, kernel)
        measure.run(executable, arguments)
        np.testing.assert_allclose(arguments[-1].numpy(), template.reference_output(operands, workload),
                                   rtol=2e-4, atol=2e-4, err_msg=f"M={m}")
