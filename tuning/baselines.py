"""Baselines the DietCode search is compared with, built from the same parts.

largest_shape (Nimble-like): tune for the largest shape of the range only and
let its best micro-kernel serve every shape (compiled with symbolic dims, so it
runs anywhere in the range). Per-shape tuning (Ansor-like) is the DietCode
search restricted to one static shape at a time: `search(..., shapes=[s])`.
"""

import numpy as np
from sklearn.tree import DecisionTreeClassifier

from tf_dietcode.tuning.database import Database
from tf_dietcode.tuning.dispatch import Dispatch
from tf_dietcode.tuning.hardware import Hardware
from tf_dietcode.tuning.search import SearchOptions, SearchResult, search
from tf_dietcode.tuning.workload import Workload


def largest_shape(workload: Workload, hw: Hardware, runner, options: SearchOptions = SearchOptions(),
                  database: Database | None = None, progress: bool = True) -> tuple[SearchResult, Dispatch]:
    """The search at the range's largest shape, and a dispatch that always picks its winner."""
    largest = tuple(size.hi for _, size in workload.variables())
    result = search(workload, hw, runner, options, database, progress, shapes=[largest])
    timed = [r for r in result.measurements if r.seconds and r.shape == largest]
    if not timed:
        raise RuntimeError(f"no micro-kernel of {workload.key()} ran at its largest shape")
    fastest = min(timed, key=lambda r: r.seconds)
    tree = DecisionTreeClassifier().fit(np.zeros((1, max(len(workload.dynamic_dims), 1))), [0])
    gflops = workload.flops(workload.dims_at(largest)) / fastest.seconds / 1e9
    return result, Dispatch(workload, [fastest.kernel], tree, {largest: gflops})
