"""Dense micro-kernels: numerically right at every M, and local padding keeps
every bound check out of the compute loop."""

import numpy as np
import pytest
import tensorflow as tf
from tvm import s_tir, tirx

from tf_dietcode import reference
from tf_dietcode.tuning import hardware, measure, micro_kernel
from tf_dietcode.tuning.templates import dense
from tf_dietcode.tuning.workload import Workload

WORKLOADS = [
    Workload("dense", (1, 64), 40, 48, bias=True, activation="gelu"),      # N not a multiple of any tile
    Workload("dense", (1, 128), 96, 64, bias=False, activation="none"),
    Workload("dense", (1, 16), 8, 8, bias=True, activation="relu"),
    Workload("dense", (1, 16), 33, 8, bias=True, activation="tanh"),
    Workload("dense", (1, 16), 9, 16, bias=False, activation="sigmoid"),
    Workload("dense", (1, 32), 24, 17, bias=True, activation="gelu_tanh"),  # prime K
]


def sample_kernels(workload, count, rng):
    space = micro_kernel.dense_space(hardware.detect(), workload)
    return [space[i] for i in rng.choice(len(space), size=count, replace=False)]


def expected(operands, workload):
    as64 = {name: tf.constant(value.astype(np.float64)) for name, value in operands.items()}
    return reference.fused_matmul(as64["x"], as64["w"], as64.get("bias"), transpose_b=True,
                                  activation=workload.activation).numpy()


@pytest.mark.parametrize("workload", WORKLOADS, ids=lambda w: f"n{w.n.hi}_k{w.k.hi}_{w.activation}")
def test_symbolic_kernel_is_right_at_every_m(rng, workload):
    hw = hardware.detect()
    for kernel in sample_kernels(workload, 3, rng):
        executable = measure.compile_kernel(workload, kernel, hw)
        for m in sorted({0, 1, 2, 7, 13, workload.m.lo, workload.m.hi, workload.m.hi + 3,
                         kernel.tile_m, kernel.tile_m + 1}):
            operands = measure.random_operands(workload, m, rng)
            arguments = measure.kernel_arguments(operands, workload, kernel)
            measure.run(executable, arguments)
            np.testing.assert_allclose(arguments[-1].numpy(), expected(operands, workload),
                                       rtol=1e-4, atol=1e-4, err_msg=f"{kernel.name} at M={m}")


def test_pack_weight_layout(rng):
    workload = WORKLOADS[0]
    kernel = micro_kernel.MicroKernel(4, 16, 48, 2, True)
    w = rng.uniform(-1, 1, (40, 48)).astype(np.float32)
    packed = dense.pack_weight(w, workload, kernel)
    assert packed.shape == (4, 48, 16)  # 40 columns -> 2 tasks of 2 blocks of 16
    for j in range(64):
        np.testing.assert_array_equal(packed[j // 16, :, j % 16], w[j] if j < 40 else 0)


def enclosing_loops_and_predicate(mod, block_name):
    sch = s_tir.Schedule(mod)
    loops = [sch.get(loop) for loop in sch.get_loops(sch.get_sblock(block_name))]
    return loops, loops[-1].body


@pytest.mark.parametrize("workload", WORKLOADS, ids=lambda w: f"n{w.n.hi}_k{w.k.hi}")
def test_local_padding_leaves_no_check_in_the_compute_loop(rng, workload):
    for kernel in sample_kernels(workload, 5, rng):
        mod = dense.schedule(workload, kernel)
        loops, realize = enclosing_loops_and_predicate(mod, f"{dense.COMPUTE_BLOCK}_update")
        assert loops[0].kind == tirx.ForKind.PARALLEL
        # Inside the parallel task every loop has a constant trip count ...
        assert all(isinstance(loop.extent, tirx.IntImm) for loop in loops[1:]), kernel.name
        # ... the block runs unconditionally, and its body has no select.
        assert isinstance(realize.predicate, tirx.IntImm) and realize.predicate.value == 1, kernel.name
        assert "if_then_else" not in str(realize.block.body)
        # The checks live in the fetch (zero fill past M) and the write-back
        # (one-row tiles never pad M, so they need none).
        if kernel.tile_m > 1:
            _, fetch = enclosing_loops_and_predicate(mod, "x_pad")
            assert "if_then_else" in str(fetch.block.body)
            _, write_back = enclosing_loops_and_predicate(mod, "out")
            assert not isinstance(write_back.predicate, tirx.IntImm), kernel.name
