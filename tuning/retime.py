"""Re-timing a dispatch's kernels together before its final tree.

A search measures each kernel once per sample shape, at the moment it is
picked: kernels measured minutes apart meet a machine whose speed drifts by a
few percent (this VM: about 5%), as much as separates the best candidates.
Between samples, a small measured edge and f_pad then decide the vote. Session
36 found the grouped Q/K/V workload's tree running m4_n48_k128_t1_ki_p at
M = 128, measured within 0.5-6% of the best at M = 97 and 446 but 1.11x the
one-layer kernel's time there when timed interleaved.

So the kernels a tree picks are timed again at every sample shape in
`rounds` rounds, each in a fresh order, back to back; the cost model averages
every record of a kernel at a shape (cost_model.calibrated_gflops), so the
drift of the search's single records is diluted by records taken together, and
the tree is fitted again. Until its kernels all have their rounds: re-timing
the first tree's kernels alone handed the votes to kernels whose single records
were the next luckiest (the winner's curse; on a formula machine whose first
runs drift by up to 25%, one search's tree then lost 6x more to the best
measured kernels). Iterated, six such searches' trees lost 40% less than their
first trees in all (one lucky first tree did better; tests/test_tuning_pipeline.py).
Kernels that already have their records (a resumed run) are not timed again.
"""

import collections
import random

from tqdm import tqdm

from tf_dietcode.tuning.database import Database
from tf_dietcode.tuning.dispatch import Dispatch, build_dispatch
from tf_dietcode.tuning.search import SearchResult

MAX_PASSES = 4  # trees refitted after re-timing; each pass times only kernels new to the tree


def retimed_dispatch(result: SearchResult, runner, database: Database, target: str, rounds: int,
                     seed: int = 0, progress: bool = True) -> Dispatch:
    """The dispatch of `result` once every kernel its tree picks has `rounds` extra records at
    each sample shape (added to the result's measurements and the database)."""
    rng = random.Random(seed)
    dispatch = build_dispatch(result)
    with tqdm(desc="re-timing", unit="kernel", disable=not progress or rounds == 0) as bar:
        for _ in range(MAX_PASSES if rounds else 0):
            kernels = _short_of_records(result, dispatch.kernels, rounds + 1)
            if not kernels:
                break
            for _ in range(rounds):
                retimed = runner.run(result.workload, rng.sample(kernels, len(kernels)), result.sample_shapes,
                                     seed=seed)
                database.add(result.workload, target, retimed)
                result.measurements.extend(retimed)
                bar.update(len(kernels))
            result.model.fit(result.measurements)
            dispatch = build_dispatch(result)
    return dispatch


def _short_of_records(result: SearchResult, kernels: list, wanted: int) -> list:
    """The kernels with fewer than `wanted` successful records at some sample shape."""
    counts = collections.Counter((r.kernel, r.shape) for r in result.measurements if r.seconds)
    return [k for k in kernels if min(counts[(k, shape)] for shape in result.sample_shapes) < wanted]
