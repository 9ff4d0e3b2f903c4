"""TransposeInRegisters: a transposing copy of constant extents becomes whole
blocks transposed in registers plus the element copy of the rest, copying what
it copied before at every vector width; other copies are left alone; batch
matmul NT's y fetch is such a copy where its extents are constant."""

import numpy as np
import pytest
import tvm
import tvm_ffi
from tvm.script import tirx as T
from tvm.tirx import stmt as tir_stmt

from lowered_kernels import assert_computes_the_product, build_seen_after, compile_seen_after
from tf_dietcode.tuning import hardware
from tf_dietcode.tuning.micro_kernel import MicroKernel
from tf_dietcode.tuning.workload import Workload

ROW = 48  # the source's row stride and the tile's row length, in floats


@T.prim_func
def copies(a: T.handle, b: T.handle, c: T.handle, columns: T.int64, rows: T.int64):
    A = T.match_buffer(a, (T.int64(ROW * ROW),))
    B = T.match_buffer(b, (T.int64(ROW * ROW),))
    C = T.match_buffer(c, (T.int64(ROW * ROW),))
    for i in range(T.int64(37)):  # B[k, i] = A[i, k]: columns and k rows past the whole blocks
        for k in range(T.int64(24)):
            B[k * T.int64(ROW) + i] = A[i * T.int64(ROW) + k]
    for i in range(T.int64(32)):  # through a binding, into B's rows 24..43
        offset: T.let[T.int64] = i * T.int64(ROW)
        for k in range(T.int64(20)):
            B[k * T.int64(ROW) + i + T.int64(ROW * 24)] = A[offset + k + T.int64(8)]
    for i in range(columns):  # symbolic extents: left alone
        for k in range(rows):
            C[k * T.int64(ROW) + i] = A[i * T.int64(ROW) + k]


def _reference(a: np.ndarray, columns: int, rows: int) -> tuple[np.ndarray, np.ndarray]:
    grid = a.reshape(ROW, ROW)
    b, c = np.zeros((ROW, ROW), np.float32), np.zeros((ROW, ROW), np.float32)
    b[:24, :37] = grid[:37, :24].T
    b[24:44, :32] = a[8:8 + 32 * ROW].reshape(32, ROW)[:, :20].T
    c[:rows, :columns] = grid[:columns, :rows].T
    return b.ravel(), c.ravel()


def _shuffles(node) -> int:
    found = []
    tvm_ffi.structural_walk(node, (tvm.tirx.Shuffle, found.append))
    return len(found)


WIDTHS = {"x86-64": 4, "haswell": 8, "skylake-avx512": 16}  # mcpu -> float32 lanes
NEEDS = {"x86-64": (), "haswell": ("avx2", "fma"), "skylake-avx512": ("avx512f",)}


@pytest.mark.parametrize("mcpu", WIDTHS)
def test_blocks_and_the_rest_copy_what_the_element_copy_did(mcpu):
    if not set(NEEDS[mcpu]) <= set(hardware.detect().features):
        pytest.skip(f"this CPU cannot run {mcpu} code")
    executable, module = compile_seen_after("tf_dietcode.TransposeInRegisters", copies,
                                            tvm.target.Target({"kind": "llvm", "mcpu": mcpu}))
    lowered = module["copies"]
    lanes = WIDTHS[mcpu]
    per_block = lanes * lanes.bit_length() - lanes  # lanes * log2(lanes) shuffles
    assert _shuffles(lowered) == 2 * per_block  # one block body per copy of constant extents
    rng = np.random.default_rng(0)
    for columns, rows in [(0, 0), (3, 17), (37, 24), (ROW, ROW)]:
        a = rng.standard_normal(ROW * ROW).astype(np.float32)
        tensors = [tvm.runtime.tensor(array) for array in (a, np.zeros_like(a), np.zeros_like(a))]
        executable["copies"](*tensors, columns, rows)
        for got, expected in zip((t.numpy() for t in tensors[1:]), _reference(a, columns, rows)):
            np.testing.assert_array_equal(got, expected, err_msg=f"{mcpu} {columns}x{rows}")


NT = Workload("batch_matmul", (1, 128), (1, 128), 64, b=192, ties=("m", "n"))
NT_K40 = Workload("batch_matmul", (1, 128), (1, 128), 40, b=5, ties=("m", "n"))  # k past the whole blocks
STATIC = {"b": 192, "m": 128, "n": 128, "k": 64}
WHOLE_BATCH = MicroKernel(5, 32, 32, 1, True, whole_batch=True)


@pytest.mark.parametrize("workload,kernel,dims", [(NT, WHOLE_BATCH, STATIC), (NT, WHOLE_BATCH, None),
                                                  (NT, MicroKernel(7, 48, 32, 2, False, whole_batch=True), None),
                                                  (NT, MicroKernel(3, 64, 64, 1, False), STATIC),
                                                  (NT, MicroKernel(3, 64, 64, 1, False), None),
                                                  (NT_K40, MicroKernel(4, 32, 40, 1, False, whole_batch=True), None)],
                         ids=["static_whole_batch", "symbolic_whole_batch", "symbolic_whole_batch_wide",
                              "static_column_tasks", "symbolic_column_tasks", "symbolic_k_past_the_blocks"])
def test_batch_matmul_nt_fetches_y_in_register_blocks(workload, kernel, dims):
    """NT's y fetch is a transposing copy, in blocks wherever its extents are constant (every
    column task of a static build; the whole column tasks of a whole_batch kernel) and where its
    columns stop at a symbolic N in a whole_batch kernel (the last column task, whose columns past
    N repeat column N - 1). A symbolic kernel of column tasks keeps the element copy (LLVM took
    10 s to compile it in blocks), and so does k past the whole blocks, up to N. The zero fill of
    the tile's padding stays exactly where an element copy does: the blocks overwrite all of it."""
    executable, lowered = build_seen_after("tf_dietcode.TransposeInRegisters", workload, kernel, dims)
    stores = []
    tvm_ffi.structural_walk(lowered.body, (tir_stmt.BufferStore, stores.append))
    element_copies = [store for store in stores if store.buffer.name.startswith("y")
                      and isinstance(store.value, tvm.ir.TensorLoad)
                      and tvm.DataType(str(store.value.ty.dtype)).lanes == 1]
    assert (_shuffles(lowered) > 0) == (dims is not None or kernel.whole_batch)
    assert bool(element_copies) == ((dims is None and not kernel.whole_batch)
                                    or workload.k.hi % hardware.detect().vector_lanes != 0)
    fills = [store for store in stores
             if store.buffer.name.startswith("y") and isinstance(store.value, tvm.tirx.FloatImm)]
    assert bool(fills) == bool(element_copies)
    assert_computes_the_product(executable, workload, kernel, [128] if dims else [1, 5, 15, 16, 17, 43, 100, 128])
