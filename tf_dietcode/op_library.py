"""Finds, checks and loads libtf_dietcode_ops.so, once per process.

Loading is lazy so that importing tf_dietcode stays cheap; every op wrapper
calls load_op_library(). A library built for another TensorFlow version is
refused with a message saying which, instead of failing on a missing symbol.

TF_DIETCODE_OP_LIBRARY names another build of the library to load instead of
the installed one (its build_info.json beside it), so that a second build,
such as the sanitized one `make sanitize` tests, runs without replacing the
library other processes use.
"""

import functools
import json
import os
import pathlib
import types

import tensorflow as tf

from tf_dietcode import cpu_features

LIBRARY_PATH = pathlib.Path(os.environ.get("TF_DIETCODE_OP_LIBRARY")
                            or pathlib.Path(__file__).parent / "libtf_dietcode_ops.so").resolve()
BUILD_INFO_PATH = LIBRARY_PATH.parent / "build_info.json"
REINSTALL_HINT = "rebuild it with `pip install --no-build-isolation --force-reinstall .` in the tf_dietcode source tree"


def _major_minor(version: str) -> str:
    return ".".join(version.split(".")[:2])


def check_build(build_info_path: pathlib.Path = BUILD_INFO_PATH,
                tf_version: str = tf.__version__,
                cpu: list[str] | None = None) -> None:
    """Raises ImportError unless the library's build matches this TensorFlow and CPU."""
    if not build_info_path.exists():
        raise ImportError(f"tf_dietcode op library is not built ({build_info_path} is missing); {REINSTALL_HINT}")
    build_info = json.loads(build_info_path.read_text())
    built_for = build_info["tensorflow"]
    if _major_minor(built_for) != _major_minor(tf_version):
        raise ImportError(
            f"libtf_dietcode_ops.so was built for TensorFlow {_major_minor(built_for)}, "
            f"found {tf_version}; {REINSTALL_HINT}")
    missing = cpu_features.missing_features(
        build_info["cpu_features"], cpu_features.simd_features() if cpu is None else cpu)
    if missing:
        raise ImportError(
            f"libtf_dietcode_ops.so was built for a CPU with {', '.join(missing)}, which this CPU lacks; "
            f"{REINSTALL_HINT}")


@functools.cache
def load_op_library() -> types.ModuleType:
    """Loads the op library (registering the Dietcode ops) and returns its op module.

    Call it before tf.saved_model.load() of a model that uses Dietcode ops.
    """
    check_build()
    return tf.load_op_library(str(LIBRARY_PATH))
