"""Horizontal fusion: dense layers that read the same input become one GEMM.

In a Transformer the query, key and value projections read the same hidden
states; with their weights concatenated, [M, K] x [K, 3N] is one product
whose bigger N keeps every core busy at small M, and one call replaces
three. The product is written group-major, [layers, M, N] (the op's `groups`),
so TF splits it back into each layer's output without copying. Only layers of
the same width are merged (each group must be one block of the output), and
only where that width is a whole number of SIMD vectors: the kernels' tasks
must not straddle two layers, and their column tiles are whole vectors.

Every dense layer the rewriter emits is a DenseGroup: a lone layer is a group
of one, so one replacement serves both.
"""

import collections
import dataclasses
import functools

import numpy as np

from tf_dietcode.graph_rewrite.fusions.dense_patterns import DenseMatch, WeightDims


@dataclasses.dataclass
class DenseGroup(WeightDims):
    """Dense layers over one input with one activation: act(x @ [W_1 ... W_n] + [b_1 ... b_n])."""
    members: tuple[DenseMatch, ...]

    @property
    def core(self) -> str:
        return "+".join(m.core for m in self.members)

    @property
    def shares_x(self) -> bool:
        """Every member reads the same x (else each flattens the same tensor to its own x)."""
        return len({m.x for m in self.members}) == 1

    @property
    def x(self) -> str:
        """The members' input: their x if they share it, else what their x's flatten
        (Keras Dense layers on N-D input each flatten the same tensor)."""
        return self.members[0].x if self.shares_x else self.members[0].source

    @property
    def groups(self) -> int:
        """Layers side by side in the weight: the op's and the workload's `groups`."""
        return len(self.members)

    @property
    def contracted(self) -> int:
        return self.members[0].contracted

    @property
    def activation(self) -> str:
        return self.members[0].activation

    @property
    def has_bias(self) -> bool:
        return any(m.bias is not None for m in self.members)

    @functools.cached_property
    def weight(self) -> np.ndarray:
        """[K, sum of the members' N]."""
        if len(self.members) == 1:
            return self.members[0].weight
        return np.ascontiguousarray(np.concatenate([m.weight for m in self.members], axis=1))


def group(matches: list[DenseMatch], fuse: bool, vector_lanes: int) -> list[DenseGroup]:
    """The layers as groups, in the matches' order: with `fuse`, layers with the same input,
    contracted dims, width and activation share one group where the width is a multiple of
    `vector_lanes`; every other layer is a group of its own."""
    groups = collections.defaultdict(list)
    for match in matches:
        mergeable = fuse and match.n % vector_lanes == 0
        groups[(match.source, match.contracted, match.n, match.activation) if mergeable else id(match)].append(match)
    return [DenseGroup(tuple(members)) for members in groups.values()]
