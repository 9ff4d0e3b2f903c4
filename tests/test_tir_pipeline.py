"""The registry of our TIR passes (tuning/tir_passes/pipeline.py): its order keeps every pass after
the ones it names, a pass is left out by name (an argument, or TF_DIETCODE_DISABLE_PASSES for the
process and the runner's workers), a tuning keeps kernels built without a pass apart, and a pass
added as one entry runs in every build."""

import subprocess

import pytest
import tvm
from tvm.script import tirx as T

from tf_dietcode.tuning import hardware, measure, templates
from tf_dietcode.tuning.database import Database
from tf_dietcode.tuning.kernel_objects import KernelObjects
from tf_dietcode.tuning.measure import Measurement
from tf_dietcode.tuning.micro_kernel import MicroKernel
from tf_dietcode.tuning.runner import LocalRunner
from tf_dietcode.tuning.templates import dense
from tf_dietcode.tuning.tir_passes import pipeline
from tf_dietcode.tuning.tir_passes.pipeline import DISABLE, PIPELINE, Entry
from tf_dietcode.tuning.workload import Workload

HW = hardware.detect()
# A cold dense workload whose kernel prefetches the next panel: PrefetchNextPanel's effect is its prefetch calls.
COLD_DENSE = Workload("dense", (1, 40), 96, 64, bias=True, weight_layout="packed", cold_weight=True)
PREFETCHING = MicroKernel(4, 16, 32, 1, False, packed=True, task_m=0)


def _prefetches(disabled=None) -> bool:
    """Whether the prefetching kernel, built leaving out `disabled`, calls llvm.prefetch."""
    assert dense.prefetches_next_panel(COLD_DENSE, PREFETCHING)
    function = templates.for_workload(COLD_DENSE).schedule(COLD_DENSE, PREFETCHING)
    return "@llvm.prefetch" in measure.build(function, HW, disabled).mod.inspect_source("ll")


def _machine_prefetches(object_file) -> bool:
    disassembly = subprocess.run(["objdump", "-d", str(object_file)], check=True, capture_output=True, text=True)
    return any(mnemonic in disassembly.stdout for mnemonic in ("prefetch", "prfm"))


def test_the_order_runs_every_pass_after_the_ones_it_names():
    pipeline.check_order(PIPELINE)
    names = [entry.name for entry in PIPELINE]
    assert len(set(names)) == len(names)
    assert all(set(entry.after) < set(names) for entry in PIPELINE)
    with pytest.raises(ValueError, match="must run after"):
        pipeline.check_order(PIPELINE[::-1])
    with pytest.raises(ValueError, match="named twice"):
        pipeline.check_order((*PIPELINE, PIPELINE[0]))


def test_a_pass_left_out_by_argument_or_environment_leaves_no_trace(monkeypatch):
    monkeypatch.delenv(DISABLE, raising=False)
    assert _prefetches()
    assert not _prefetches(disabled=("PrefetchNextPanel",))
    monkeypatch.setenv(DISABLE, " PrefetchNextPanel,RegisterTiles ")
    assert pipeline.register() == "tf_dietcode without PrefetchNextPanel,RegisterTiles"
    assert not _prefetches()
    assert _prefetches(disabled=())  # the argument, where given, is the set left out


def test_an_unknown_pass_is_an_error_naming_the_known_ones(monkeypatch):
    with pytest.raises(ValueError, match="RegisterTiles"):
        pipeline.register(["RegisterTile"])
    monkeypatch.setenv(DISABLE, "RegisterTiles,NoSuchPass")
    with pytest.raises(ValueError, match="NoSuchPass.*VersionSmallReductions"):
        measure.build(tvm.IRModule(), HW)


def test_a_pass_added_as_one_entry_runs_in_the_build(monkeypatch):
    monkeypatch.delenv(DISABLE, raising=False)
    seen = []

    @tvm.tirx.transform.prim_func_pass(opt_level=0, name="tests.RecordTheCode")
    def record(func, _mod, _ctx):
        seen.append(func)
        return func

    monkeypatch.setattr(pipeline, "PIPELINE", (*PIPELINE, Entry("RecordTheCode", record, after=(PIPELINE[-1].name,))))
    pipeline.check_order(pipeline.PIPELINE)

    @T.prim_func
    def double(a: T.Buffer((16,), "float32")):
        for i in range(16):
            a[i] = a[i] * T.float32(2)

    measure.build(tvm.IRModule({"main": double}), HW)
    assert len(seen) == 1
    measure.build(tvm.IRModule({"main": double}), HW, disabled=("RecordTheCode",))
    assert len(seen) == 1


def test_a_tuning_database_keeps_each_set_of_passes_apart(tmp_path, monkeypatch):
    monkeypatch.delenv(DISABLE, raising=False)
    path = tmp_path / "tuning.jsonl"
    Database(path).add(COLD_DENSE, HW.name, [Measurement(PREFETCHING, (8,), 1e-3)])
    monkeypatch.setenv(DISABLE, "PrefetchNextPanel")
    assert Database(path).measurements(COLD_DENSE, HW.name) == []
    Database(path).add(COLD_DENSE, HW.name, [Measurement(PREFETCHING, (8,), 2e-3)])
    assert [record.seconds for record in Database(path).measurements(COLD_DENSE, HW.name)] == [2e-3]
    monkeypatch.delenv(DISABLE)
    assert [record.seconds for record in Database(path).measurements(COLD_DENSE, HW.name)] == [1e-3]


def test_the_runners_worker_builds_without_the_passes_the_environment_names(tmp_path, monkeypatch):
    """The worker process inherits TF_DIETCODE_DISABLE_PASSES and registers that pipeline itself;
    the kernel it keeps is under that set's key, beside (not in place of) the default build."""
    monkeypatch.setenv(DISABLE, "PrefetchNextPanel")
    objects = KernelObjects(tmp_path)
    runner = LocalRunner(HW, objects=objects)
    try:
        [record] = runner.run(COLD_DENSE, [PREFETCHING], [(8,)])
    finally:
        runner.close()
    assert record.seconds, record.error
    [kept] = tmp_path.glob("*.o")
    assert objects.object_file(COLD_DENSE, PREFETCHING, HW) == kept  # found: the worker compiled it
    assert not _machine_prefetches(kept)
    monkeypatch.delenv(DISABLE)
    default = objects.object_file(COLD_DENSE, PREFETCHING, HW)
    assert default != kept and _machine_prefetches(default)


def test_entries_are_named_as_tvm_names_their_pass():
    """So that the name a test instruments (lowered_kernels.build_seen_after) is the one it disables."""
    assert all(entry.tir_pass.info.name == f"tf_dietcode.{entry.name}" for entry in PIPELINE)
