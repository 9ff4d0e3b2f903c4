"""Shape dispatch: every M in the range votes for its best micro-kernel, a
decision tree learns the votes, and the tree is emitted as C.

Votes use the cost formula over measured data: each measured kernel's f_MK
(its measured throughput with shape effects divided out) times f_occ * f_pad
at that M. All kernels a workload dispatches to share one pre-packed weight
layout (tile_n, task_n), so the weight is packed once; the layout with the
least predicted total time over the range wins.
"""

import dataclasses

import numpy as np
from sklearn.tree import DecisionTreeClassifier

from tf_dietcode.tuning.cost_model import kernel_throughputs
from tf_dietcode.tuning.micro_kernel import MicroKernel
from tf_dietcode.tuning.search import SearchResult
from tf_dietcode.tuning.workload import Workload

MAX_LEAVES = 32


@dataclasses.dataclass
class Dispatch:
    workload: Workload
    kernels: list[MicroKernel]       # the kernels the tree can choose, by index
    tree: DecisionTreeClassifier     # M -> index into kernels
    predicted_gflops: dict[int, float]

    @property
    def layout(self) -> tuple[int, int]:
        return self.kernels[0].tile_n, self.kernels[0].task_n

    def kernel_index(self, m: int) -> int:
        """The kernel for M = m; -1 outside the tuned range (generic kernel)."""
        if not self.workload.m.lo <= m <= self.workload.m.hi:
            return -1
        return int(self.tree.predict(np.array([[m]]))[0])

    def c_source(self, function_name: str) -> str:
        """int64_t function_name(int64_t m): the tree as nested ifs."""
        t = self.tree.tree_

        def node(i: int, depth: int) -> str:
            pad = "  " * depth
            if t.children_left[i] == t.children_right[i]:  # a leaf
                label = int(self.tree.classes_[int(np.argmax(t.value[i]))])
                return f"{pad}return {label};\n"
            return (f"{pad}if ((double)m <= {float(t.threshold[i])!r}) {{\n{node(t.children_left[i], depth + 1)}"
                    f"{pad}}} else {{\n{node(t.children_right[i], depth + 1)}{pad}}}\n")

        lo, hi = self.workload.m.lo, self.workload.m.hi
        return (f"int64_t {function_name}(int64_t m) {{\n"
                f"  if (m < {lo} || m > {hi}) return -1;\n{node(0, 1)}}}\n")


def build_dispatch(result: SearchResult) -> Dispatch:
    """Votes over every M of the range, the layout choice, and the fitted tree."""
    model, workload = result.model, result.workload
    throughputs = kernel_throughputs(result.measurements, model)
    if not throughputs:
        raise RuntimeError(f"no micro-kernel of {workload.key()} ran successfully")
    ms = list(range(max(workload.m.lo, 1), workload.m.hi + 1))
    layouts: dict[tuple[int, int], list[MicroKernel]] = {}
    for kernel in throughputs:
        layouts.setdefault((kernel.tile_n, kernel.task_n), []).append(kernel)

    def votes(kernels):
        gflops = np.array([[throughputs[k] * model.shape_factor(k, m) for m in ms] for k in kernels])
        best = gflops.argmax(axis=0)
        seconds = sum(workload.flops(m) / (gflops[b, i] * 1e9) for i, (m, b) in enumerate(zip(ms, best)))
        return seconds, best, gflops.max(axis=0)

    layout = min(layouts, key=lambda key: votes(sorted(layouts[key]))[0])
    kernels = sorted(layouts[layout])
    _, best, gflops = votes(kernels)
    used = sorted({int(b) for b in best})
    labels = np.array([used.index(int(b)) for b in best])  # positions in the used kernels
    tree = DecisionTreeClassifier(max_leaf_nodes=MAX_LEAVES, random_state=0).fit(np.array(ms)[:, None], labels)
    return Dispatch(workload, [kernels[i] for i in used], tree,
                    {m: float(g) for m, g in zip(ms, gflops)})

