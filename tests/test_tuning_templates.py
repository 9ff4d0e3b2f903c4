"""Micro-kernel templates: numerically right at every shape, and local padding
keeps every bound check out of the compute loop."""

import dataclasses
import itertools

import numpy as np
import pytest
import tvm
from tvm import s_tir, tirx

from tf_dietcode.tuning import hardware, measure, micro_kernel, templates
from tf_dietcode.tuning.templates import dense
from tf_dietcode.tuning.tir_passes.ir import uses
from tf_dietcode.tuning.workload import Workload

WORKLOADS = [
    Workload("dense", (1, 64), 40, 48, bias=True, activation="gelu"),      # N not a multiple of any tile
    Workload("dense", (1, 128), 96, 64),
    Workload("dense", (1, 32), 24, 17, bias=True, activation="gelu_tanh"),  # prime K
    Workload("dense", (1, 16), 8, 8, bias=True, activation="relu"),
    Workload("dense", (1, 16), 33, 8, bias=True, activation="tanh"),
    Workload("dense", (1, 16), 9, 16, activation="sigmoid"),
    Workload("dense", (1, 64), 48, 40, bias=True, activation="gelu", weight_layout="in_place"),
    Workload("dense", (1, 32), 24, 17, activation="silu", weight_layout="in_place"),  # in place, prime K
    Workload("batch_matmul", (1, 40), (1, 40), 16, b=6, ties=("m", "n")),           # scores: q k^T
    Workload("batch_matmul", (1, 40), 32, (1, 40), b=6, transpose_b=False, ties=("m", "k")),  # probs v
    Workload("batch_matmul", (0, 9), (1, 23), (2, 13), b=(1, 3), transpose_b=False),  # all dynamic
    Workload("batch_matmul", (1, 40), (1, 40), 16, b=(2, 6), bias=True, ties=("m", "n")),  # scores + mask
    Workload("dense", (1, 40), 96, 24, bias=True, activation="relu", weight_layout="packed", groups=3),  # Q/K/V
]


def ids(workload):
    return "_".join([workload.kind, *(f"{d}{getattr(workload, d).lo}-{getattr(workload, d).hi}"
                                      for d in ("b", "m", "n", "k")), "nt" if workload.transpose_b else "nn",
                                      *(["bias"] if workload.bias else []),
                                      *([f"groups{workload.groups}"] if workload.groups > 1 else [])])


def sample_kernels(workload, count, rng):
    space = micro_kernel.space(hardware.detect(), workload)
    return [space[i] for i in rng.choice(len(space), size=min(count, len(space)), replace=False)]


def edge_shapes(workload, rng):
    """Range ends, one past the end, 1, primes and random values of every shape variable."""
    ranges = [size for _, size in workload.variables()]
    shapes = {tuple(r.lo for r in ranges), tuple(r.hi for r in ranges), tuple(r.hi + 3 for r in ranges),
              tuple(min(max(v, r.lo), r.hi) for r, v in zip(ranges, (1, 7, 13, 5)))}
    shapes |= {tuple(int(rng.integers(r.lo, r.hi + 4)) for r in ranges) for _ in range(4)}
    return sorted(shapes)


def assert_right_at_edge_shapes(workload, kernel, rng, atol=1e-4):
    """The symbolic kernel against the float64 reference at edge_shapes."""
    template = templates.for_workload(workload)
    executable = measure.compile_kernel(workload, kernel, hardware.detect())
    for shape in edge_shapes(workload, rng):
        dims = workload.dims_at(shape)
        operands = template.random_operands(workload, dims, rng)
        arguments = template.kernel_arguments(operands, workload, kernel)
        measure.run(executable, arguments)
        np.testing.assert_allclose(arguments[-1].numpy(), template.reference_output(operands, workload),
                                   rtol=1e-4, atol=atol, err_msg=f"{kernel.name} at {dims}")


@pytest.mark.parametrize("workload", WORKLOADS, ids=ids)
def test_symbolic_kernel_is_right_at_every_shape(rng, workload):
    for kernel in sample_kernels(workload, 3, rng):
        assert_right_at_edge_shapes(workload, kernel, rng)


@pytest.mark.parametrize("task_m", [4, 0], ids=["row_tasks", "every_row"])
def test_in_place_row_tasks_share_one_copied_panel(rng, task_m):
    """task_m != 1 with the weight in place: a task copies its panel once (inside the
    parallel task loop, before its row tiles, vectorized) and the register tile reads
    the copy, right at every shape (rows padded to whole row tasks, or to whole tiles
    where a task runs every row tile)."""
    workload = WORKLOADS[6]
    kernel = micro_kernel.MicroKernel(3, 16, 40, 1, False, task_m=task_m)
    assert kernel in micro_kernel.space(hardware.detect(), workload)
    sch = s_tir.Schedule(dense.schedule(workload, kernel))
    copy_loops = [sch.get(loop) for loop in sch.get_loops(sch.get_sblock("w_global"))]
    assert len(copy_loops) == 4 and copy_loops[0].kind == tirx.ForKind.PARALLEL
    assert copy_loops[-1].kind == tirx.ForKind.VECTORIZED
    reads = {str(region.source) for region in sch.get(sch.get_sblock(f"{dense.COMPUTE_BLOCK}_update")).reads}
    assert "w_global" in reads and "w" not in reads
    assert_right_at_edge_shapes(workload, kernel, rng)


def test_column_tasks_run_every_row_tile(rng):
    """task_m = 0 with a packed weight: the only parallel loop is over column tasks
    (each panel read by one core for every row tile), right at every shape."""
    workload = WORKLOADS[0]
    hw = hardware.detect()
    lanes = hw.vector_lanes
    kernel = micro_kernel.MicroKernel(3, lanes, 48, 1, False, packed=True, task_m=0)
    assert kernel in micro_kernel.space(hw, workload)
    sch = s_tir.Schedule(dense.schedule(workload, kernel))
    loops = [sch.get(loop) for loop in sch.get_loops(sch.get_sblock(f"{dense.COMPUTE_BLOCK}_update"))]
    assert [loop.kind for loop in loops].count(tirx.ForKind.PARALLEL) == 1
    panels = -(-40 // lanes)  # 40 columns: 5 panels of 8 (AVX2), 3 of 16 (AVX-512)
    assert loops[0].kind == tirx.ForKind.PARALLEL and int(loops[0].extent) == panels
    assert dense.task_count(workload, kernel, {"m": 64}) == panels
    assert dense.computed_elements(workload, kernel, {"m": 64}) == 66 * panels * lanes  # rows padded to 3
    assert_right_at_edge_shapes(workload, kernel, rng)


@pytest.mark.parametrize("workload", [WORKLOADS[8], WORKLOADS[9], WORKLOADS[11]], ids=ids)
def test_whole_batch_tasks_run_their_column_tasks_in_turn(rng, workload):
    """whole_batch: the only parallel loop is over the batch (B * H), each task running
    every column task with its own y panel, right at every shape; the space offers
    it only where N spans more than one column task."""
    hw = hardware.detect()
    kernel = micro_kernel.MicroKernel(2, hw.vector_lanes, workload.k.hi, 1, False, whole_batch=True)
    space = micro_kernel.space(hw, workload)
    assert kernel in space
    assert all(not k.whole_batch for k in space if k.tile_n * k.task_n >= workload.n.hi)
    sch = s_tir.Schedule(templates.for_workload(workload).schedule(workload, kernel))
    loops = [sch.get(loop) for loop in sch.get_loops(sch.get_sblock(f"{templates.batch_matmul.COMPUTE_BLOCK}_update"))]
    assert [loop.kind for loop in loops].count(tirx.ForKind.PARALLEL) == 1
    assert loops[0].kind == tirx.ForKind.PARALLEL and str(loops[0].extent) == "B * H"
    dims = workload.dims_at(tuple(size.hi for _, size in workload.variables()))
    assert templates.batch_matmul.task_count(workload, kernel, dims) == dims["b"]
    assert_right_at_edge_shapes(workload, kernel, rng)


@pytest.mark.parametrize("transpose_b", [False, True], ids=["nn", "nt"])
def test_whole_batch_over_a_static_n_with_a_partial_last_column_task(rng, transpose_b):
    """N = 40 in column tasks of 32: LoopPartition leaves a one-iteration piece of the column-task
    loop, which it used to inline with an int32 index into int64 code, and the kernel did not
    compile (tir_passes.pipeline.PASS_CONFIG says more)."""
    workload = Workload("batch_matmul", (1, 40), 40, (1, 40) if not transpose_b else 16, b=6,
                        transpose_b=transpose_b, ties=("m", "k") if not transpose_b else ())
    assert_right_at_edge_shapes(workload, micro_kernel.MicroKernel(2, 32, 40, 1, False, whole_batch=True), rng)


@pytest.mark.parametrize("workload", [WORKLOADS[0], WORKLOADS[6], WORKLOADS[8]], ids=ids)
def test_odd_vector_counts_vectorize_in_whole_registers(rng, workload):
    """A register tile three vectors wide is vectorized in power-of-two pieces
    (LLVM split a <24 x float> into shuffles: 5-7x slower), right at every shape."""
    hw = hardware.detect()
    tile_n = 3 * hw.vector_lanes
    kernel = max((k for k in micro_kernel.space(hw, workload) if k.tile_n == tile_n and k.tile_m == 2),
                 key=lambda k: k.task_m)  # in place, task_m > 1: the panel copy is vectorized too
    sch = s_tir.Schedule(templates.for_workload(workload).schedule(workload, kernel))
    vectorized = [sch.get(loop) for block in sch.get_child_blocks(sch.get_sblock("root"))
                  for loop in sch.get_loops(block) if sch.get(loop).kind == tirx.ForKind.VECTORIZED]
    assert vectorized and all(int(loop.extent) == hw.vector_lanes for loop in vectorized), kernel.name
    assert_right_at_edge_shapes(workload, kernel, rng)


@pytest.mark.parametrize("workload,shape", [(WORKLOADS[0], (1,)), (WORKLOADS[8], (29,)), (WORKLOADS[8], (1,)),
                                            (WORKLOADS[9], (1,))], ids=lambda v: ids(v) if isinstance(v, Workload) else v)
def test_static_compile_matches_symbolic(rng, workload, shape):
    hw = hardware.detect()
    kernel = sample_kernels(workload, 1, rng)[0]
    dims = workload.dims_at(shape)
    operands = templates.for_workload(workload).random_operands(workload, dims, rng)
    outputs = []
    for compiled_dims in (None, dims):
        arguments = templates.for_workload(workload).kernel_arguments(operands, workload, kernel)
        measure.run(measure.compile_kernel(workload, kernel, hw, compiled_dims), arguments)
        outputs.append(arguments[-1].numpy())
    np.testing.assert_allclose(*outputs, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("workload", [WORKLOADS[8], WORKLOADS[11]], ids=ids)
def test_batch_matmul_nt_fetches_its_y_tile_where_nothing_is_padded(rng, workload):
    """NT's y tile, transposed to [K, columns], is part of the micro-kernel: a static
    build whose shape divides every tile fetches it as the symbolic build does,
    instead of reading y in place as gathered vectors, and computes the same result."""
    hw = hardware.detect()
    kernel = micro_kernel.MicroKernel(2, hw.vector_lanes, 16, 1, False)
    assert kernel in micro_kernel.space(hw, workload)
    dims = workload.dims_at(tuple(2 * hw.vector_lanes if "n" in names else size.hi
                                  for names, size in workload.variables()))
    assert dims["n"] % kernel.tile_n == 0 and dims["k"] % kernel.tile_k == 0  # nothing to pad along N or K
    template = templates.for_workload(workload)
    sch = s_tir.Schedule(template.schedule(workload, kernel, dims))
    reads = {str(region.source) for region in sch.get(sch.get_sblock(f"{template.COMPUTE_BLOCK}_update")).reads}
    assert "y" not in reads and len(reads) == 3, reads  # the accumulator, x and the fetched y tile
    operands = template.random_operands(workload, dims, rng)
    arguments = template.kernel_arguments(operands, workload, kernel)
    measure.run(measure.compile_kernel(workload, kernel, hw, dims), arguments)
    np.testing.assert_allclose(arguments[-1].numpy(), template.reference_output(operands, workload),
                               rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("workload", [WORKLOADS[8], WORKLOADS[9], WORKLOADS[11]], ids=ids)
def test_batch_matmul_reads_x_in_place(rng, workload):
    """x rows past M are read in place, clamped to row M - 1 (no copy), whether K is
    static or dynamic (never padded). Right at every M from 0 (no row tile) past the range."""
    hw = hardware.detect()
    kernel = next(k for k in micro_kernel.space(hw, workload) if k.tile_m == 3)  # rows padded at most M
    template = templates.for_workload(workload)
    sch = s_tir.Schedule(template.schedule(workload, kernel))
    reads = {str(region.source): str(region) for region in
             sch.get(sch.get_sblock(f"{template.COMPUTE_BLOCK}_update")).reads}
    assert "x_pad" not in reads and "T.min(" in reads["x"], reads
    executable = measure.compile_kernel(workload, kernel, hw)
    for m in (0, 1, 2, 3, 4, 7, workload.m.hi, workload.m.hi + 2):
        dims = workload.dims_at(tuple(m if "m" in names else size.hi for names, size in workload.variables()))
        operands = template.random_operands(workload, dims, rng)
        arguments = template.kernel_arguments(operands, workload, kernel)
        measure.run(executable, arguments)
        np.testing.assert_allclose(arguments[-1].numpy(), template.reference_output(operands, workload),
                                   rtol=1e-4, atol=1e-4, err_msg=f"M = {m}")


def test_weight_layouts_of_the_space():
    """A dense space holds both weight layouts unless the workload fixes one; a weight
    read in place is never padded, so its tasks split N exactly, and its tasks may run
    several row tiles from a copied panel; a packed one's tasks may split N only."""
    hw = hardware.detect()
    for layout, expected in (("any", {True, False}), ("packed", {True}), ("in_place", {False})):
        space = micro_kernel.space(hw, Workload("dense", (1, 64), 48, 40, weight_layout=layout))
        assert {k.packed for k in space} == expected
        assert all(48 % (k.tile_n * k.task_n) == 0 for k in space if not k.packed)
        # Row tasks that copy their panel exist only where the weight must stay in place.
        packed_task_m = {"any": {1, 0}, "packed": {1, 0}, "in_place": set()}[layout]
        assert {k.task_m for k in space if k.packed} == packed_task_m
        in_place_task_m = {"any": {1}, "packed": set(), "in_place": {1, 0, 4, 8, 16}}[layout]
        assert {k.task_m for k in space if not k.packed} == in_place_task_m
    assert not any(k.packed for k in micro_kernel.space(hw, WORKLOADS[8]))
    grouped = micro_kernel.space(hw, WORKLOADS[12])  # three layers of 32 columns: tasks never straddle two
    assert grouped and all(k.packed and 32 % (k.tile_n * k.task_n) == 0 for k in grouped)


@pytest.mark.parametrize("workload", [
    Workload("dense", (1, 16), 16, 8209),  # a prime K: no K block but K itself, whose panel outgrows half of L2
    Workload("batch_matmul", (1, 4), 16, (1, 20000), b=2, transpose_b=False)], ids=ids)  # a task's panel of all K
def test_cache_limits_never_empty_the_space(rng, workload):
    """Where no kernel's panels fit the caches (8 and 16 lanes, 512 KiB and 1 MiB of L2), the
    space keeps the kernels of the smallest panel rather than none, and they compute right."""
    hw = hardware.detect()
    for lanes, l2_bytes in itertools.product((8, 16), (512 << 10, 1 << 20)):
        limits = dataclasses.replace(hw, vector_lanes=lanes, vector_registers=2 * lanes, l2_bytes=l2_bytes)
        assert micro_kernel.space(limits, workload), (lanes, l2_bytes)
    for kernel in sample_kernels(workload, 2, rng):  # float32 sums of 20000 products of unit normals: ~1e-3 off
        assert_right_at_edge_shapes(workload, kernel, rng, atol=4e-3)


@pytest.mark.parametrize("workload", [WORKLOADS[8], WORKLOADS[9], WORKLOADS[10]], ids=ids)
def test_batch_matmul_blocks_k_only_around_column_blocks(rng, workload):
    """A batch-matmul kernel splits K only where each block encloses several column blocks;
    elsewhere it loops over K once (a dynamic K's partial block made LLVM spill the register
    tile), and the space holds one such kernel per tiling, not one per tile_k. Nor does it hold
    a block as long as K's maximum, the order of the kernel with K inside the column blocks."""
    space = micro_kernel.space(hardware.detect(), workload)
    blocked = [k for k in space if micro_kernel.blocks_the_reduction(workload, k.k_outer, k.task_n)]
    assert all(k.k_outer and k.task_n > 1 and k.tile_k < workload.k.hi for k in blocked)
    assert all(k.tile_k == workload.k.hi for k in space if k not in blocked)
    template = templates.for_workload(workload)
    for kernel in sample_kernels(workload, 2, rng) + blocked[-1:]:
        loops, realize = enclosing_loops_and_realize(template.schedule(workload, kernel),
                                                     f"{template.COMPUTE_BLOCK}_update")
        reduction = next(value for value, var in zip(realize.iter_values, realize.block.iter_vars)
                         if var.iter_type == tirx.IterVar.CommReduce)
        k_loops = [int(loop.extent) if isinstance(loop.extent, tirx.IntImm) else str(loop.extent)
                   for loop in loops if uses(reduction, [loop.loop_var])]
        k = workload.k.hi if workload.k.static else "K"
        assert k_loops[-1:] == ([kernel.tile_k] if kernel in blocked else [k]), kernel.name
        assert len(k_loops) == (2 if kernel in blocked else 1), kernel.name
        assert_right_at_edge_shapes(workload, kernel, rng)


def machine_code(workload, kernel) -> list[str]:
    """The kernel's assembly: instructions and branch labels, without directives and comments."""
    source = measure.compile_kernel(workload, kernel, hardware.detect()).mod.inspect_source("asm")
    return [line for line in source.splitlines()
            if not line.strip().startswith((".", "#")) or line.strip().startswith(".LBB")]


@pytest.mark.parametrize("workload", [WORKLOADS[1], WORKLOADS[6], WORKLOADS[9], WORKLOADS[12]], ids=ids)
def test_the_space_holds_one_of_two_loop_orders_that_compile_alike(rng, workload):
    """Where a task has one K block or one column block, K outside and K inside are the same
    program, and the space keeps only K inside; the twins it drops compile to the same code."""
    hw = hardware.detect()
    space = micro_kernel.space(hw, workload)
    assert all(micro_kernel.orders_the_loops(workload, k.tile_k, k.task_n) for k in space if k.k_outer)
    twins = [(k, dataclasses.replace(k, k_outer=True)) for k in space if not k.k_outer]
    dropped = [(kernel, twin) for kernel, twin in twins if twin not in space  # but allowed by the other rules
               and twin.tile_k in micro_kernel._reduction_blocks(hw, workload, twin.tile_n, True, twin.task_n)]
    assert dropped
    for index in rng.choice(len(dropped), size=2, replace=False):
        kernel, twin = dropped[index]
        assert machine_code(workload, kernel) == machine_code(workload, twin), kernel.name


def test_loop_orders_differ_with_several_k_and_column_blocks():
    workload = WORKLOADS[1]  # K = 64 in blocks of 32, two column blocks per task
    outside = micro_kernel.MicroKernel(4, 16, 32, 2, True, packed=True)
    inside = dataclasses.replace(outside, k_outer=False)
    space = micro_kernel.space(hardware.detect(), workload)
    assert outside in space and inside in space
    assert machine_code(workload, outside) != machine_code(workload, inside)


def test_pack_weight_layout(rng):
    workload = WORKLOADS[0]
    kernel = micro_kernel.MicroKernel(4, 16, 48, 2, True, packed=True)
    w = rng.uniform(-1, 1, (40, 48)).astype(np.float32)
    assert dense.weight_blocks(workload, kernel) == 4  # 40 columns -> 2 tasks of 2 blocks of 16
    packed = dense.pack_weight(w, kernel.tile_n, 4)
    assert packed.shape == (4, 48, 16)
    for j in range(64):
        np.testing.assert_array_equal(packed[j // 16, :, j % 16], w[j] if j < 40 else 0)


def enclosing_loops_and_realize(mod, block_name):
    sch = s_tir.Schedule(mod)
    block = templates.optional_block(sch, block_name)
    if block is None:
        return None, None
    loops = [sch.get(loop) for loop in sch.get_loops(block)]
    return loops, loops[-1].body


def padded_axes(source: tirx.Buffer, fill) -> list[str]:
    """`extent <= index` for each axis along which the fill's tile is larger than the operand."""
    return [f"{extent} <= {value}" for extent, value, axis in zip(source.shape, fill.iter_values, fill.block.iter_vars)
            if str(extent) != str(axis.dom.extent)]


@pytest.mark.parametrize("workload", WORKLOADS, ids=ids)
def test_local_padding_leaves_no_check_in_the_compute_loop(rng, workload):
    template = templates.for_workload(workload)
    for kernel in sample_kernels(workload, 5, rng):
        mod = template.schedule(workload, kernel)
        loops, realize = enclosing_loops_and_realize(mod, f"{template.COMPUTE_BLOCK}_update")
        assert loops[0].kind == tirx.ForKind.PARALLEL
        # The register tile and the K block (where K is blocked) have constant trip counts ...
        blocked = micro_kernel.blocks_the_reduction(workload, kernel.k_outer, kernel.task_n)
        assert all(isinstance(loop.extent, tirx.IntImm) for loop in loops[-3 if blocked else -2:]), kernel.name
        # ... the block runs unconditionally (but for a dynamic K's last, shorter block: a check
        # LoopPartition and ShrinkGuardedLoops turn into loop bounds, see test_guarded_loops), and
        # its body has no select.
        if workload.k.static or not blocked:
            assert isinstance(realize.predicate, tirx.IntImm) and realize.predicate.value == 1, kernel.name
        else:
            assert str(realize.predicate).startswith("T.likely(") and str(realize.predicate).endswith(" < K)")
        assert "if_then_else" not in str(realize.block.body)
        # Bounds live where data enters (fetch) and leaves (write-back predicate). The fetch
        # copies with no select per element; a fill zeroes the rest of the tile (scratch memory
        # left there reads as denormal floats, slow on Intel cores outside TF's threads).
        for fetch in ("x_pad", "y_pad"):
            _, fetch_realize = enclosing_loops_and_realize(mod, fetch)
            if fetch_realize is not None:
                assert "if_then_else" not in str(fetch_realize.block.body), (kernel.name, fetch)
                _, zero_realize = enclosing_loops_and_realize(mod, f"{fetch}_pad_const")
                padded = padded_axes(fetch_realize.block.reads[0].source, zero_realize)
                assert padded and str(zero_realize.predicate).endswith(" or ".join(padded)), (kernel.name, fetch)
        _, write_realize = enclosing_loops_and_realize(mod, "out")
        if kernel.tile_m > 1 and not workload.m.static:  # rows padded past a dynamic M
            assert not isinstance(write_realize.predicate, tirx.IntImm), kernel.name


def test_erf_is_accurate_and_vectorizable():
    """The GELU write-back's erf: Eigen's rational form, not a scalar libm call per element."""
    from scipy.special import erf as exact

    from tf_dietcode.tuning.templates import activation

    x = tvm.te.placeholder((4096,), "float32", name="x")
    y = tvm.te.compute((4096,), lambda i: activation.erf(x[i]), name="y")
    executable = tvm.compile(tvm.IRModule({"main": tvm.te.create_prim_func([x, y])}),
                             target=hardware.detect().target())
    points = np.linspace(-6, 6, 4096).astype(np.float32)
    out = tvm.runtime.tensor(np.zeros(4096, np.float32))
    executable.mod["main"](tvm.runtime.tensor(points), out)
    assert np.abs(out.numpy() - exact(points.astype(np.float64))).max() < 3e-7
    assert "erf" not in executable.mod.inspect_source("asm").replace("__tvm", "")
