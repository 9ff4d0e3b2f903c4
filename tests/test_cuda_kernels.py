"""CUDA micro-kernels, checked without a GPU: the space obeys the architecture's
limits, local padding keeps bound checks out of the compute loop, each kernel's
recorded launch rule is the grid its code was scheduled for, nvcc builds the
fatbin, and the joint search, cost model and dispatch run over a GPU target
from a recorded run. Numerical checks need a GPU: bench/cuda_kernels.py runs
every kernel against float64 there."""

import csv
import ctypes
import dataclasses
import json
import re

import pytest
import tvm_ffi
from tvm import s_tir, tirx
from tvm.s_tir.stmt import SBlockRealize
from tvm.sym import Analyzer

from tf_dietcode.tuning import cost_model, dispatch, search
from tf_dietcode.tuning.cuda import build, limits, schedule, space
from tf_dietcode.tuning.cuda.recorded import RecordedRunner
from tf_dietcode.tuning.cuda.target import GpuTarget
from tf_dietcode.tuning.workload import Workload

WORKLOADS = [
    Workload("dense", (1, 2048), 2304, 768, bias=True),
    Workload("dense", (1, 100), 40, 17, bias=True, activation="gelu"),            # nothing divides
    Workload("batch_matmul", (1, 128), (1, 128), 64, b=192, ties=("m", "n")),      # attention scores
    Workload("batch_matmul", (1, 128), 64, (1, 128), b=192, transpose_b=False, ties=("m", "k")),  # probs v
    Workload("batch_matmul", (1, 40), (1, 40), 16, b=(2, 6), bias=True, ties=("m", "n")),          # + mask
]
GPU = limits.common(build.ARCHS)


def sample(workload, count=4):
    kernels = space.space(GPU, workload)
    return kernels[:: max(1, len(kernels) // count)][:count]


def realizes(mod, *names) -> dict[str, tuple]:
    """(realize, enclosing loops) of each named block."""
    sch = s_tir.Schedule(mod)
    found = {}
    for name in names:
        loops = [sch.get(loop) for loop in sch.get_loops(name)]
        body = loops[-1].body
        realize = next(s for s in (body.seq if isinstance(body, tirx.SeqStmt) else [body])
                       if isinstance(s, SBlockRealize) and s.block.name_hint == name)
        found[name] = (realize, loops)
    return found


def test_space_respects_the_architecture_limits():
    workload = WORKLOADS[0]
    kernels = space.space(GPU, workload)
    assert len(kernels) > 100
    for kernel in kernels:
        x, y = kernel.threads
        assert (x * y) % 32 == 0 and 64 <= x * y <= 256, kernel.name
        assert kernel.shared_bytes(workload) <= GPU.shared_bytes_per_block, kernel.name
    # limits, not shapes, bound the space: less shared memory, fewer kernels, and none needs more
    small = dataclasses.replace(GPU, shared_bytes_per_block=8 << 10)
    assert {k for k in space.space(small, workload)} < set(kernels)
    assert all(k.shared_bytes(workload) <= 8 << 10 for k in space.space(small, workload))


def test_two_stages_only_where_k_spans_enough_k_steps():
    """A pipeline overlaps copies with FMAs only over several K steps: dense's K = 768
    gets two stages at every K step, NT's K = 64 only at the smallest, K = 17 at none."""
    def pipelined_k_steps(workload):
        return {k.tile_k for k in space.space(GPU, workload) if k.stages == 2}

    assert pipelined_k_steps(WORKLOADS[0]) == set(space.K_STEPS)
    assert pipelined_k_steps(WORKLOADS[2]) == {64 // space.PIPELINED_STEPS}
    assert pipelined_k_steps(WORKLOADS[1]) == set()


@pytest.mark.parametrize("workload", WORKLOADS[:3], ids=lambda w: w.describe())
def test_shared_memory_of_the_code_is_what_the_space_counted(workload):
    """The space's shared-memory estimate (with an NT tile's row padding) is the
    code's, for the kernels nearest the limit and the narrowest (an NT row of 8
    columns pads by 28 words): nvcc refuses a kernel over the limit."""
    kernels = space.space(GPU, workload)
    nearest = sorted(kernels, key=lambda k: -k.shared_bytes(workload))[:3]
    narrowest = sorted(kernels, key=lambda k: (k.block_n, -k.shared_bytes(workload)))[:2]
    for kernel in nearest + narrowest:
        _, body, _ = build.cuda_source(workload, kernel, "k")
        words = sum(int(n) for n in re.findall(r"__shared__ alignas\(\d+\) float \w+\[(\d+)\]", body))
        assert words * 4 == kernel.shared_bytes(workload) <= GPU.shared_bytes_per_block, kernel.name


@pytest.mark.parametrize("workload", WORKLOADS, ids=lambda w: w.describe())
def test_local_padding_leaves_no_check_in_the_compute_loop(workload):
    for kernel in sample(workload):
        blocks = realizes(schedule.schedule(workload, kernel), f"{schedule.ACCUMULATE}_update", "x_pad",
                          schedule.WRITE_BACK)
        update, loops = blocks[f"{schedule.ACCUMULATE}_update"]
        assert isinstance(update.predicate, tirx.IntImm) and update.predicate.value == 1, kernel.name
        assert "if_then_else" not in str(update.block.body), kernel.name
        # the K step and the thread's register tile have constant trip counts and are unrolled
        assert all(isinstance(loop.extent, tirx.IntImm) and loop.kind == tirx.ForKind.UNROLLED
                   for loop in loops[-3:]), kernel.name
        # bounds live in the fetches into shared memory and in the write-back
        assert "if_then_else" in str(blocks["x_pad"][0].block.body), kernel.name
        write_back = blocks[schedule.WRITE_BACK][0]
        assert not isinstance(write_back.predicate, tirx.IntImm), kernel.name


@pytest.mark.parametrize("workload", WORKLOADS, ids=lambda w: w.describe())
def test_pipelined_kernel_copies_the_next_k_step_asynchronously(workload):
    """Two stages: each shared tile has two buffers, every fetch is a cp.async (predicated
    zero-fill where padded) and the threads wait for a K step's copy only before its FMAs;
    the same kernel in one stage has neither."""
    one = space.GpuKernel(32, 32, 2, 2, 8)
    two = dataclasses.replace(one, stages=2)
    assert two.name == one.name + "_s2" and space.GpuKernel.from_name(two.name) == two
    assert space.GpuKernel.from_name(one.name) == one and two.shared_bytes(workload) == 2 * one.shared_bytes(workload)
    _, single, _ = build.cuda_source(workload, one, "k")
    _, pipelined, _ = build.cuda_source(workload, two, "k")
    for body, kernel in ((single, one), (pipelined, two)):
        words = sum(int(n) for n in re.findall(r"__shared__ alignas\(\d+\) float \w+\[(\d+)\]", body))
        assert words * 4 == kernel.shared_bytes(workload)
    assert "cp_async" not in single
    buffers = set(re.findall(r"__shared__ alignas\(\d+\) float (\w+)\[", pipelined))
    assert set(re.findall(r"ptx_cp_async\w*\((\w+)", pipelined)) == buffers and len(buffers) == 2
    assert "wait_group_1()" in pipelined and "commit_group()" in pipelined
    assert not re.search(r"_shared_ptr\[[^]]*\] = \w+_ptr\[", pipelined)  # no synchronous global-to-shared copy


@pytest.mark.parametrize("workload, wide", [
    (WORKLOADS[0], {"x", "w"}),  # K and N static, multiples of 4
    (WORKLOADS[1], {"w"}),       # K = 17: a vector of x would straddle rows; N = 40 pads by whole vectors
    (WORKLOADS[2], {"x"}),       # NT's y is transposed into its tile
    (WORKLOADS[3], {"y"}),       # NN's K is dynamic: x's rows have any stride
], ids=lambda v: v.describe() if isinstance(v, Workload) else "")
def test_pipelined_copies_move_16_bytes_where_the_layout_allows(workload, wide):
    """cp.async copies 16 bytes at once where every vector is one aligned piece of a row
    under one pad condition, 4 elsewhere; the launch rule asks for pointers aligned to
    what the copies need. One-stage kernels copy 4 bytes at a time, as before."""
    kernel = space.GpuKernel(32, 32, 2, 2, 8, stages=2)
    _, body, launch = build.cuda_source(workload, kernel, "k")
    copies = set(re.findall(r"ptx_cp_async_legacy_(?:pred_)?c[ag]_(\d+)_\d+_\d+\(([a-z])_", body))
    operands = set(schedule.operands(workload))
    assert copies == {("16" if o in wide else "4", o) for o in operands}
    assert {o for o in operands if schedule.vector_width(workload, o, kernel) == schedule.VECTOR} == wide
    assert launch.alignment == 16
    _, single, launch = build.cuda_source(workload, dataclasses.replace(kernel, stages=1), "k")
    assert "float4" not in single and launch.alignment == 4


def test_nt_y_tile_runs_along_columns_in_shared_memory():
    """NT's y is stored [.., N, K]; its shared tile is [K, N + 4] so a warp's reads, which run
    along N, hit consecutive words, and the transposing stores spread over the banks."""
    workload = WORKLOADS[2]
    kernel = space.GpuKernel(64, 64, 8, 2, 8)
    realize, _ = realizes(schedule.schedule(workload, kernel), "y_pad")["y_pad"]
    store = realize.block.body
    assert [str(i) for i in store.indices][1:] == [str(realize.block.iter_vars[2].var),
                                                  str(realize.block.iter_vars[1].var)]
    _, body, _ = build.cuda_source(workload, kernel, "k")
    assert "y_pad_shared_ptr[544]" in body  # 8 rows of 64 + 4 words


@pytest.mark.parametrize("workload", WORKLOADS, ids=lambda w: w.describe())
def test_launch_rule_is_the_scheduled_grid(workload):
    """The grid the manifest records equals the extents of the loops bound to blockIdx."""
    analyzer = Analyzer()
    for kernel in sample(workload, 2):
        _, _, launch = build.cuda_source(workload, kernel, "k")
        extents = {}
        update = f"{schedule.ACCUMULATE}_update"
        for loop in realizes(schedule.schedule(workload, kernel), update)[update][1]:
            if loop.thread_binding is not None:
                extents[loop.thread_binding.thread_tag] = loop.extent
        assert (extents["threadIdx.x"], extents["threadIdx.y"]) == tuple(launch.block[:2])
        for values in [(1,) * 4, (2, 3, 5, 7), (3, 100, 40, 17)]:
            dims = {d: min(max(v, getattr(workload, d).lo), getattr(workload, d).hi) for d, v in zip("bmnk", values)}
            grid = [int(analyzer.simplify(tvm_ffi.structural_map(extents[axis], (
                        tirx.Var, lambda v: tirx.const(dims[v.name.lower()], "int32")))))
                    for axis in ("blockIdx.x", "blockIdx.y", "blockIdx.z")]
            assert tuple(grid) == launch.grid_at(dims), (kernel.name, dims)


def test_parameters_follow_the_kernel_signature():
    workload = WORKLOADS[4]
    _, body, launch = build.cuda_source(workload, sample(workload, 1)[0], "w0_k0")
    assert body.startswith('extern "C" __global__') and " w0_k0(" in body
    names = dict(launch.params)
    assert names["x"] == names["y"] == names["addend"] == names["out"] == "pointer"
    assert names["alpha"] == "float32" and names["B"] == names["M"] == names["N"] == "int32"


@pytest.mark.skipif(build.nvcc() is None, reason="needs nvcc (the CUDA toolkit)")
def test_nvcc_builds_a_fatbin_for_every_arch(tmp_path):
    """One source file for kernels of one and two stages: the prelude carries every helper once."""
    workload = WORKLOADS[1]
    kernels = [space.GpuKernel(32, 32, 2, 2, 8), space.GpuKernel(32, 32, 2, 2, 8, stages=2)]
    shapes = {workload.key(): [{"t": 5, "b": 1, "m": 5, "n": 40, "k": 17}]}
    manifest = build.build([(workload, [(kernels[0], None), (kernels[1], {"b": 1, "m": 5, "n": 40, "k": 17}),
                                        (kernels[1], None)])],
                           shapes, tmp_path / "set")
    assert json.loads((tmp_path / "set" / build.MANIFEST).read_text()) == manifest
    assert manifest["archs"] == list(build.ARCHS)
    entry = manifest["workloads"][0]
    fatbin = (tmp_path / "set" / entry["fatbin"]).read_bytes()
    assert len(fatbin) > 1000 and fatbin[:4] == bytes.fromhex("50ed55ba")  # the fatbin magic
    symbolic, static, pipelined = entry["kernels"]
    assert ["M", "int32"] in symbolic["launch"]["params"] and ["M", "int32"] not in static["launch"]["params"]
    assert symbolic["spill_bytes"] == pipelined["spill_bytes"] == 0
    source = (tmp_path / "set" / "w0.cu").read_text()
    assert source.count("void ptx_cp_async_legacy_pred_ca_4_4_4(") == 1


def test_build_refuses_without_nvcc(tmp_path, monkeypatch):
    monkeypatch.setattr(build, "nvcc", lambda: None)
    workload = WORKLOADS[1]
    with pytest.raises(RuntimeError, match="nvcc not found"):
        build.build([(workload, [(sample(workload, 1)[0], None)])], {workload.key(): []}, tmp_path / "set")
    assert not (tmp_path / "set").exists()


def write_record(path, workload, rows):
    """A GPU run's CSV as bench/cuda_kernels.py writes it: rows of (kernel name, static, T, seconds, error)."""
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["workload", "kernel", "static", "t", "b", "m", "n", "k", "seconds", "error"])
        for name, static, t, seconds, error in rows:
            dims = workload.dims_at((t,))
            writer.writerow([workload.describe(), name, static, t, *(dims[d] for d in "bmnk"), seconds, error])


def test_recorded_runner_serves_the_symbolic_kernels_records(tmp_path):
    workload = WORKLOADS[2]
    a, b = sample(workload, 2)
    write_record(tmp_path / "m.csv", workload, [("cublas", False, 5, 1e-6, 0.0), (a.name, False, 5, 2e-6, 1e-7),
                                                 (a.name, True, 5, 1e-9, 0.0), (b.name, False, 5, 3e-6, 0.5)])
    runner = RecordedRunner.load([workload], tmp_path / "m.csv")
    first, second, third = runner.run(workload, [a, b], [(5,), (17,)])[:3]
    assert (first.kernel, first.shape, first.seconds, first.error) == (a, (5,), 2e-6, None)  # not the static build
    assert second.seconds is None and second.error == "not recorded"
    assert third.kernel == b and third.seconds is None and third.error == "wrong result"


def replayed_search(workload):
    """The joint search over the whole space on a record that follows the cost formula
    (each kernel's own throughput times f_occ * f_pad over the SMs, k = 0.8): (result, record)."""
    target = GpuTarget(GPU, 132)
    kernels = target.space(workload)

    def seconds(index, kernel, shape):
        gflops = (100 + index % 13 * 10) * cost_model.shape_factor(workload, kernel, shape, target, 0.8)
        return workload.flops(workload.dims_at(shape)) / (gflops * 1e9)

    record = {(k, s): seconds(i, k, s) for i, k in enumerate(kernels) for s in SAMPLE_SHAPES}
    result = search.search(workload, target, RecordedRunner({workload.key(): record}),
                           search.SearchOptions(trials=len(kernels), batch=64, seed=1), shapes=SAMPLE_SHAPES,
                           progress=False)
    return result, record


SAMPLE_SHAPES = [(t,) for t in (1, 7, 20, 128)]


def test_joint_search_and_dispatch_run_on_a_gpu_target():
    """The search, cost model and dispatch of the CPU serve GPU kernels: the occupancy
    coefficient is learned and the tree sends each recorded shape to its fastest kernel."""
    workload = WORKLOADS[2]
    result, record = replayed_search(workload)
    kernels = {k for k, _ in record}
    assert {m.kernel for m in result.measurements} == kernels
    assert result.model.k == pytest.approx(0.8, abs=0.05)
    chosen = dispatch.build_dispatch(result)
    for shape in SAMPLE_SHAPES:
        fastest = min(kernels, key=lambda k: record[(k, shape)])
        picked = chosen.kernels[chosen.kernel_index(workload.dims_at(shape))]
        assert record[(picked, shape)] == pytest.approx(record[(fastest, shape)]), shape
    assert all(0 <= chosen.kernel_index(workload.dims_at((t,))) < len(chosen.kernels) for t in range(1, 129))


@pytest.mark.skipif(build.nvcc() is None, reason="needs nvcc (the CUDA toolkit)")
def test_cuda_bundle_carries_the_kernels_and_the_compiled_tree(tmp_path):
    chosen = dispatch.build_dispatch(replayed_search(WORKLOADS[2])[0])
    manifest = build.write_bundle([chosen], tmp_path / "bundle")
    entry = manifest["workloads"][0]
    assert [k["name"] for k in entry["kernels"]] == [k.name for k in chosen.kernels]
    assert all(k["static_dims"] is None for k in entry["kernels"])
    assert (tmp_path / "bundle" / entry["fatbin"]).stat().st_size > 1000
    library = ctypes.CDLL(str(tmp_path / "bundle" / manifest["dispatch_library"]))
    tree = getattr(library, entry["dispatch"])
    tree.restype, tree.argtypes = ctypes.c_int64, [ctypes.c_int64] * 4
    workload = chosen.workload
    for t in range(0, 131):
        dims = workload.dims_at((t,))
        assert tree(*(dims[d] for d in "bmnk")) == chosen.kernel_index(dims), t


def test_a_large_set_compiles_in_worker_processes_to_the_same_sources(monkeypatch):
    workload = WORKLOADS[4]
    jobs = [(workload, kernel, f"k{i}", None) for i, kernel in enumerate(sample(workload))]
    one_at_a_time = [build.cuda_source(*job) for job in jobs]
    monkeypatch.setattr(build, "_PARALLEL_FROM", 2)
    assert build.cuda_sources(jobs) == one_at_a_time
