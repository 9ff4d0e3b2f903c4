"""The DietCode tuner's pieces: cost model, occupancy fit, search, dispatch
(tree and its C form), database, runner failures, and a checked bundle."""

import collections
import ctypes
import dataclasses
import gc
import hashlib
import json
import math
import subprocess
import sys
import time

import numpy as np
import pytest
import tvm

from tf_dietcode.tuning import bundle, cost_model, dispatch, hardware, measure, search, templates
from tf_dietcode.tuning.database import Database
from tf_dietcode.tuning.hardware import Hardware
from tf_dietcode.tuning.kernel_objects import KernelObjects
from tf_dietcode.tuning.measure import Measurement
from tf_dietcode.tuning.progress import TuningProgress
from tf_dietcode.tuning import micro_kernel
from tf_dietcode.tuning.micro_kernel import MicroKernel
from tf_dietcode.tuning.runner import LocalRunner
from tf_dietcode.tuning.tune import tune
from tf_dietcode.tuning.workload import Workload

HW = Hardware("test", ("avx", "avx2", "fma"), 8, 16, 32 << 10, 512 << 10, 4)
WORKLOAD = Workload("dense", (1, 100), 64, 32)


def synthetic_seconds(kernel, shape, k_true=0.6, workload=WORKLOAD, hw=HW):
    """A machine whose kernels follow the cost formula exactly."""
    mk = 10.0 + kernel.tile_m * kernel.tile_n / 8 + (5.0 if kernel.k_outer else 0.0)
    gflops = mk * cost_model.shape_factor(workload, kernel, shape, hw, k_true)
    return workload.flops(workload.dims_at(shape)) / (gflops * 1e9)


class FormulaRunner:
    """Runner stand-in: 'measures' synthetic_seconds, so search logic is tested without timing noise."""

    def __init__(self):
        self.measured = []

    def run(self, workload, kernels, ms, seed=0, best=None):
        self.measured.extend(kernels)
        return [Measurement(k, s, synthetic_seconds(k, s, workload=workload)) for k in kernels for s in ms]


def test_occupancy_and_padding_factors():
    kernel = MicroKernel(tile_m=4, tile_n=16, tile_k=32, task_n=2, k_outer=True)
    dims = WORKLOAD.dims_at((9,))
    assert HW.task_count(WORKLOAD, kernel, dims) == 3 * 2   # 3 row tiles x 64/(16*2) column tasks
    assert cost_model.f_occ(6, 4, 1.0) == pytest.approx(6 / 8)
    assert cost_model.f_occ(6, 4, 0.0) == 1.0
    assert cost_model.f_occ(8, 4, 0.7) == pytest.approx(1.0)
    assert cost_model.f_pad(WORKLOAD, kernel, dims, HW) == pytest.approx(9 * 64 / (12 * 64))
    attention = Workload("batch_matmul", (1, 128), (1, 128), 64, b=192, ties=("m", "n"))
    dims = attention.dims_at((17,))
    assert (dims["m"], dims["n"], dims["b"], dims["k"]) == (17, 17, 192, 64)
    assert HW.task_count(attention, kernel, dims) == 192 * 1  # 17 columns fit one 32-wide task
    assert cost_model.f_pad(attention, kernel, dims, HW) == pytest.approx(17 * 17 / (20 * 32))


def test_occupancy_coefficient_is_learned_from_measurements():
    # Row-and-column tasks, whose count (and so occupancy) changes with M; a kernel
    # whose tasks split N only has the same occupancy at every M.
    kernels = [k for k in micro_kernel.space(HW, WORKLOAD) if k.task_m][:12]
    records = [Measurement(k, (m,), synthetic_seconds(k, (m,), k_true=0.6)) for k in kernels
               for m in (1, 3, 7, 20, 61, 100)]
    assert cost_model.fit_occupancy(records, WORKLOAD, HW) == pytest.approx(0.6)


def test_model_predicts_held_out_shapes_of_measured_kernels():
    kernels = micro_kernel.space(HW, WORKLOAD)[::7]
    records = [Measurement(k, (m,), synthetic_seconds(k, (m,))) for k in kernels for m in (1, 10, 100)]
    model = cost_model.CostModel(WORKLOAD, HW).fit(records)
    predicted = model.predict(kernels, [(37,)])[:, 0]
    actual = np.array([WORKLOAD.flops(WORKLOAD.dims_at((37,))) / synthetic_seconds(k, (37,)) / 1e9
                       for k in kernels])
    assert np.abs(np.log(predicted / actual)).max() < 0.15


def test_search_finds_the_best_kernel_of_a_formula_machine_within_budget():
    runner = FormulaRunner()
    options = search.SearchOptions(trials=40, batch=8, population=64, samples=4, seed=3)
    result = search.search(WORKLOAD, HW, runner, options, progress=False)
    space = micro_kernel.space(HW, WORKLOAD)
    assert len(set(runner.measured)) == 40 < len(space)
    shapes = result.sample_shapes

    def score(k):
        return sum(math.log(WORKLOAD.flops(WORKLOAD.dims_at(s)) / synthetic_seconds(k, s)) for s in shapes)

    best_found = max(score(k) for k in runner.measured)
    ranked = sorted((score(k) for k in space), reverse=True)
    assert best_found >= ranked[len(space) // 20]  # in the top 5% of the whole space


def test_first_batch_spreads_over_register_heavy_kernels():
    """Before any measurement, the batch covers the space's extremes (both loop orders and
    weight layouts, small and large tiles) among tiles that keep half the registers accumulating."""
    runner = FormulaRunner()
    workload = Workload("dense", (1, 100), 768, 3072)
    search.search(workload, HW, runner, search.SearchOptions(trials=6, batch=6, seed=5), progress=False)
    assert len(set(runner.measured)) == 6
    assert all(micro_kernel.accumulator_share(k, HW) >= 0.5 for k in runner.measured)
    for field in ("k_outer", "packed", "tile_m", "tile_n", "tile_k", "task_n"):
        assert len({getattr(k, field) for k in runner.measured}) >= 2, field


def test_search_is_reproducible_and_resumes_from_the_database(tmp_path):
    options = search.SearchOptions(trials=16, batch=4, population=32, samples=3, seed=11)
    first, second = FormulaRunner(), FormulaRunner()
    search.search(WORKLOAD, HW, first, options, Database(tmp_path / "a.jsonl"), progress=False)
    search.search(WORKLOAD, HW, second, options, Database(tmp_path / "b.jsonl"), progress=False)
    assert first.measured == second.measured
    resumed = FormulaRunner()
    search.search(WORKLOAD, HW, resumed, options, Database(tmp_path / "a.jsonl"), progress=False)
    assert resumed.measured == []  # everything was already in the database


def test_one_progress_display_over_a_job_names_each_workload_and_what_it_measured(tmp_path, capsys):
    """Two searches of one job share a display (workload k of n and its name); each workload's
    kernels measured in the job are recorded: none for one the database already holds."""
    options = search.SearchOptions(trials=8, batch=4, population=32, samples=3, finalists=2, seed=5)
    other = Workload("dense", (1, 100), 32, 64)
    database = Database(tmp_path / "db.jsonl")
    search.search(WORKLOAD, HW, FormulaRunner(), options, database, progress=False)  # tuned before
    display = TuningProgress(2, options.trials + options.finalists)
    runner = FormulaRunner()
    for workload in (WORKLOAD, other):
        search.search(workload, HW, runner, options, database, display)
    display.close()
    assert display.times[WORKLOAD].kernels_measured == 0
    assert display.times[other].kernels_measured == len(runner.measured) == options.trials + options.finalists
    shown = capsys.readouterr().err
    assert f"workload 1/2 {WORKLOAD.describe()}" in shown and f"workload 2/2 {other.describe()}" in shown


def test_search_ignores_records_of_kernels_its_space_no_longer_holds(tmp_path):
    """A database written before the space shrank (templates' code unchanged) keeps records of
    kernels the search would no longer try; they neither fill its budget nor win a shape."""
    options = search.SearchOptions(trials=4, batch=4, samples=3, finalists=0)
    database = Database(tmp_path / "db.jsonl")
    outsider = MicroKernel(3, 8, 999, 1, True)
    assert outsider not in micro_kernel.space(HW, WORKLOAD)
    database.add(WORKLOAD, HW.name, [Measurement(outsider, shape, 1e-9)
                                     for shape in search.sample_shapes(WORKLOAD, options.samples)])
    runner = FormulaRunner()
    result = search.search(WORKLOAD, HW, runner, options, database, progress=False)
    assert len(runner.measured) == 4 and outsider not in {r.kernel for r in result.measurements}


class LevelRunner(FormulaRunner):
    """'Measures' synthetic_seconds at a level that changes from batch to batch (a shared machine's moments)."""

    def __init__(self, levels):
        super().__init__()
        self.levels, self.calls, self.records = iter(levels), [], []

    def run(self, workload, kernels, ms, seed=0, best=None):
        level = next(self.levels, 1.0)
        self.calls.append(list(kernels))
        records = [dataclasses.replace(r, seconds=r.seconds * level) for r in super().run(workload, kernels, ms)]
        self.records += records
        return records


def test_finalists_are_measured_again_together_and_replace_their_first_records(tmp_path):
    """Once the budget is spent, each sample shape's fastest kernels (then the second fastest,
    and so on) are measured again in one batch, at the sample shapes and between them, and those
    records are the ones that count, in the result and in the database; a resumed search
    measures nothing, finalists included."""
    options = search.SearchOptions(trials=16, batch=4, population=32, samples=3, finalists=5, seed=7)
    runner = LevelRunner([0.5, 1.3, 0.8, 1.1])  # four batches at their moments, then the finalists at 1.0
    database = Database(tmp_path / "db.jsonl")
    result = search.search(WORKLOAD, HW, runner, options, database, progress=False)
    finalists = runner.calls[-1]
    assert len(runner.calls) == 5 and len(finalists) == 5 == len(set(finalists))
    between = search.between_shapes(result.sample_shapes)
    assert result.sample_shapes == [(1,), (10,), (100,)] and between == [(3,), (32,)]
    first = runner.records[:-5 * (len(result.sample_shapes) + len(between))]
    for shape in result.sample_shapes:
        assert min((r for r in first if r.shape == shape), key=lambda r: r.seconds).kernel in finalists
    kept = {(r.kernel, r.shape): r.seconds for r in result.measurements}
    assert len(kept) == len(result.measurements) == 16 * len(result.sample_shapes) + 5 * len(between)
    for kernel in finalists:
        for shape in result.sample_shapes + between:
            assert kept[kernel, shape] == synthetic_seconds(kernel, shape, workload=WORKLOAD)
    assert set(Database(tmp_path / "db.jsonl").measurements(WORKLOAD, HW.mcpu)) == set(result.measurements)
    resumed = LevelRunner([])
    search.search(WORKLOAD, HW, resumed, options, Database(tmp_path / "db.jsonl"), progress=False)
    assert resumed.calls == []


def test_a_kernel_timed_again_counts_by_its_later_timing(tmp_path):
    """The database keeps every record but answers with the latest of each (kernel, shape), both
    for the workload's own search and for similar workloads' seeds."""
    database = Database(tmp_path / "db.jsonl")
    fast, slow = MicroKernel(2, 8, 32, 1, True), MicroKernel(4, 8, 32, 1, False)
    database.add(WORKLOAD, HW.mcpu, [Measurement(fast, (9,), 1e-3), Measurement(slow, (9,), 2e-3)])
    database.add(WORKLOAD, HW.mcpu, [Measurement(fast, (9,), 3e-3)])  # timed again beside its rival
    reopened = Database(tmp_path / "db.jsonl")
    assert {m.kernel: m.seconds for m in reopened.measurements(WORKLOAD, HW.mcpu)} == {fast: 3e-3, slow: 2e-3}
    assert len(reopened.measurements(WORKLOAD, HW.mcpu)) == 2
    assert reopened.best_kernels_elsewhere(Workload("dense", (1, 100), 96, 32), HW.mcpu, 1) == [slow]


def test_similar_workloads_kernels_rank_by_the_shapes_all_were_measured_at(tmp_path):
    """A finalist's records between the sample shapes do not count in its ranking as a seed."""
    database = Database(tmp_path / "db.jsonl")
    a, b, c = MicroKernel(2, 8, 32, 1, True), MicroKernel(4, 8, 32, 1, False), MicroKernel(1, 8, 32, 1, True)
    database.add(WORKLOAD, HW.mcpu, [Measurement(k, (m,), seconds) for k, seconds in ((a, 1e-3), (b, 1.1e-3), (c, 2e-3))
                                     for m in (1, 10, 100)] + [Measurement(b, (32,), 1e-6)])
    assert database.best_kernels_elsewhere(Workload("dense", (1, 100), 96, 32), HW.mcpu, 1) == [a]


def test_first_batch_starts_from_similar_workloads_best_kernels(tmp_path):
    """A workload tuned after a similar one (same kind and layout, other N/K) measures
    that one's best kernels first; with no similar workload it starts from the spread."""
    options = search.SearchOptions(trials=8, batch=8, population=32, samples=3, finalists=0, seed=2)
    database = Database(tmp_path / "db.jsonl")
    search.search(WORKLOAD, HW, FormulaRunner(), options, database, progress=False)
    best = database.best_kernels_elsewhere(Workload("dense", (1, 100), 128, 32), HW.mcpu, 2)
    formula = {k: -sum(math.log(synthetic_seconds(k, s)) for s in search.sample_shapes(WORKLOAD, 3))
               for k in {r.kernel for r in database.measurements(WORKLOAD, HW.mcpu)}}
    assert [formula[k] for k in best] == sorted(formula.values(), reverse=True)[:2]
    similar, runner = Workload("dense", (1, 100), 128, 32, bias=True), FormulaRunner()  # N: its space holds both
    search.search(similar, HW, runner, options, database, progress=False)
    assert runner.measured[:2] == best
    other_kind = Workload("batch_matmul", (1, 100), 64, 32, b=4)
    assert database.best_kernels_elsewhere(other_kind, HW.mcpu, 2) == []


def test_dispatch_tree_and_its_c_form_agree_for_every_m(tmp_path):
    result = search.search(WORKLOAD, HW, FormulaRunner(), search.SearchOptions(trials=24, seed=5), progress=False)
    chosen = dispatch.build_dispatch(result)
    assert len({tuple(templates.dense.weight_layout(WORKLOAD, k).items()) for k in chosen.kernels}) == 1
    source = tmp_path / "dispatch.c"
    source.write_text("#include <stdint.h>\n" + chosen.c_source("pick"))
    library = tmp_path / "dispatch.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-O2", str(source), "-o", str(library)], check=True)
    pick = ctypes.CDLL(str(library)).pick
    pick.restype, pick.argtypes = ctypes.c_int64, [ctypes.c_int64] * 4
    for m in range(-1, WORKLOAD.m.hi + 3):
        dims = WORKLOAD.dims_at((m,))
        assert pick(1, m, 64, 32) == chosen.kernel_index(dims)
        assert (chosen.kernel_index(dims) == -1) == (not 1 <= m <= 100)
    assert pick(1, 50, 65, 32) == -1  # a static dim that differs is outside the workload


def test_dispatch_between_samples_follows_the_finalists_timed_there():
    """A kernel fastest at the sample shapes but 3x slower between two of them (at M = 25-40, as a
    kernel whose blocking outgrows a cache can be) gives those M up: the finalists are timed between
    the samples too, and the votes there follow those timings."""
    options = search.SearchOptions(trials=24, samples=3, finalists=4, seed=5)
    plain_search = search.search(WORKLOAD, HW, FormulaRunner(), options, progress=False)
    plain = dispatch.build_dispatch(plain_search)
    fastest = plain.kernels[plain.kernel_index(WORKLOAD.dims_at((32,)))]
    # The premise: it was timed at M = 32. The formula machine times some kernels exactly alike
    # (packed or not); a twin not timed there, chosen in its place, would never meet the dip.
    assert any(r.kernel == fastest for r in plain_search.measurements if r.shape == (32,))

    class DipRunner(FormulaRunner):
        def run(self, workload, kernels, ms, seed=0, best=None):
            return [dataclasses.replace(r, seconds=r.seconds * 3) if r.kernel == fastest and 25 <= r.shape[0] <= 40
                    else r for r in super().run(workload, kernels, ms)]

    dipped = dispatch.build_dispatch(search.search(WORKLOAD, HW, DipRunner(), options, progress=False))
    assert dipped.kernels[dipped.kernel_index(WORKLOAD.dims_at((32,)))] != fastest
    assert dipped.kernels[dipped.kernel_index(WORKLOAD.dims_at((100,)))] == plain.kernels[
        plain.kernel_index(WORKLOAD.dims_at((100,)))]
    assert search.between_shapes([(1,), (10,), (100,)]) == [(3,), (32,)]  # timed at M = 32


def test_votes_choose_among_the_finalists_where_they_were_timed_again():
    """Every kernel runs 1.5x slower than the formula at M = 25-40 (a cache edge, say). The
    finalists, timed between the samples, show it at M = 32; the other kernels reach M = 32 only by
    interpolating their errors at M = 10 and 100, as if they ran at the formula's speed there, so
    they would win M = 32 on no measurement. Where finalists were timed again, only they are chosen;
    with no finalists (quick searches), every kernel that ran is."""
    class EdgeRunner(FormulaRunner):
        def run(self, workload, kernels, ms, seed=0, best=None):
            return [dataclasses.replace(r, seconds=r.seconds * 1.5) if 25 <= r.shape[0] <= 40 else r
                    for r in super().run(workload, kernels, ms)]

    options = search.SearchOptions(trials=24, samples=3, finalists=4, seed=5)
    result = search.search(WORKLOAD, HW, EdgeRunner(), options, progress=False)
    finalists = {r.kernel for r in result.measurements if r.shape == (32,)}
    assert len(finalists) == 4 < len({r.kernel for r in result.measurements})
    assert dispatch.candidates(result) == sorted(finalists)
    chosen = dispatch.build_dispatch(result)
    assert set(chosen.kernels) <= finalists
    assert chosen.kernels[chosen.kernel_index(WORKLOAD.dims_at((32,)))] in finalists
    quick = search.search(WORKLOAD, HW, EdgeRunner(), dataclasses.replace(options, finalists=0), progress=False)
    assert dispatch.candidates(quick) == sorted({r.kernel for r in quick.measurements})


def test_a_variable_with_nothing_between_its_samples_keeps_them_in_the_shapes_between():
    """Two shape variables, one ranging over 1-2: the other's midpoints at each of its values."""
    assert search.between_shapes([(m, b) for m in (1, 10, 100) for b in (1, 2)]) == [
        (3, 1), (3, 2), (32, 1), (32, 2)]
    assert search.between_shapes([(1, 1), (2, 1)]) == []


def test_dispatch_prefers_small_row_tiles_for_small_m():
    kernels = [MicroKernel(1, 16, 32, 1, True), MicroKernel(8, 16, 32, 1, True)]
    shapes = [(1,), (2,), (50,), (100,)]
    records = [Measurement(k, s, synthetic_seconds(k, s, k_true=1.0)) for k in kernels for s in shapes]
    model = cost_model.CostModel(WORKLOAD, HW)
    model.k = 1.0
    result = search.SearchResult(WORKLOAD, shapes, records, model)
    chosen = dispatch.build_dispatch(result)
    assert chosen.kernels[chosen.kernel_index(WORKLOAD.dims_at((1,)))].tile_m == 1
    assert chosen.kernels[chosen.kernel_index(WORKLOAD.dims_at((96,)))].tile_m == 8


def test_dispatch_follows_measurements_where_the_formula_is_off():
    """At M=1 a product is memory-bound: every tile streams the weight at the same speed, which
    the formula reads as a tall tile's padding hiding a fast kernel. The votes must still pick
    the kernel measured fastest at large M, and reproduce every measurement."""
    short, tall = MicroKernel(1, 16, 32, 1, True), MicroKernel(8, 16, 32, 1, True)
    measured = {short: {1: 5.0, 10: 40.0, 100: 60.0}, tall: {1: 5.0, 10: 30.0, 100: 50.0}}  # GFLOP/s
    records = [Measurement(k, (m,), WORKLOAD.flops(WORKLOAD.dims_at((m,))) / (g * 1e9))
               for k, by_m in measured.items() for m, g in by_m.items()]
    model = cost_model.CostModel(WORKLOAD, HW)
    model.k = 0.0
    kernels, shapes = [short, tall], [(1,), (10,), (31,), (100,)]
    assert cost_model.kernel_throughputs(records, model)[tall] > cost_model.kernel_throughputs(records, model)[short]
    gflops = cost_model.calibrated_gflops(records, model, kernels, shapes)
    np.testing.assert_allclose(gflops[:, [0, 1, 3]], [[5, 40, 60], [5, 30, 50]], rtol=1e-9)
    assert gflops[0, 2] > gflops[1, 2]
    chosen = dispatch.build_dispatch(search.SearchResult(WORKLOAD, [(1,), (10,), (100,)], records, model))
    assert [chosen.kernels[chosen.kernel_index(WORKLOAD.dims_at((m,)))] for m in (10, 100)] == [short, short]


def votes_measured_everywhere(winner_at) -> dispatch.Dispatch:
    """The dispatch of kernels measured at every M (so votes are the measurements):
    winner_at(m) runs at 20 GFLOP/s there, every other kernel at 10."""
    kernels = sorted({winner_at(m) for m in range(1, WORKLOAD.m.hi + 1)})
    shapes = [(m,) for m in range(1, WORKLOAD.m.hi + 1)]
    records = [Measurement(k, s, WORKLOAD.flops(WORKLOAD.dims_at(s)) / ((20.0 if winner_at(s[0]) == k else 10.0) * 1e9))
               for k in kernels for s in shapes]
    model = cost_model.CostModel(WORKLOAD, HW)
    model.k = 0.0
    return dispatch.build_dispatch(search.SearchResult(WORKLOAD, shapes, records, model))


def test_dispatch_tree_keeps_small_shapes_when_leaves_run_short():
    """More winning regions than the tree has leaves: it merges regions at large M,
    where each is one of many sizes, not M = 1..2, whose kernel a per-shape count
    would give up first (its region is the smallest)."""
    small = MicroKernel(1, 16, 8, 1, True, packed=True)
    others = [MicroKernel(m, 16, k, 1, True, packed=True) for m in range(2, 9) for k in (8, 16, 32, 64, 128)]
    chosen = votes_measured_everywhere(lambda m: small if m <= 2 else others[(m - 3) // 3])
    assert len({(m - 3) // 3 for m in range(3, WORKLOAD.m.hi + 1)}) + 1 > dispatch.MAX_LEAVES
    assert [chosen.kernels[chosen.kernel_index(WORKLOAD.dims_at((m,)))] for m in (1, 2)] == [small, small]


def test_the_weight_layout_is_chosen_with_every_doubling_weighed_alike():
    """Layout A's kernel is 4x as fast at M <= 10, layout B's 1.1x as fast above: by total
    time, or with every size counted once, the many large sizes would pick B; with every
    doubling weighed alike, as the tree weighs shapes, A wins."""
    a, b = MicroKernel(1, 16, 32, 1, True, packed=True), MicroKernel(1, 32, 32, 1, True, packed=True)
    assert templates.dense.weight_layout(WORKLOAD, a) != templates.dense.weight_layout(WORKLOAD, b)
    shapes = [(m,) for m in range(1, WORKLOAD.m.hi + 1)]
    gflops = {a: lambda m: 40.0 if m <= 10 else 10.0, b: lambda m: 10.0 if m <= 10 else 11.0}
    records = [Measurement(k, s, WORKLOAD.flops(WORKLOAD.dims_at(s)) / (gflops[k](s[0]) * 1e9))
               for k in (a, b) for s in shapes]
    total = {k: sum(WORKLOAD.flops(WORKLOAD.dims_at(s)) / gflops[k](s[0]) for s in shapes) for k in (a, b)}
    per_size = {k: sum(1 / gflops[k](s[0]) for s in shapes) for k in (a, b)}
    assert total[b] < total[a] and per_size[b] < per_size[a]
    model = cost_model.CostModel(WORKLOAD, HW)
    model.k = 0.0
    chosen = dispatch.build_dispatch(search.SearchResult(WORKLOAD, shapes, records, model))
    assert chosen.kernels == [a]


def test_shape_weights_halve_with_each_doubling():
    np.testing.assert_allclose(dispatch.shape_weights([(1,), (2,), (4,)]), [1, 1 / 2, 1 / 4])
    np.testing.assert_allclose(dispatch.shape_weights([(3, 5), (2, 2)]), [1 / 15, 1 / 4])
    np.testing.assert_allclose(dispatch.shape_weights([(0, 5), (0, 1)]), [1 / 5, 1])  # empty products: finite


def test_database_survives_a_truncated_line(tmp_path):
    path = tmp_path / "db.jsonl"
    db = Database(path)
    kernel = MicroKernel(2, 8, 32, 1, False)
    db.add(WORKLOAD, "cpu", [Measurement(kernel, (5,), 1e-3), Measurement(kernel, (6,), None, "boom")])
    with open(path, "a") as f:
        f.write('{"workload": "cut sh')
    reloaded = Database(path)
    assert reloaded.measurements(WORKLOAD, "cpu") == db.measurements(WORKLOAD, "cpu")
    assert len(reloaded.measurements(WORKLOAD, "cpu")) == 2
    assert reloaded.measurements(WORKLOAD, "other cpu") == []


def test_database_ignores_measurements_of_older_templates(tmp_path):
    path = tmp_path / "db.jsonl"
    Database(path).add(WORKLOAD, "cpu", [Measurement(MicroKernel(2, 8, 32, 1, False), (5,), 1e-3)])
    lines = path.read_text().replace(f'"templates": {templates.TEMPLATES_VERSION}', '"templates": 1')
    path.write_text(lines)
    assert Database(path).measurements(WORKLOAD, "cpu") == []


def test_cold_weight_workloads_are_measured_and_kept_apart(tmp_path):
    """Timed cold (weight flushed before each run) or warm, a dense workload's records
    never mix: its key, its database records and the seeds drawn from it differ.
    Only a dense product has a static weight to keep cold."""
    cold = Workload("dense", (1, 100), 64, 32, cold_weight=True)
    assert cold.key() != WORKLOAD.key() and Workload.from_key(cold.key()) == cold
    kernels = [MicroKernel(2, 8, 32, 1, True, packed=True, task_m=0), MicroKernel(4, 8, 32, 1, False)]
    results = LocalRunner(hardware.detect()).run(cold, kernels, [(1,), (50,)])
    assert all(r.seconds and r.seconds > 0 and r.error is None for r in results)
    database = Database(tmp_path / "db.jsonl")
    database.add(cold, "cpu", results)
    assert database.measurements(WORKLOAD, "cpu") == [] and len(database.measurements(cold, "cpu")) == 4
    assert database.best_kernels_elsewhere(Workload("dense", (1, 100), 96, 32), "cpu", 2) == []
    assert set(database.best_kernels_elsewhere(Workload("dense", (1, 100), 96, 32, cold_weight=True),
                                               "cpu", 2)) == set(kernels)
    with pytest.raises(ValueError, match="no static weight"):
        Workload("batch_matmul", (1, 20), (1, 20), 8, b=2, cold_weight=True)


def test_grouped_workloads_have_their_own_key_and_fit_their_weight():
    """Layers side by side (groups > 1) are another workload; one layer keeps the key it had
    before groups existed, so older databases still match; groups that cannot be laid out
    are clear errors."""
    plain = Workload("dense", (1, 100), 96, 32, weight_layout="packed")
    grouped = dataclasses.replace(plain, groups=3)
    assert '"groups"' not in plain.key() and grouped.key() != plain.key()
    assert Workload.from_key(grouped.key()) == grouped and grouped.group_n == 32 and "groups=3" in grouped.describe()
    with pytest.raises(ValueError, match="divide N=96"):
        dataclasses.replace(plain, groups=5)
    with pytest.raises(ValueError, match="pre-packed"):
        Workload("dense", (1, 100), 96, 32, groups=3)
    with pytest.raises(ValueError, match="no groups"):
        Workload("batch_matmul", (1, 20), (1, 20), 8, b=2, groups=2)


def test_cold_timing_spends_its_runs_where_runs_are_short():
    """Short cold runs are noisy, so they get COLD_REPEATS; a long one is never
    run more often than fills COLD_SECONDS, and never less than asked."""
    assert measure.cold_repeats(5, 1e-4) == measure.COLD_REPEATS
    assert measure.cold_repeats(5, 0.0) == measure.COLD_REPEATS
    assert measure.cold_repeats(3, 0.2) == 3 and measure.cold_repeats(7, 0.2) == 7
    assert 3 < measure.cold_repeats(3, measure.COLD_SECONDS / 10) <= 10


class ProbedModule:
    """A module whose every timing reads `seconds` per run; counts the runs each timer timed."""

    def __init__(self, seconds: float):
        self.seconds, self.timers = seconds, []

    def __getitem__(self, name):
        return lambda *arguments: None

    def time_evaluator(self, name, device, number=1, repeat=1, min_repeat_ms=0, f_preproc=""):
        position = len(self.timers)
        self.timers.append(0)

        def timer(*arguments):
            self.timers[position] += repeat
            return type("Result", (), {"results": [self.seconds] * repeat, "mean": self.seconds})
        return timer


@pytest.mark.parametrize("workload", [WORKLOAD, Workload("dense", (1, 100), 64, 32, cold_weight=True)],
                         ids=["warm", "cold"])
def test_a_kernel_clearly_slower_than_the_best_is_probed_not_timed_in_full(rng, workload):
    """At a shape where the best time so far is under half a probe's, the probe is the record;
    elsewhere (no best yet, or a close one) the kernel is timed in full after its probe."""
    kernel = MicroKernel(2, 8, 32, 1, True)
    module = ProbedModule(0.010)
    records = measure.measure_modules([(kernel, module)], tvm.cpu(), workload, [(9,), (50,), (77,)], rng,
                                      best={(9,): 0.004, (50,): 0.006})
    assert [r.seconds for r in records] == [0.010] * 3
    # The fake runs take no time: a cold repeat is still a single run, and takes half the rounds.
    full = (measure.cold_repeats(5, 0.0) + 2) // 2 if workload.cold_weight else 5
    assert module.timers == [1, 1, full, full]  # (9,): probe only; (50,): probe, then in full; (77,): in full


def test_repeats_are_interleaved_across_kernels_and_shapes():
    """Each round times every (kernel, shape) pair once, so all of them see the machine's
    slow and fast seconds alike, in balanced orders (each pair first, last and right after each
    other pair alike); a pair that fails stops being timed and is recorded."""
    calls = []
    assert measure.interleaved(lambda i: calls.append(i) or float(i), [2, 3, 1]) == [[0.0, 0.0], [1.0] * 3, [2.0]]
    assert calls == [0, 1, 2] + [1, 0] + [1]  # rounds [0, 1, 2], [1, 2, 0], [2, 0, 1] without the pairs done
    for n in range(1, 8):
        rows = [measure.balanced_order(n, row) for row in range(n if n % 2 == 0 else 2 * n)]
        assert all(sorted(row) == list(range(n)) for row in rows)
        places = collections.Counter((i, place) for row in rows for place, i in enumerate(row))
        successors = collections.Counter(pair for row in rows for pair in zip(row, row[1:]))
        assert len(places) == n * n and len(set(places.values())) == 1
        assert len(successors) == n * (n - 1) and len(set(successors.values())) <= 1

    class FailingModule(ProbedModule):
        """Its second timer (the second shape's) fails at its second run."""

        def time_evaluator(self, *args, **kwargs):
            timer, position = super().time_evaluator(*args, **kwargs), len(self.timers)
            return lambda *arguments: 1 / 0 if position == 2 and self.timers[1] == 1 else timer(*arguments)

    good, bad = ProbedModule(0.001), FailingModule(0.002)
    kernels = [MicroKernel(2, 8, 32, 1, True), MicroKernel(4, 8, 32, 1, False)]
    steps = []
    records = measure.measure_modules(list(zip(kernels, [good, bad])), tvm.cpu(), WORKLOAD, [(3,), (8,)],
                                      np.random.default_rng(0), on_step=steps.append)
    assert [(r.kernel, r.shape, r.seconds) for r in records] == [
        (kernels[0], (3,), 0.001), (kernels[0], (8,), 0.001), (kernels[1], (3,), 0.002), (kernels[1], (8,), None)]
    assert "ZeroDivisionError" in records[3].error and good.timers == [5, 5] and bad.timers == [5, 1]
    # Warm-ups by shape, then rounds over the pairs (k0, 3), (k1, 3), (k0, 8), (k1, 8) in the orders
    # [0, 1, 3, 2], [1, 2, 0, 3], [2, 3, 1, 0], [3, 0, 2, 1], [0, 1, 3, 2], (k1, 8) dropped after it failed.
    assert steps == [0, 1, 0, 1] + [0, 1, 1, 0] + [1, 0, 0, 1] + [0, 1, 0] + [0, 0, 1] + [0, 1, 0]


def test_builds_of_one_kernel_run_on_the_same_tensors_and_other_kernels_on_their_own():
    """A kernel's symbolic and static builds (bench.studies.aot_pairs) are timed on one set of tensors at a
    shape, so where each build's arrays lie cannot tilt their ratio; another kernel gets its own."""

    class ArgumentsModule(ProbedModule):
        """Keeps, per timer (one per shape), the identities of every argument its calls passed."""

        def __init__(self):
            super().__init__(0.001)
            self.seen = []

        def time_evaluator(self, *args, **kwargs):
            timer, ids = super().time_evaluator(*args, **kwargs), set()
            self.seen.append(ids)
            return lambda *arguments: ids.update(map(id, arguments)) or timer(*arguments)

    kernel, other = MicroKernel(2, 8, 32, 1, True), MicroKernel(4, 8, 32, 1, False)
    symbolic, static, theirs = ArgumentsModule(), ArgumentsModule(), ArgumentsModule()
    measure.measure_modules([(kernel, symbolic), (kernel, static), (other, theirs)], tvm.cpu(), WORKLOAD,
                            [(3,), (8,)], np.random.default_rng(0))
    for shape in range(2):
        assert len(symbolic.seen[shape]) == 3 and symbolic.seen[shape] == static.seen[shape]  # x, weight, out
        assert not symbolic.seen[shape] & theirs.seen[shape]
    assert not symbolic.seen[0] & symbolic.seen[1]  # a new shape, new tensors


def test_work_in_threads_returns_each_result_or_error_in_order():
    def reciprocal(x):
        return 1 / x

    results = measure.in_threads(reciprocal, [4, 0, 2], 2)
    assert results[0] == 0.25 and isinstance(results[1], ZeroDivisionError) and results[2] == 0.5
    with pytest.raises(ZeroDivisionError):
        measure.in_threads(reciprocal, [4, 0, 2], 2, strict=True)


def test_a_hung_compile_is_the_kernel_the_worker_names_last():
    """The worker compiles kernels side by side; one that hangs ends up the only one named at work,
    so the runner, which stops a silent worker and blames the first kernel named, blames it."""
    from tf_dietcode.tuning import runner_worker

    def build(index):
        if index == 3:
            raise ValueError("no such tile")
        if index == 1:
            time.sleep(1.0)  # 'hangs' while the others compile
        return index

    named = []
    results = runner_worker.compile_all(5, build, 2, lambda record: named.append(record["busy"]))
    assert results[:3] == [0, 1, 2] and isinstance(results[3], ValueError) and results[4] == 4
    assert named[-1] == [1] and max(map(len, named)) == 2  # two at work at once


def test_runner_records_timeouts_instead_of_failing():
    hw = hardware.detect()
    kernels = [MicroKernel(2, 8, 32, 1, True), MicroKernel(4, 8, 32, 1, False)]
    results = LocalRunner(hw, timeout_s=0.01).run(WORKLOAD, kernels, [(1,), (50,)])
    assert len(results) == 4 and all(r.seconds is None and r.error for r in results)


def test_runner_keeps_its_worker_between_runs_and_replaces_a_hung_one():
    """One worker serves run after run; one that timed out is stopped, the next run starts
    another, and releasing the runner stops its worker."""
    runner = LocalRunner(hardware.detect())
    kernels = [MicroKernel(2, 8, 32, 1, True), MicroKernel(4, 8, 32, 1, False)]
    assert all(r.seconds for r in runner.run(WORKLOAD, kernels[:1], [(1,), (50,)]))
    worker = runner._worker
    assert all(r.seconds for r in runner.run(WORKLOAD, kernels[1:], [(7,)])) and runner._worker is worker
    runner.timeout_s = 0.01
    assert all(r.error == "timeout or crash" for r in runner.run(WORKLOAD, kernels, [(1,)]))
    assert runner._worker is None and worker.poll() is not None
    runner.timeout_s = 60.0
    assert all(r.seconds for r in runner.run(WORKLOAD, kernels, [(3,)]))
    worker = runner._worker
    del runner
    gc.collect()
    assert worker.poll() is not None


def test_the_measuring_worker_imports_the_installed_package_whatever_the_current_directory(tmp_path, monkeypatch):
    """Run from a source tree's root, whose tf_dietcode/ folder has no tuning/ (it installs from tuning/),
    the worker must not import that folder: a folder there that cannot be imported at all changes nothing."""
    (tmp_path / "tf_dietcode").mkdir()
    (tmp_path / "tf_dietcode" / "__init__.py").write_text("raise ImportError('the folder, not the package')\n")
    monkeypatch.chdir(tmp_path)
    results = LocalRunner(hardware.detect()).run(WORKLOAD, [MicroKernel(2, 8, 32, 1, True)], [(1,), (50,)])
    assert all(r.seconds for r in results), results


def test_a_workload_whose_kernels_all_failed_names_the_first_failure():
    kernels = [MicroKernel(2, 8, 32, 1, True), MicroKernel(4, 8, 32, 1, False)]
    failed = [Measurement.failed(k, (m,), RuntimeError(f"cannot build {k.name}")) for k in kernels for m in (1, 100)]
    result = search.SearchResult(WORKLOAD, [(1,), (100,)], failed, cost_model.CostModel(WORKLOAD, HW))
    with pytest.raises(RuntimeError, match=rf"ran successfully; the first failure, {kernels[0].name} at \(1,\): "
                                           rf"RuntimeError: cannot build {kernels[0].name}$"):
        dispatch.build_dispatch(result)


def test_quick_tune_writes_a_checked_bundle(tmp_path):
    workloads = [Workload("dense", (1, 40), 24, 16, bias=True, activation="gelu"),
                 Workload("batch_matmul", (1, 20), (1, 20), 8, b=2)]  # two independent shape variables
    report = tune(workloads, tmp_path / "bundle", options=search.SearchOptions(trials=4, batch=4, samples=3),
                  progress=False)
    manifest = json.loads((tmp_path / "bundle" / bundle.MANIFEST).read_text())
    assert manifest == report.manifest
    library = tmp_path / "bundle" / bundle.LIBRARY
    assert manifest["sha256"] == hashlib.sha256(library.read_bytes()).hexdigest()
    assert manifest["cpu_features"] == list(hardware.detect().features)
    assert [Workload.from_key(entry["key"]) for entry in manifest["workloads"]] == workloads
    assert "weight_layout" in manifest["workloads"][0] and "weight_layout" not in manifest["workloads"][1]
    module = tvm.runtime.load_module(str(library))
    for entry in manifest["workloads"]:
        assert entry["dispatch_arguments"] == ["b", "m", "n", "k"]
        for kernel in entry["kernels"]:
            assert module[kernel["symbol"]] is not None
    assert not any(p.name.startswith(".bundle-") for p in tmp_path.iterdir())  # no staging left
    assert sorted(p.name for p in (tmp_path / "bundle").iterdir()) == sorted([bundle.LIBRARY, bundle.MANIFEST])


def _counting_compiles(monkeypatch) -> list:
    """The kernels measure.compile_kernel compiles in this process from now on."""
    compiled, real = [], measure.compile_kernel
    monkeypatch.setattr(measure, "compile_kernel", lambda workload, kernel, *rest: compiled.append(kernel)
                        or real(workload, kernel, *rest))
    return compiled


def test_a_bundle_links_the_kernels_its_runner_compiled(tmp_path, monkeypatch):
    """The bundle links each kernel's kept object file, its function renamed: nothing is compiled
    again, and its check runs every kernel under its new name."""
    workload = Workload("batch_matmul", (1, 20), (1, 20), 8, b=2)
    kernels = micro_kernel.space(hardware.detect(), workload)[:3]
    shapes = workload.all_shapes()
    thirds = np.array([min(m // 7, 2) for m, _ in shapes])  # kernel i is the fastest in its third of M
    by_thirds = dispatch.fit_tree(workload, kernels, shapes, np.array([1.0 + (thirds == i) for i in range(3)]))
    samples = [(1, 1), (10, 5), (20, 20)]  # one in each third, so the bundle's check runs all three kernels
    assert sorted({by_thirds.kernel_index(workload.dims_at(s)) for s in samples}) == [0, 1, 2]
    objects = KernelObjects(tmp_path / "kernels")
    assert all(r.seconds for r in LocalRunner(hardware.detect(), objects=objects).run(workload, kernels, samples))
    compiled = _counting_compiles(monkeypatch)
    manifest = bundle.build_bundle([by_thirds], hardware.detect(), tmp_path / "bundle", [samples], objects=objects)
    assert compiled == []
    module = tvm.runtime.load_module(str(tmp_path / "bundle" / bundle.LIBRARY))
    assert len(manifest["workloads"][0]["kernels"]) == 3
    assert all(module[k["symbol"]] is not None for k in manifest["workloads"][0]["kernels"])


def test_a_resumed_tuning_compiles_nothing(tmp_path, monkeypatch):
    """A database with a file keeps its compiled kernels beside it: tuning again from it
    measures nothing (search.search resumes) and builds its bundle from them."""
    database = Database(tmp_path / "db.jsonl")
    assert database.kernel_objects().directory == tmp_path / "db.kernels"
    workload = Workload("dense", (1, 12), 16, 8, bias=True)
    options = search.SearchOptions(trials=2, batch=2, samples=2, finalists=0)
    first = tune([workload], tmp_path / "first", options=options, database=database, progress=False)
    assert len(list((tmp_path / "db.kernels").glob("*.o"))) == 2
    records = (tmp_path / "db.jsonl").read_text()
    compiled = _counting_compiles(monkeypatch)
    again = tune([workload], tmp_path / "again", options=options, database=Database(tmp_path / "db.jsonl"),
                 progress=False)
    assert (tmp_path / "db.jsonl").read_text() == records  # nothing measured again
    assert compiled == [] and [k["name"] for k in again.manifest["workloads"][0]["kernels"]] \
        == [k["name"] for k in first.manifest["workloads"][0]["kernels"]]


def test_a_damaged_kept_kernel_is_compiled_again(tmp_path, monkeypatch):
    """A kept kernel whose object file cannot be linked (cut short, say) is compiled again, once."""
    objects, hw = KernelObjects(tmp_path), hardware.detect()
    kernel = MicroKernel(2, 8, 32, 1, True)
    kept = objects.object_file(WORKLOAD, kernel, hw)
    kept.write_bytes(kept.read_bytes()[:100])
    compiled = _counting_compiles(monkeypatch)
    module = objects.load(WORKLOAD, kernel, hw)
    assert compiled == [kernel] and module["main"] is not None
    assert objects.load(WORKLOAD, kernel, hw)["main"] is not None and compiled == [kernel]
    assert [p.suffix for p in tmp_path.iterdir()] == [".o"]  # the libraries loaded are not kept
    kept.write_bytes(kept.read_bytes()[:100])
    copy = objects.renamed_object(WORKLOAD, kernel, hw, "renamed", tmp_path.parent / f"{tmp_path.name}-copy.o")
    assert compiled == [kernel, kernel] and b"__tvm_ffi_renamed" in copy.read_bytes()


def test_largest_shape_baseline_tunes_one_shape_and_serves_the_range():
    from bench import baselines

    runner = FormulaRunner()
    options = search.SearchOptions(trials=16, batch=8, seed=2)
    result, chosen = baselines.largest_shape(WORKLOAD, HW, runner, options, progress=False)
    assert result.sample_shapes == [(100,)]
    assert len(chosen.kernels) == 1
    fastest = min((r for r in result.measurements if r.seconds), key=lambda r: r.seconds)
    assert chosen.kernels[0] == fastest.kernel
    assert {chosen.kernel_index(WORKLOAD.dims_at((m,))) for m in range(1, 101)} == {0}
    assert chosen.kernel_index(WORKLOAD.dims_at((101,))) == -1


def test_per_shape_metaschedule_tunes_with_this_cpus_tensor_intrinsics_only(tmp_path):
    """MetaSchedule, its builder workers included, runs with only this CPU's tensor
    intrinsics parsed (the other targets' take ~40 s to parse): fresh interpreter, as
    the intrinsic registry is per process."""
    script = f"""
import sys
from bench import baselines
from tf_dietcode.tuning import hardware
from tf_dietcode.tuning.workload import Workload
workload = Workload("dense", (1, 8), 16, 8, bias=True)
executable, _ = baselines.per_shape_metaschedule(workload, hardware.detect(), workload.dims_at((5,)), 2,
                                                 {str(tmp_path)!r})
print(executable is not None and "tvm.s_tir.tensor_intrin.cuda" not in sys.modules)
"""
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split()[-1] == "True"


@pytest.fixture
def rpc_tracker():
    """A TVM RPC tracker with one CPU server behind it, on loopback only."""
    from tvm import rpc
    from tvm.rpc.tracker import Tracker

    tracker = Tracker(host="127.0.0.1", port=9190, port_end=9290, silent=True)
    server = rpc.Server(host="127.0.0.1", port=9300, port_end=9400, tracker_addr=("127.0.0.1", tracker.port),
                        key="test-cpu", silent=True)
    yield tracker
    server.terminate()
    tracker.terminate()


@pytest.mark.parametrize("workload", [Workload("batch_matmul", (1, 20), (1, 20), 8, b=2),
                                      Workload("dense", (1, 20), 24, 16, cold_weight=True)], ids=["bmm", "cold_dense"])
def test_rpc_runner_measures_through_a_tracker(rpc_tracker, workload, tmp_path, monkeypatch):
    from tf_dietcode.tuning.runner import RPCRunner

    runner = RPCRunner(hardware.detect(), "127.0.0.1", rpc_tracker.port, "test-cpu", repeats=2, min_repeat_ms=1,
                       objects=KernelObjects(tmp_path))
    compiled = _counting_compiles(monkeypatch)
    result = search.search(workload, hardware.detect(), runner, search.SearchOptions(trials=3, batch=3, samples=2),
                           progress=False)
    assert len(result.measurements) == 3 * len(result.sample_shapes + search.between_shapes(result.sample_shapes))
    assert all(r.seconds and r.seconds > 0 and r.error is None for r in result.measurements)
    assert len(compiled) == 3  # the three kernels, timed again as finalists, were compiled once


def test_plain_computations_match_the_references(rng):
    """The per-shape baseline tunes the same computation the templates compute."""
    from bench import baselines
    from tf_dietcode.tuning import templates

    for workload, shape in ((Workload("dense", (1, 9), 12, 8, bias=True, activation="gelu_tanh"), (5,)),
                            (Workload("batch_matmul", (1, 9), (1, 9), 4, b=2, ties=("m", "n")), (7,)),
                            (Workload("batch_matmul", (1, 9), (1, 9), 4, b=2, bias=True, ties=("m", "n")), (7,)),
                            (Workload("batch_matmul", (1, 9), 3, (1, 9), b=2, transpose_b=False), (6, 5))):
        dims = workload.dims_at(shape)
        template = templates.for_workload(workload)
        operands = template.random_operands(workload, dims, rng)
        expected = template.reference_output(operands, workload)
        sch = tvm.s_tir.Schedule(tvm.IRModule({"main": baselines.plain_prim_func(workload, dims)}))
        executable = tvm.compile(sch.mod, target=hardware.detect().target())
        arguments = baselines.plain_arguments(operands, workload, dims)
        executable.mod["main"](*arguments)
        np.testing.assert_allclose(arguments[-1].numpy(), expected, rtol=1e-4, atol=1e-4)
