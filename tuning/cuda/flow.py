"""The CUDA tuning flow: build a kernel set here, time it once on the GPU, replay the search
over that record here, and bundle the dispatch trees it fits.

The GPU is lent to few sessions and has no TVM, so the search cannot measure
candidates there as it goes. Instead every kernel of the (finite) space is
measured once at a plan's sequence lengths (bench/cuda_kernels.py runs a set on
the GPU); the joint search is then replayed against those measurements (a
candidate's "measurement" is the recorded one: recorded.RecordedRunner).
"""

import dataclasses
import json
import pathlib
import random
from collections.abc import Callable

from tf_dietcode.tuning import cost_model, dispatch, search
from tf_dietcode.tuning.cuda import build, limits, space
from tf_dietcode.tuning.cuda.recorded import RecordedRunner, shape_of
from tf_dietcode.tuning.cuda.target import GpuTarget
from tf_dietcode.tuning.workload import Workload

FINALISTS = 4  # kernels per sample T that go on to be measured at every T
STATIC_SAMPLE = 8  # kernels per workload also built for each static shape (symbolic vs static)


@dataclasses.dataclass(frozen=True)
class Plan:
    """What a GPU run measures: each workload by label, with the dims that vary with the
    sequence length T (T -> {dim: size}), and at which T."""

    workloads: dict[str, tuple[Workload, Callable[[int], dict[str, int]]]]
    lengths: tuple[int, ...]  # the search's sample T: the whole space is measured at these
    every_t: range  # a bundle is checked and timed at every T of its range, and one past it


def shapes(workload: Workload, sizes: Callable[[int], dict[str, int]], lengths) -> list[dict]:
    """The dims at each sequence length, labelled with it."""
    return [{"t": t, **{d: getattr(workload, d).lo for d in "bmnk"}, **sizes(t)} for t in lengths]


def build_set(plan: Plan, directory: pathlib.Path, seed: int = 0,
              chosen: dict[str, set[space.GpuKernel]] | None = None, whole_space: bool = True,
              finalists_of: pathlib.Path | None = None) -> dict:
    """Every kernel of each workload's space, symbolic, with static builds at every T of
    STATIC_SAMPLE random kernels plus `chosen` (by label: the kernels an earlier dispatch
    chose, whose symbolic cost matters). whole_space=False: only those chosen kernels,
    symbolic and static (a set to time interleaved in rounds). `finalists_of` (a GPU run
    of the whole space): the replayed search's finalists, symbolic, to be measured at
    every T of the range."""
    gpu = limits.common(build.ARCHS)
    chosen = chosen or {}
    results = replay(plan, finalists_of, search.SearchOptions.trials, seed)[2] if finalists_of is not None else {}
    entries, shape_lists = [], {}
    for label, (workload, sizes) in plan.workloads.items():
        kernels = space.space(gpu, workload)
        at = shapes(workload, sizes, plan.lengths)
        statics = set(chosen.get(label, ()))
        if finalists_of is not None:
            kernels, statics, at = finalists(results[label]), set(), shapes(workload, sizes, plan.every_t[:-1])
        elif whole_space:
            statics |= set(random.Random(seed).sample(kernels, STATIC_SAMPLE))
        else:
            kernels = sorted(statics)
        entries.append((workload, [(k, None) for k in kernels] +
                        [(k, {d: s[d] for d in "bmnk"}) for k in sorted(statics) for s in at]))
        shape_lists[workload.key()] = at
    return build.build(entries, shape_lists, directory, archs=("sm_90",), ptx=False)


def replay(plan: Plan, run: pathlib.Path, trials: int, seed: int, stages: tuple[int, ...] = space.STAGES
           ) -> tuple[GpuTarget, RecordedRunner, dict]:
    """The joint search of each workload (`trials` kernels of its space, the kernels of these
    pipeline depths) replayed over a GPU run's record at the plan's T: (the GPU, the record,
    {label: its SearchResult})."""
    device = json.loads((run / "device.json").read_text())
    target = GpuTarget(limits.ARCHS[f"sm_{device['capability'].replace('.', '')}"], device["sms"], stages)
    runner = RecordedRunner.load([w for w, _ in plan.workloads.values()], run / "measurements.csv")
    results = {}
    for label, (workload, sizes) in plan.workloads.items():
        sample = [shape_of(workload, dims) for dims in shapes(workload, sizes, plan.lengths)]
        results[label] = search.search(workload, target, runner, search.SearchOptions(trials=trials, seed=seed),
                                       shapes=sample, progress=False)
    return target, runner, results


def finalists(result: search.SearchResult) -> list[space.GpuKernel]:
    """The FINALISTS fastest kernels the search measured at each of its sample shapes."""
    picked = set()
    for shape in result.sample_shapes:
        timed = sorted((m.seconds, m.kernel) for m in result.measurements if m.shape == shape and m.seconds)
        picked |= {kernel for _, kernel in timed[:FINALISTS]}
    return sorted(picked)


def every_t_dispatches(plan: Plan, first_run: pathlib.Path, finalists_run: pathlib.Path, trials: int, seed: int,
                       stages: tuple[int, ...] = space.STAGES) -> list:
    """Per workload, a tree fit to the finalists' record at every T of the range (the
    search's picks over the kernels of these pipeline depths, measured at every shape,
    not only its samples)."""
    target, _, results = replay(plan, first_run, trials, seed, stages)
    runner = RecordedRunner.load([w for w, _ in plan.workloads.values()], finalists_run / "measurements.csv")
    chosen = []
    for label, (workload, sizes) in plan.workloads.items():
        every = [shape_of(workload, dims) for dims in shapes(workload, sizes, plan.every_t[:-1])]
        measured = runner.run(workload, finalists(results[label]), every)
        model = cost_model.CostModel(workload, target, seed).fit(measured)
        chosen.append(dispatch.build_dispatch(search.SearchResult(workload, every, measured, model)))
    return chosen


def write_bundle(plan: Plan, run: pathlib.Path, directory: pathlib.Path, trials: int, seed: int,
                 finalists_run: pathlib.Path | None = None, stages: tuple[int, ...] = space.STAGES) -> dict:
    """A CUDA bundle of the replayed trees (over the kernels of these pipeline depths) and
    their kernels (with `finalists_run`: of the trees fit at every T, every_t_dispatches),
    listing every T of plan.every_t (its last: past every range, so cuBLAS alone) for
    bench/cuda_kernels.py to check and time."""
    if finalists_run is None:
        chosen = [dispatch.build_dispatch(result) for result in replay(plan, run, trials, seed, stages)[2].values()]
    else:
        chosen = every_t_dispatches(plan, run, finalists_run, trials, seed, stages)
    every = {workload.key(): shapes(workload, sizes, plan.every_t) for workload, sizes in plan.workloads.values()}
    return build.write_bundle(chosen, directory, every)
