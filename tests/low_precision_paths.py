"""What the int8 and bfloat16 ops' tests share: their shape sets, and the kernel paths, each forced with
TF_DIETCODE_DISABLE_ISA."""

import contextlib
import itertools
import os

import pytest

from tf_dietcode import ops, reference

MS = [0, 1, 2, 3, 5, 8, 9, 16, 17, 31, 64, 129]
KS = [1, 3, 4, 5, 63, 64, 127, 768]
NS = [1, 15, 16, 17, 33, 768]
# Every M with every K, N cycling through its set: each size meets every other's edges.
SHAPES = [(m, k, NS[i % len(NS)]) for i, (m, k) in enumerate(itertools.product(MS, KS))]
ACTIVATIONS = sorted(reference.ACTIVATIONS)

# Each path and the extensions to disable so that a CPU with every extension runs it.
PATHS = {
    "int8": {"amx_int8": (), "avx512_vnni": ("amx_int8",), "avx2": ("amx_int8", "avx512_vnni")},
    "bfloat16": {"amx_bf16": (), "avx512_bf16": ("amx_bf16",), "avx2": ("amx_bf16", "avx512_bf16")},
}


@contextlib.contextmanager
def disabled_isa(names):
    """TF_DIETCODE_DISABLE_ISA=names around the block (the op library reads it on every call)."""
    before = os.environ.get("TF_DIETCODE_DISABLE_ISA")
    os.environ["TF_DIETCODE_DISABLE_ISA"] = ",".join(names)
    try:
        yield
    finally:
        if before is None:
            del os.environ["TF_DIETCODE_DISABLE_ISA"]
        else:
            os.environ["TF_DIETCODE_DISABLE_ISA"] = before


@contextlib.contextmanager
def forced_path(precision, path):
    """Runs the block with the op of `precision` on `path`; skips where this CPU cannot run it."""
    with disabled_isa(PATHS[precision][path]):
        running = ops.low_precision_isa()[precision]
        if running != path:
            pytest.skip(f"this CPU cannot run the {path} {precision} kernel (it runs {running})")
        yield


def kernel_path_fixture(precision: str):
    """A fixture running each test once per kernel path of the `precision` op (skipped where this CPU
    cannot run it), its value the path's name."""
    @pytest.fixture(params=sorted(PATHS[precision]))
    def path(request):
        with forced_path(precision, request.param):
            yield request.param
    return path
