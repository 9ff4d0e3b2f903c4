"""The TIR pipeline every kernel is compiled with (measure.build): TVM's default TIR pipeline, then
our passes on the lowered code in the order PIPELINE lists them.

A pass is one entry in PIPELINE: its name, the pass, and the passes it must run after (which
check_order holds the order to). Any of them can be left out by name, for an A/B measurement:
measure.build(..., disabled=names), or for every build of a process and the runner's worker
processes it starts, TF_DIETCODE_DISABLE_PASSES=name1,name2. Each set left out is a TVM pipeline
of its own (register); kernels kept on disk and tuning records say which set built them
(kernel_objects, database), so a tuning never mixes them.
"""

import dataclasses
import functools
import os
from collections.abc import Iterable, Sequence

import tvm

from tf_dietcode.tuning.tir_passes import (guarded_loops, overlapping_tiles, parallel_launches, prefetch_panel,
                                           reduction_chains, register_tiles, remainder_rows, row_pointers,
                                           small_reductions, task_division, task_scratch, transpose_in_registers,
                                           vector_write_backs)

# LoopPartition also splits loops of constant trip count: a tile's write-back loop runs
# over its columns (a constant) against a bound that is symbolic (N - the tile's first
# column), and split there it writes the valid columns with no check per element. With
# the fetches split this way too (templates 11), batch matmul NT's symbolic m2_n32_k32
# ran 6-12% faster at T = 62-128 and 2-5% slower at T = 5-17; NN and dense within 1%
# (2-core Zen 1, interleaved). The fetches now stop at the bounds by themselves
# (templates.copy_inside_bounds), leaving the write-backs and a dynamic K's last block
# (batch_matmul.partition_the_reduction).
# no_unroll_loop_with_extent_one: a partition of one iteration is otherwise inlined with its
# loop var replaced by an int32 zero (LoopPartitioner::MakeFor, read in TVM's main branch; the
# failure seen on 0.27), though the var is int64: a whole_batch kernel over a static N that its
# column tasks do not divide (N = 40 in tasks of 16 columns, or BERT's 64 in AVX2's 24) then
# failed to compile ("mismatched types. int32 vs. int64"), and tuning lost those candidates.
# The loop left behind is simplified away later; every other kernel's lowered code is
# unchanged (30 kernels compared as text).
PASS_CONFIG = {"s_tir.LoopPartition": {"partition_const_loop": True, "no_unroll_loop_with_extent_one": True}}

NAME = "tf_dietcode"  # the TVM pipeline with every pass: tvm.compile(..., tir_pipeline=register())
DISABLE = "TF_DIETCODE_DISABLE_PASSES"  # environment variable: names of passes every build leaves out


@dataclasses.dataclass(frozen=True)
class Entry:
    name: str                      # what `disabled` and TF_DIETCODE_DISABLE_PASSES call the pass
    tir_pass: tvm.transform.Pass
    after: tuple[str, ...] = ()    # the passes it must run after


# In the order they run. TVM's passes named here run before ours (LoopPartition, StorageRewrite:
# the lowering) or after them (LowerTVMBuiltin: the finalizing passes).
PIPELINE: tuple[Entry, ...] = (
    # first, so that the passes after it see each copy's constant sizes
    Entry("VersionSmallReductions", small_reductions.VersionSmallReductions),
    # after LoopPartition made the remainders
    Entry("ShrinkGuardedLoops", guarded_loops.ShrinkGuardedLoops, after=("VersionSmallReductions",)),
    # on the pairs of whole and partial tile loops that LoopPartition (and ShrinkGuardedLoops) made
    Entry("OverlapPartialTiles", overlapping_tiles.OverlapPartialTiles, after=("ShrinkGuardedLoops",)),
    # on the loops ShrinkGuardedLoops left with constant extents or stopping at N
    Entry("TransposeInRegisters", transpose_in_registers.TransposeInRegisters, after=("ShrinkGuardedLoops",)),
    # after StorageRewrite merged the partitions' accumulators
    Entry("RegisterTiles", register_tiles.RegisterTiles, after=("VersionSmallReductions",)),
    # on the register tiles' last rows that OverlapPartialTiles leaves to it, in tiles RegisterTiles made their own
    Entry("SpecializeRemainderRows", remainder_rows.SpecializeRemainderRows,
          after=("OverlapPartialTiles", "RegisterTiles")),
    # on the write-backs whose rows SpecializeRemainderRows made constant
    Entry("VectorWriteBacks", vector_write_backs.VectorWriteBacks, after=("SpecializeRemainderRows",)),
    # on the K loops of those constant rows, whose write-backs tell the live accumulators
    Entry("SplitReductionChains", reduction_chains.SplitReductionChains, after=("VectorWriteBacks",)),
    # before LowerTVMBuiltin, in the finalizing passes, turns tiles into workspace calls; on the marked
    # row-tile loops that SpecializeRemainderRows keeps as loops
    Entry("PrefetchNextPanel", prefetch_panel.PrefetchNextPanel, after=("SpecializeRemainderRows",)),
    # before LowerTVMBuiltin too; on each copy's parallel loop
    Entry("AllocatePerTask", task_scratch.AllocatePerTask, after=("VersionSmallReductions",)),
    # on the parallel loops, the copies' too
    Entry("DivideTaskIndexByReciprocal", task_division.DivideTaskIndexByReciprocal,
          after=("VersionSmallReductions",)),
    # on the final index expressions
    Entry("OwnRowPointers", row_pointers.OwnRowPointers,
          after=("TransposeInRegisters", "SplitReductionChains", "DivideTaskIndexByReciprocal")),
    # last: one launch where LoopPartition made two, from AllocatePerTask's launch points
    Entry("MergeParallelLaunches", parallel_launches.MergeParallelLaunches,
          after=("AllocatePerTask", "DivideTaskIndexByReciprocal", "OwnRowPointers")),
)


def check_order(entries: Sequence[Entry]) -> None:
    """Raises ValueError where two entries share a name or one comes before a pass it must run after."""
    names = [entry.name for entry in entries]
    if len(set(names)) != len(names):
        raise ValueError(f"TIR passes named twice: {sorted({name for name in names if names.count(name) > 1})}")
    for position, entry in enumerate(entries):
        early = [name for name in entry.after if name not in names[:position]]
        if early:
            raise ValueError(f"{entry.name} must run after {early}, which do not come before it")


def disabled_passes(names: Iterable[str] | None = None) -> tuple[str, ...]:
    """The passes to leave out, sorted: `names`, or where None the ones TF_DIETCODE_DISABLE_PASSES
    lists (read now, comma-separated); a name PIPELINE lacks is a ValueError."""
    if names is None:
        names = [name.strip() for name in os.environ.get(DISABLE, "").split(",") if name.strip()]
    known = [entry.name for entry in PIPELINE]
    unknown = sorted(set(names) - set(known))
    if unknown:
        raise ValueError(f"no TIR pass is named {', '.join(unknown)}; the passes are {', '.join(known)}")
    return tuple(sorted(set(names)))


def register(disabled: Iterable[str] | None = None) -> str:
    """The name tvm.compile knows the pipeline by that leaves out the passes `disabled` (None: those
    TF_DIETCODE_DISABLE_PASSES lists), registered with TVM on first use in this process."""
    return _registered(disabled_passes(disabled))


@functools.cache
def _registered(disabled: tuple[str, ...]) -> str:
    name = f"{NAME} without {','.join(disabled)}" if disabled else NAME
    tvm.tirx.compilation_pipeline.register_tir_pipeline(name, lambda: _tvm_pipeline(disabled))
    return name


def _tvm_pipeline(disabled: tuple[str, ...]):
    """TVM's default TIR pipeline, then our passes but those `disabled`; as TVM asks a pipeline for them
    at each build: (lowering, host finalization, device finalization)."""
    lower, finalize_host, finalize_device = tvm.tirx.get_tir_pipeline("default")
    ours = [entry.tir_pass for entry in PIPELINE if entry.name not in disabled]
    return tvm.transform.Sequential([lower, *ours]), finalize_host, finalize_device
