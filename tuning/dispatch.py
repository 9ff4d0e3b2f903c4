"""Shape dispatch: every shape in the range votes for its best micro-kernel, a
decision tree learns the votes, and the tree is emitted as C.

Votes use the cost formula over measured data: each measured kernel's f_MK
(its measured throughput with shape effects divided out) times f_occ * f_pad
at that shape, corrected by the formula's error where the kernel was measured
(cost_model.calibrated_gflops), so a vote never contradicts a measurement.
Where the search timed its finalists again, the votes choose among them alone
(candidates). The tree's features are the sizes of the workload's dynamic
dims, so a caller dispatches on the dims it sees. All kernels of a dense
workload share one weight layout (pre-packed in tile_n-wide blocks, as many
as N needs, or in place; kernels that differ only in their task's width share
the same packed weight when N fills their tasks alike), so the op gets one
weight; the layout with the least predicted time over the range wins, each
shape weighed as the tree weighs it (shape_weights).
"""

import dataclasses

import numpy as np
from sklearn.tree import DecisionTreeClassifier

from tf_dietcode.tuning.cost_model import calibrated_gflops
from tf_dietcode.tuning.micro_kernel import MicroKernel
from tf_dietcode.tuning.search import SearchResult, between_shapes
from tf_dietcode.tuning.workload import DIMS, Workload

MAX_LEAVES = 32


@dataclasses.dataclass
class Dispatch:
    workload: Workload
    kernels: list                    # the kernels the tree can choose, by index (MicroKernel or GpuKernel)
    tree: DecisionTreeClassifier     # dynamic dims' sizes -> index into kernels
    predicted_gflops: dict[tuple[int, ...], float]   # by shape (variable values)

    def kernel_index(self, dims: dict[str, int]) -> int:
        """The kernel for these dims; -1 outside the tuned ranges (generic kernel)."""
        if not self.workload.contains(dims):
            return -1
        if not self.workload.dynamic_dims:
            return int(self.tree.predict(np.zeros((1, 1)))[0])
        return int(self.tree.predict(np.array([[dims[d] for d in self.workload.dynamic_dims]]))[0])

    def c_source(self, function_name: str) -> str:
        """int64_t function_name(int64_t b, int64_t m, int64_t n, int64_t k): the tree as nested ifs."""
        t = self.tree.tree_
        features = self.workload.dynamic_dims or ("b",)

        def node(i: int, depth: int) -> str:
            pad = "  " * depth
            if t.children_left[i] == t.children_right[i]:  # a leaf
                return f"{pad}return {int(self.tree.classes_[int(np.argmax(t.value[i]))])};\n"
            feature = features[t.feature[i]]
            return (f"{pad}if ((double){feature} <= {float(t.threshold[i])!r}) {{\n"
                    f"{node(t.children_left[i], depth + 1)}"
                    f"{pad}}} else {{\n{node(t.children_right[i], depth + 1)}{pad}}}\n")

        bounds = " || ".join(f"{d} < {getattr(self.workload, d).lo} || {d} > {getattr(self.workload, d).hi}"
                             for d in DIMS)
        signature = ", ".join(f"int64_t {d}" for d in DIMS)
        return (f"int64_t {function_name}({signature}) {{\n"
                f"  if ({bounds}) return -1;\n{node(0, 1)}}}\n")


def shape_weights(shapes: list[tuple[int, ...]]) -> np.ndarray:
    """Each shape's weight in the tree: 1 / the product of its variables' sizes, so
    that every doubling of a size weighs alike (a request at T = 5 matters as much
    as one at T = 100; the samples are spread geometrically for the same reason).
    Counted per shape, a tree short of leaves merged small-M regions into their
    neighbours: in one default-budget tuning of BERT-base, its 768 x 768 layer ran
    a kernel 1.65x slower than the fastest measured at the sample shape M = 5.
    A size of 0 (an empty product, which a range may include) weighs as 1, not infinitely."""
    return 1.0 / np.prod(np.maximum(np.asarray(shapes, dtype=np.float64), 1.0), axis=1)


def candidates(result: SearchResult) -> list[MicroKernel]:
    """The kernels the votes choose among: the search's finalists where it timed them again
    (they alone have records between the sample shapes), else every kernel that ran.

    Why the finalists alone: they were timed together, at the samples and between them, while
    the other kernels' records come from their own batches' moments and reach the shapes between
    the samples only by interpolation. Voting among all, batch matmul NN's tree gave T = 5 (a
    shape between the samples 3 and 7) a kernel not timed there over the finalist timed fastest
    there, and that kernel ran 1.29x slower than it (Zen 3, 2 cores). Over eleven stored
    tunings of the bench's workloads, the kernels of the finalists' trees against
    those of the trees from all kernels, timed at the same moments at the bench's ten T: 0.961-1.031
    per tuning, geometric mean 0.992; docs/decisions.md has the cells."""
    ran = {r.kernel for r in result.measurements if r.seconds}
    between = set(between_shapes(result.sample_shapes))
    return sorted({r.kernel for r in result.measurements if r.seconds and r.shape in between} or ran)


def build_dispatch(result: SearchResult) -> Dispatch:
    """Votes over every shape of the range, the layout choice, and the fitted tree."""
    model, workload = result.model, result.workload
    measured = candidates(result)
    if not measured:
        first = next((r for r in result.measurements if r.error), None)
        reason = f"; the first failure, {first.kernel.name} at {first.shape}: {first.error}" if first else ""
        raise RuntimeError(f"no micro-kernel of {workload.key()} ran successfully{reason}")
    every_shape = workload.all_shapes()
    keep = workload.flops(workload.dims_over(every_shape)) > 0
    shapes = [shape for shape, kept in zip(every_shape, keep) if kept]
    layouts: dict[tuple, list[MicroKernel]] = {}
    for kernel in measured:
        layouts.setdefault(tuple(model.hw.weight_layout(workload, kernel).items()), []).append(kernel)

    by_kernel = dict(zip(measured, calibrated_gflops(result.measurements, model, measured, shapes)))
    weights = shape_weights(shapes)

    def cost(kernels) -> float:
        """A layout's cost: each shape's time per FLOP with its best kernel, weighed as the
        tree weighs the shape. By total time the largest sizes decided the layout: a quick
        tuning of BERT-base (M = 1..2048) gave its 768 x 768 layer the one kernel of the
        layout best at M = 2048, 0.74x of the other layout's best at M = 13."""
        return float(sum(weights / np.array([by_kernel[k] for k in kernels]).max(axis=0)))

    kernels = sorted(layouts[min(layouts, key=lambda key: cost(sorted(layouts[key])))])
    return fit_tree(workload, kernels, shapes, np.array([by_kernel[k] for k in kernels]))


def fit_tree(workload: Workload, kernels: list, shapes: list[tuple[int, ...]], gflops: np.ndarray) -> Dispatch:
    """Each shape votes for its fastest kernel by `gflops` (kernels x shapes, predicted
    or measured), and a tree over the dynamic dims learns the votes, each shape
    weighed by shape_weights. Kernels of any target (CPU micro-kernels, GPU ones)."""
    best = gflops.argmax(axis=0)
    used = sorted({int(b) for b in best})
    labels = np.array([used.index(int(b)) for b in best])  # positions in the used kernels
    dims = workload.dims_over(shapes)
    features = np.stack([dims[d] for d in workload.dynamic_dims] or [np.zeros(len(shapes))], axis=1)
    tree = DecisionTreeClassifier(max_leaf_nodes=MAX_LEAVES, random_state=0)
    tree.fit(features, labels, sample_weight=shape_weights(shapes))
    return Dispatch(workload, [kernels[i] for i in used], tree,
                    {s: float(g) for s, g in zip(shapes, gflops.max(axis=0))})
