"""Finds, checks and loads libtf_dietcode_ops.so, once per process.

Loading is lazy so that importing tf_dietcode stays cheap; every op wrapper
calls load_op_library(). A library built for another TensorFlow version is
refused with a message saying which, instead of failing on a missing symbol.
Reading what the library was built for (build_info()) needs no TensorFlow, so
`tf-dietcode --version` stays quick.

TF_DIETCODE_OP_LIBRARY names another build of the library to load instead of
the installed one (its build_info.json beside it), so that a second build,
such as the sanitized one `make sanitize` tests, runs without replacing the
library other processes use.
"""

import ctypes
import functools
import importlib.util
import json
import os
import pathlib
import types

from tf_dietcode import cpu_features

LIBRARY_PATH = pathlib.Path(os.environ.get("TF_DIETCODE_OP_LIBRARY")
                            or pathlib.Path(__file__).parent / "libtf_dietcode_ops.so").resolve()
BUILD_INFO_PATH = LIBRARY_PATH.parent / "build_info.json"
REINSTALL_HINT = "rebuild it with `pip install --no-build-isolation --force-reinstall .` in the tf_dietcode source tree"
# The TVM runtime libraries the op library links, by the package that installs each.
TVM_LIBRARIES = (("tvm_ffi", "lib/libtvm_ffi.so"), ("tvm", "lib/libtvm_runtime.so"))


def _major_minor(version: str) -> str:
    return ".".join(version.split(".")[:2])


def build_info(build_info_path: pathlib.Path = BUILD_INFO_PATH) -> dict | None:
    """What the library was built for ({"tensorflow", "tvm", "cpu_features"}), None when it is not built."""
    return json.loads(build_info_path.read_text()) if build_info_path.exists() else None


def check_build(build_info_path: pathlib.Path = BUILD_INFO_PATH,
                tf_version: str | None = None,
                cpu: list[str] | None = None) -> None:
    """Raises ImportError unless the library's build matches this TensorFlow (by default the installed one) and CPU."""
    built = build_info(build_info_path)
    if built is None:
        raise ImportError(f"tf_dietcode op library is not built ({build_info_path} is missing); {REINSTALL_HINT}")
    if tf_version is None:
        import tensorflow as tf

        tf_version = tf.__version__
    built_for = _major_minor(built["tensorflow"])
    if built_for != _major_minor(tf_version):
        raise ImportError(
            f"libtf_dietcode_ops.so was built for TensorFlow {built_for}, found {tf_version}; install the "
            f"TensorFlow it was built for: `pip install 'tensorflow=={built_for}.*'` (or, in a source tree, "
            f"rebuild it for this one: `pip install --no-build-isolation --force-reinstall --no-deps .`)")
    missing = cpu_features.missing_features(
        built["cpu_features"], cpu_features.simd_features() if cpu is None else cpu)
    if missing:
        raise ImportError(
            f"libtf_dietcode_ops.so was built for a CPU with {', '.join(missing)}, which this CPU lacks; build it "
            f"for this CPU: `TF_DIETCODE_CXXFLAGS=-march=native pip install --no-build-isolation --force-reinstall .` "
            f"in the tf_dietcode source tree")


def _load_tvm_runtime() -> None:
    """Loads the TVM runtime libraries from their installed packages, so that the op library's
    links to them resolve to these (a library of that name already loaded is the one used)
    wherever the op library lies: beside them in site-packages its run paths would find them,
    but not from a build folder (the sanitized build) or another site-packages."""
    for package, library in TVM_LIBRARIES:
        ctypes.CDLL(str(pathlib.Path(importlib.util.find_spec(package).origin).parent / library))


@functools.cache
def load_op_library() -> types.ModuleType:
    """Loads the op library (registering the Dietcode ops) and returns its op module.

    Call it before tf.saved_model.load() of a model that uses Dietcode ops.
    """
    import tensorflow as tf

    check_build()
    _load_tvm_runtime()
    return tf.load_op_library(str(LIBRARY_PATH))
