"""What the Converter asks of every fusion kind, so that it handles them all alike.

A kind finds its patterns in one signature's graph (and says which it left alone
and why), names the forms each match fuses (the report counts them), and writes
the op that replaces a match, bound through a Binding to what the Converter
owns: the kernel bundle, the output model's variables and the precision each
match runs in (a kind whose op reads a fixed weight may run in a reduced
precision, tf_dietcode.precision; the others say why they stay float32). A kind whose op runs
tuned kernels (TunedFusion) also sizes each match as the Workload they are
tuned for: from the graph's symbolic shapes, or else from the shapes its
operands are seen with when the model runs at the corners of the shape ranges.

Adding a kind: a module with its Fusion, and its line in fusions.FUSIONS.
"""

import abc
import dataclasses
from typing import Protocol

import numpy as np
import tensorflow as tf

from tf_dietcode.graph_rewrite.analysis.graph_index import GraphIndex
from tf_dietcode.graph_rewrite.analysis.symbolic_shapes import SymbolicShapes
from tf_dietcode.precision.contract import Precision
from tf_dietcode.tuning.workload import Workload


@dataclasses.dataclass(frozen=True)
class Switches:
    """The Converter's switches for kinds and passes that are optional (optimize()'s keywords)."""
    horizontal_fusion: bool = False
    layer_norm_fusion: bool = True


@dataclasses.dataclass(frozen=True)
class LeftAlone:
    """A pattern a kind recognised but does not fuse, named in the report."""
    form: str
    node: str
    reason: str


@dataclasses.dataclass
class Found:
    matches: list                       # in the order they are spliced
    left_alone: list[LeftAlone] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class Replacement:
    """Ops written in a scratch graph (splice.scratch_graph) to replace a match."""
    graph_def: tf.compat.v1.GraphDef
    bound: dict[str, str | None]        # its placeholders -> tensors of the graph it goes into
    outputs: list[str]                  # the match's outputs, read from its nodes out_0, out_1, ... instead


class Binding(Protocol):
    """What a replacement's op is bound to in the signature being rewritten."""
    bundle: str  # the tensor holding the kernel bundle's manifest path ("" where nothing was tuned)

    def kernels(self, match) -> dict:
        """The bundle manifest's entry for the workload a TunedFusion's match was tuned as ({} where
        it was not tuned: it runs in a reduced precision, or was put back in float32 after tuning)."""

    def precision(self, match) -> Precision:
        """The precision the match runs in (float32 for a match whose kind says why it stays float32)."""

    def variable(self, value: np.ndarray) -> str:
        """A resource tensor for a variable holding `value`, kept by the output model (one per
        distinct value, however many matches and signatures read it)."""


class Fusion(abc.ABC):
    name: str                                   # its ops are spliced in as dietcode/<name>_<i>
    ops_in_bodies: frozenset[str] = frozenset()  # its ops the report names where control flow or XLA keeps them

    @abc.abstractmethod
    def find(self, index: GraphIndex, shapes: SymbolicShapes, switches: Switches) -> Found:
        """The kind's matches in one signature's graph; `shapes` are sized from the shape ranges
        as given (before a build's input_fn)."""

    @abc.abstractmethod
    def forms(self, match) -> tuple[str, ...]:
        """The patterns the match fuses, as the report counts them (several where it merges them)."""

    def label(self, form: str) -> str:
        """How the report's summary names a form."""
        return form

    def kept_float32(self, match) -> str | None:
        """Why the match's op computes in float32 whatever precision is asked for; None where it
        can run in any (its op reads a fixed weight that is converted at optimize time)."""
        return f"{self.name.replace('_', ' ')} runs in float32: only dense layers have reduced-precision ops"

    def summary(self, merged: tuple[int, int], switches: Switches) -> list[str]:
        """Lines of the report's summary on the kind's passes, given how many of its patterns
        were merged into shared ops and into how many."""
        return []

    @abc.abstractmethod
    def replacement(self, match, binding: Binding) -> Replacement:
        """The op computing the match's outputs."""


class TunedFusion(Fusion):
    """A kind whose op runs kernels tuned for a Workload per match. Its matches have a `core`,
    the node that names them (in notes, and for their workloads)."""

    def tuned(self, match) -> bool:
        """Whether the match's op runs tuned kernels (else only the generic kernel: no workload)."""
        return True

    def weight_bytes(self, match) -> int:
        """The fixed weights one call of the match reads: with a signature's others, whether the
        kernels are tuned with them read from DRAM."""
        return 0

    @abc.abstractmethod
    def operands(self, match) -> dict[str, str]:
        """The tensors whose shapes size the match's workload, by a name of the kind's choosing."""

    @abc.abstractmethod
    def sized_by_graph(self, match, shapes: SymbolicShapes, cold_weight: bool) -> tuple[Workload, str] | None:
        """The match's workload from the graph's symbolic shapes, and its dynamic dims as the
        graph computes them ("M = x[0]*x[1]"); None where some dim does not follow from them."""

    @abc.abstractmethod
    def sized_at_corners(self, match, observed: dict[str, list[list[int]]],
                         cold_weight: bool) -> tuple[Workload, bool]:
        """The match's workload from the shapes its operands were seen with (by name, one per run
        of the model), and whether every dim had one size in all runs."""
