"""The AMX tiles of the int8 and bfloat16 dense ops (ops/amx_tiles.cc), run on any x86-64 CPU: the file is
built against tests/amx_emulation, whose <immintrin.h> runs the tile instructions in software and records
every use the hardware would refuse (an unconfigured tile, shapes that disagree, a bad configuration) and
every tile row read or written outside the test's buffers. Each kernel call is compared with the exact
integer product (int8) or a float64 one of the same bfloat16 values, on weights packed by
tf_dietcode.precision.packing, with garbage in the activation rows' padding. The op tests run the real
instructions where the CPU has AMX."""

import ctypes
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from tf_dietcode.op_contract import LOW_PRECISION_BLOCK_COLUMNS, LOW_PRECISION_GROUP_BYTES
from tf_dietcode.precision import bf16_weights, packing

ROOT = pathlib.Path(__file__).resolve().parents[1]
TILE_ROWS, TILE_COLUMNS, ROW_ALIGNMENT = 16, 2 * LOW_PRECISION_BLOCK_COLUMNS, 64
# K around the 16-group tile steps (whole steps, a tail, both), and BERT's 768 and 3072.
KS = [1, 3, 4, 5, 61, 64, 65, 127, 128, 130, 768, 3072]
NS = [1, 16, 17, 32]


@pytest.fixture(scope="module")
def amx(tmp_path_factory) -> ctypes.CDLL:
    """ops/amx_tiles.cc built with the emulated intrinsics, with C entry points."""
    out = tmp_path_factory.mktemp("amx_emulated")
    subprocess.run([sys.executable, str(ROOT / "ops" / "op_contract_header.py"), str(ROOT / "ops" / "op_contract.json"),
                    str(out / "op_contract.h")], check=True)
    emulation = ROOT / "tests" / "amx_emulation"
    library = out / "libamx_emulated.so"
    subprocess.run(["g++", "-std=c++17", "-O1", "-shared", "-fPIC", "-Wall", "-Werror", f"-I{emulation}",
                    f"-I{ROOT / 'ops'}", f"-I{out}", str(ROOT / "ops" / "amx_tiles.cc"), str(emulation / "amx_entry.cc"),
                    "-o", str(library)], check=True)
    lib = ctypes.CDLL(str(library))
    lib.amx_emulation_fault.restype = ctypes.c_char_p
    lib.amx_emulation_allow.argtypes = [ctypes.c_void_p, ctypes.c_int64]
    for name in ("amx_int8_tile", "amx_bf16_tile"):
        getattr(lib, name).argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_void_p, ctypes.c_int64,
                                       ctypes.c_int, ctypes.c_void_p]
    return lib


def prepared_rows(values: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, int]:
    """Activation rows [16, K] as the ops prepare them (each row on its own 64-byte lines), with random
    bytes instead of the ops' zeros after each row's groups: the kernels must not read them."""
    row_bytes = values.shape[1] * values.itemsize
    groups = -(-row_bytes // LOW_PRECISION_GROUP_BYTES)
    stride = -(-groups * LOW_PRECISION_GROUP_BYTES // ROW_ALIGNMENT) * ROW_ALIGNMENT
    rows = rng.integers(0, 256, (TILE_ROWS, stride), dtype=np.uint8)
    rows[:, :row_bytes] = values.view(np.uint8).reshape(TILE_ROWS, row_bytes)
    rows[:, row_bytes:groups * LOW_PRECISION_GROUP_BYTES] = 0  # the group padding the packed weight has too
    return rows, stride


def run_tiles(lib: ctypes.CDLL, name: str, rows: np.ndarray, stride: int, packed: np.ndarray,
              c_dtype: type) -> np.ndarray:
    """The kernel over every block pair of `packed`, as the ops call it: c [16, blocks * 16]."""
    blocks, groups = packed.shape[:2]
    block_bytes = packed[0].nbytes
    out = np.zeros((TILE_ROWS, blocks * LOW_PRECISION_BLOCK_COLUMNS), c_dtype)
    lib.amx_emulation_reset()
    lib.amx_emulation_allow(rows.ctypes.data, rows.nbytes)
    lib.amx_emulation_allow(packed.ctypes.data, packed.nbytes)
    for block in range(0, blocks, 2):
        c = np.full((TILE_ROWS, TILE_COLUMNS), -7, c_dtype)  # stale values the kernel must overwrite
        lib.amx_emulation_allow(c.ctypes.data, c.nbytes)
        pair = min(2, blocks - block)
        getattr(lib, name)(rows.ctypes.data, stride, TILE_ROWS, packed.ctypes.data + block * block_bytes, groups, pair,
                           c.ctypes.data)
        fault = lib.amx_emulation_fault().decode()
        assert not fault, f"{name}, {groups} groups, blocks {block}..{block + pair - 1}: {fault}"
        assert not lib.amx_emulation_configured(), "the tiles are left configured (no TILERELEASE)"
        columns = pair * LOW_PRECISION_BLOCK_COLUMNS
        out[:, block * LOW_PRECISION_BLOCK_COLUMNS:][:, :columns] = c[:, :columns]
    return out


def test_amx_kernels_compute_16_rows(amx):
    # The ops pad the prepared rows to the kernels' 16 (row_padding), which the kernels always read.
    assert (amx.amx_int8_rows(), amx.amx_int8_row_padding()) == (TILE_ROWS, TILE_ROWS)
    assert (amx.amx_bf16_rows(), amx.amx_bf16_row_padding()) == (TILE_ROWS, TILE_ROWS)


@pytest.mark.parametrize("k", KS)
@pytest.mark.parametrize("n", NS + [40])
def test_int8_tiles_are_exact(amx, k, n):
    rng = np.random.default_rng(k * 1000 + n)
    a = rng.integers(-128, 128, (TILE_ROWS, k), dtype=np.int8)
    w = rng.integers(-128, 128, (k, n), dtype=np.int8)
    rows, stride = prepared_rows(a, rng)
    c = run_tiles(amx, "amx_int8_tile", rows, stride, packing.pack(w), np.int32)
    np.testing.assert_array_equal(c[:, :n], a.astype(np.int64) @ w.astype(np.int64))


@pytest.mark.parametrize("k", KS)
@pytest.mark.parametrize("n", NS + [40])
def test_bf16_tiles_match_float64(amx, k, n):
    rng = np.random.default_rng(k * 1000 + n)
    a = rng.standard_normal((TILE_ROWS, k)).astype(np.float32).astype(bf16_weights.BFLOAT16)
    w = rng.standard_normal((k, n)).astype(np.float32)
    rows, stride = prepared_rows(a, rng)
    c = run_tiles(amx, "amx_bf16_tile", rows, stride, bf16_weights.pack(w), np.float32)
    a64, w64 = a.astype(np.float64), bf16_weights.unpack(bf16_weights.pack(w), k, n).astype(np.float64)
    # float32 sums of k products: within k + 2 float32 roundings of the sum of magnitudes.
    bound = (k + 2) * 2.0 ** -24 * (np.abs(a64) @ np.abs(w64))
    assert np.all(np.abs(c[:, :n] - a64 @ w64) <= bound)


def test_emulator_refuses_a_row_outside_the_buffers(amx):
    # The checks above are live: a weight the kernel may not read is a fault, not a result.
    rng = np.random.default_rng(0)
    rows, stride = prepared_rows(rng.integers(-128, 128, (TILE_ROWS, 64), dtype=np.int8), rng)
    packed = packing.pack(rng.integers(-128, 128, (64, 16), dtype=np.int8))
    c = np.zeros((TILE_ROWS, TILE_COLUMNS), np.int32)
    amx.amx_emulation_reset()
    amx.amx_emulation_allow(rows.ctypes.data, rows.nbytes)
    amx.amx_emulation_allow(c.ctypes.data, c.nbytes)
    amx.amx_int8_tile(rows.ctypes.data, stride, TILE_ROWS, packed.ctypes.data, packed.shape[1], 1, c.ctypes.data)
    assert "TILELOADD touches 64 bytes" in amx.amx_emulation_fault().decode()
