"""The kernel paths of the int8 and bfloat16 ops, each forced with TF_DIETCODE_DISABLE_ISA, for their tests."""

import contextlib
import os

import pytest

from tf_dietcode import ops

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
