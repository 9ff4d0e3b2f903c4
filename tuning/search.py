"""Joint evolutionary search: one cost model, all shapes, one shared space.

Each round, candidates bred from the best measured micro-kernels (mutation and
crossover inside the hardware-derived space) are ranked by the cost model over
every sample shape at once; the top ones, plus an epsilon share of random
picks, are measured for real at all sample shapes, and the model is refit on
everything measured so far. The first batch, before any model exists, starts
from the best kernels of similar workloads in the database (the layers of one
model tuned one after another find much the same tiles) and spreads the rest
over the space. Once the budget is spent, the finalists (the fastest kernels at
each sample shape) are measured again in one batch, and those records replace
their first ones: see _finalists.
"""

import dataclasses
import itertools
import math
import random

import numpy as np

from tf_dietcode.tuning.cost_model import CostModel, kernel_throughputs
from tf_dietcode.tuning.database import Database
from tf_dietcode.tuning.measure import Measurement, latest
from tf_dietcode.tuning.progress import TuningProgress, display_for
from tf_dietcode.tuning.workload import Workload


@dataclasses.dataclass(frozen=True)
class SearchOptions:
    trials: int = 64           # micro-kernels measured (each at every sample shape)
    batch: int = 8             # measured per round
    population: int = 128      # candidates bred per round
    epsilon: float = 0.2       # share of each batch picked at random
    samples: int = 6           # sample values per shape variable across its range
    finalists: int = 16        # fastest kernels (by rank at each sample shape) measured again, together
    seed: int = 0


# Why 16 finalists, not 8: first timings rank kernels by luck as much as by speed (finalists timed
# again read 0.65-1.49x their first records over the 10-90% ranges of the bench's four workloads in
# one default-budget tuning; Zen 3, 2 cores), and there dense batch 16's `m4_n24_k768_t1_ki_p`,
# the largest-shape baseline's pick, came twelfth. From that tuning's first records, the tree over
# 16 finalists ran 0.966x the time of the tree over 8 (geometric mean over the bench's ten T, paired
# rounds; 0.91-0.96x from T = 81) and 0.993x at dense batch 1, for about 20 s more per workload.


# QUICK measures no finalists again: its 12 kernels are two batches, and with 3 finalists
# the demo's optimize() took 106 s against 90, its kernels as fast (1.67-7.16 ms against
# 1.62-7.33 ms at T = 1-128; Zen 3, 2 cores).
QUICK = SearchOptions(trials=12, batch=6, population=64, samples=4, finalists=0)
BUDGETS = {"default": SearchOptions(), "quick": QUICK}  # optimize(tuning="quick"), keras.tune(tuning=...)
SEEDS_PER_WORKLOAD = 2  # best kernels of each similar workload already in the database, measured first


def budget(tuning: "SearchOptions | str | None") -> SearchOptions:
    """A tuning budget as given, by its name in BUDGETS, or the default (None)."""
    if tuning is None:
        return SearchOptions()
    if isinstance(tuning, str):
        if tuning not in BUDGETS:
            raise ValueError(f"unknown tuning budget {tuning!r}: give one of {sorted(BUDGETS)} or a SearchOptions")
        return BUDGETS[tuning]
    return tuning


@dataclasses.dataclass
class SearchResult:
    workload: Workload
    sample_shapes: list[tuple[int, ...]]
    measurements: list[Measurement]
    model: CostModel


def sample_shapes(workload: Workload, count: int) -> list[tuple[int, ...]]:
    """Per shape variable: its range ends plus points spread geometrically between
    them (small sizes matter); every combination across variables."""
    axes = []
    for _, size in workload.variables():
        lo, hi = max(size.lo, 1), size.hi
        points = np.geomspace(lo, hi, count) if count > 1 else [hi]
        axes.append(sorted({int(round(p)) for p in points} | {lo, hi}))
    return list(itertools.product(*axes))


def between_shapes(shapes: list[tuple[int, ...]]) -> list[tuple[int, ...]]:
    """Per shape variable, the geometric midpoint of each pair of consecutive sample values (those not
    sampled already), or its sample values where it has none between them (a range of 1-2); every
    combination across variables, so long as one variable has midpoints. The finalists are timed
    there too (search)."""
    axes, between = [], False
    for values in zip(*shapes):
        ordered = sorted(set(values))
        midpoints = {int(round(math.sqrt(max(a, 1) * b))) for a, b in zip(ordered, ordered[1:])} - set(ordered)
        axes.append(sorted(midpoints) or ordered)
        between = between or bool(midpoints)
    return list(itertools.product(*axes)) if between else []


def _neighbours(kernel, values: dict[str, list], rng: random.Random):
    """One parameter moved to an adjacent value of the space."""
    name = rng.choice(list(values))
    options = values[name]
    index = options.index(getattr(kernel, name))
    index = min(max(index + rng.choice((-1, 1)), 0), len(options) - 1)
    return dataclasses.replace(kernel, **{name: options[index]})


def _crossover(a, b, rng: random.Random):
    return type(a)(**{f.name: getattr(rng.choice((a, b)), f.name) for f in dataclasses.fields(a)})


def _breed(parents: list, space_set: set, values: dict, count: int, rng: random.Random) -> set:
    children = set()
    for _ in range(count * 20):
        if len(children) >= count:
            break
        child = _crossover(*rng.sample(parents, 2), rng) if len(parents) > 1 and rng.random() < 0.3 \
            else _neighbours(rng.choice(parents), values, rng)
        if child in space_set:
            children.add(child)
    return children


def search(workload: Workload, hw, runner, options: SearchOptions = SearchOptions(),
           database: Database | None = None, progress: bool | TuningProgress = True,
           shapes: list[tuple[int, ...]] | None = None) -> SearchResult:
    """Tunes one workload's micro-kernels jointly for its sample shapes (by default
    sample_shapes(workload, options.samples), which span the whole range). `hw`:
    the target (the CPU's Hardware, or a GpuTarget), which gives the space. `progress`:
    the display of the job this search is part of, or whether to show one of its own."""
    database = database or Database()
    rng = random.Random(options.seed)
    space_list = hw.space(workload)
    space_set = set(space_list)
    values = {f.name: sorted({getattr(k, f.name) for k in space_list}) for f in dataclasses.fields(hw.kernel_type)}
    shapes = shapes or sample_shapes(workload, options.samples)
    between = between_shapes(shapes)
    model = CostModel(workload, hw, options.seed)
    timed_at = {*shapes, *between}
    measurements = [r for r in database.measurements(workload, hw.name, hw.kernel_type)
                    if r.shape in timed_at and r.kernel in space_set]  # the space may have shrunk since
    measured = {r.kernel for r in measurements}
    model.fit(measurements)
    trials = min(options.trials, len(space_list))
    seeds = [k for k in database.best_kernels_elsewhere(workload, hw.name, SEEDS_PER_WORKLOAD, hw.kernel_type)
             if k in space_set]
    resumed = len(measured) >= trials  # its finalists were measured again when it was tuned
    finalists = 0 if resumed else options.finalists
    with display_for(progress, 1, options.trials + options.finalists) as display:
        display.start(workload, max(trials - len(measured), 0) + finalists)
        while len(measured) < trials:
            batch_size = min(options.batch, trials - len(measured))
            batch = _next_batch(model, measurements, space_list, space_set, values, measured, shapes,
                                batch_size, options, rng, seeds)
            results = runner.run(workload, batch, shapes, seed=options.seed, best=_fastest(measurements))
            database.add(workload, hw.name, results)
            measurements.extend(results)
            measured.update(batch)
            model.fit(measurements)
            display.measured(len(batch))
        if finalists:
            chosen = _finalists(measurements, shapes, finalists)
            display.status(f"timing {len(chosen)} finalists again")
            again = runner.run(workload, chosen, shapes + between, seed=options.seed)
            database.add(workload, hw.name, again)
            measurements = latest(measurements + again)
            model.fit(measurements)
            display.measured(len(chosen))
        display.finish()
    return SearchResult(workload, shapes, measurements, model)


def _finalists(measurements: list[Measurement], shapes: list[tuple[int, ...]], count: int) -> list:
    """Up to `count` kernels: each sample shape's fastest, then each one's second, and so on.

    Why measure them again: the runner interleaves the repeats of one batch's kernels, but
    kernels of different batches met the shared machine at different moments. In one dense batch 16
    tuning, the kernel dispatched for M >= 1296 had read 181.8 GFLOP/s at M = 2048 and one
    of the same weight layout 171.8, in other batches; timed together afterwards they ran
    at 152.5 and 171.7. Measured again in one batch, the finalists, which the votes choose
    among, are compared at the same moments.

    Why between the samples too (between_shapes): the votes cover every shape, and between
    two samples they interpolate each kernel's measured error. Kernels part ways there:
    batch matmul NN's `m6_n16_k128_t1_ki` ran 134 GFLOP/s at T = 49, a sample, and 109-118
    at T = 90-128, while `m2_n32_k128_t2_ki` held 127-151; with samples at 49 and 128 only,
    the tree gave T = 62-100 to the first, 1.3-1.4x slower there (Zen 3, 2 cores).
    """
    ranked = [[r.kernel for r in sorted((r for r in measurements if r.shape == shape and r.seconds),
                                         key=lambda r: r.seconds)] for shape in shapes]
    chosen: list = []
    for depth in range(max(map(len, ranked), default=0)):
        for kernels in ranked:
            if len(chosen) < count and depth < len(kernels) and kernels[depth] not in chosen:
                chosen.append(kernels[depth])
    return chosen


def _fastest(measurements: list[Measurement]) -> dict[tuple[int, ...], float]:
    """The fastest successful time at each shape."""
    fastest: dict[tuple[int, ...], float] = {}
    for record in measurements:
        if record.seconds:
            fastest[record.shape] = min(record.seconds, fastest.get(record.shape, record.seconds))
    return fastest


def _spread(kernels: list, hw, size: int, rng: random.Random) -> list:
    """A space-filling first batch: from a random start, each next kernel is the one
    farthest (in standardised cost-model features) from those already picked, so the
    first model sees the space's extremes (small and large register tiles, both
    loop orders and weight layouts) rather than a random clump."""
    points = np.array([hw.kernel_features(k) for k in kernels])
    points = (points - points.mean(axis=0)) / np.maximum(points.std(axis=0), 1e-9)
    picked = [rng.randrange(len(kernels))]
    distance = np.linalg.norm(points - points[picked[0]], axis=1)
    while len(picked) < min(size, len(kernels)):
        picked.append(int(np.argmax(distance)))
        distance = np.minimum(distance, np.linalg.norm(points - points[picked[-1]], axis=1))
    return [kernels[i] for i in picked]


def _next_batch(model, measurements, space_list, space_set, values, measured, shapes, size, options, rng, seeds):
    unmeasured = [k for k in space_list if k not in measured]
    if not model.fitted:  # the first batch: up to half from seeds, the rest spread over the space
        first = [k for k in seeds if k not in measured][:size // 2]
        busy = [k for k in unmeasured if model.hw.busy(k) and k not in first]
        return first + _spread(busy or unmeasured, model.hw, size - len(first), rng)
    best = sorted(kernel_throughputs(measurements, model).items(), key=lambda kv: -kv[1])
    parents = [k for k, _ in best[:8]]
    candidates = [k for k in _breed(parents, space_set, values, options.population, rng) if k not in measured]
    candidates += rng.sample(unmeasured, min(len(unmeasured), options.population // 4))
    candidates = list(dict.fromkeys(candidates))
    scores = np.log(model.predict(candidates, shapes)).mean(axis=1)  # joint: every shape counts
    ranked = [candidates[i] for i in np.argsort(-scores)]
    explore = math.ceil(size * options.epsilon)
    batch = ranked[:size - explore]
    rest = [k for k in unmeasured if k not in batch]
    batch += rng.sample(rest, min(explore, len(rest)))
    return batch
