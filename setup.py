"""Builds libtf_dietcode_ops.so against the installed TensorFlow and TVM runtime.

The package's metadata and requirements are in pyproject.toml; this file adds
what needs code: the packages (graph_rewrite/ and tuning/ install under
tf_dietcode) and the op library. The library must match the TensorFlow it is
loaded into (C++ ABI, headers), so it is compiled at install time with the
flags `tf.sysconfig` reports (pip's isolated build installs the pinned
TensorFlow and TVM; `--no-build-isolation` builds against the environment's),
and what it was built for is recorded in build_info.json beside it.

A built library holds no path of the build machine: it is compiled for a
baseline instruction set and finds TensorFlow's and TVM's libraries through
$ORIGIN-relative run paths, so a wheel built on one machine installs on
another of the same platform.
"""

import concurrent.futures
import importlib.util
import json
import os
import pathlib
import shlex
import subprocess

from setuptools import Extension, find_packages, setup
from setuptools.command.build_ext import build_ext

ROOT = pathlib.Path(__file__).resolve().parent
OP_LIBRARY = "tf_dietcode.libtf_dietcode_ops"
BUILD_INFO = "build_info.json"
# What C++ and Python agree on: compiled in as op_contract.h, shipped as package data
# (tf_dietcode/op_contract.json links to it).
OP_CONTRACT = ROOT / "ops" / "op_contract.json"
# The instruction set the op library is compiled for: any AVX2 + FMA CPU (docs/decisions.md says why not
# -march=native). TF_DIETCODE_CXXFLAGS comes after it, so `-march=native` there builds for this CPU alone;
# build_info.json records what the flags enable either way. Tuned kernels are compiled for the CPU that
# tunes them, whatever this says. Without -mno-avx512fp16, g++ 12 cannot compile the Eigen in TF's headers
# for CPUs with AVX512-FP16 (Sapphire Rapids and later): its PacketMathFP16.h fails to parse. The op
# library has no fp16 code; the flag stays in force under any -march given later.
ISA_FLAGS = ["-march=x86-64-v3", "-mtune=generic", "-mno-avx512fp16"]


# Installed package -> source folder: graph_rewrite/ and tuning/ install under tf_dietcode.
PACKAGE_DIR = {"tf_dietcode": "tf_dietcode", "tf_dietcode.graph_rewrite": "graph_rewrite", "tf_dietcode.tuning": "tuning"}


def _packages(name: str, folder: str) -> list[str]:
    """The package and every subpackage under its folder, so a new subpackage needs no edit here."""
    return [name, *(f"{name}.{sub}" for sub in find_packages(str(ROOT / folder)))]


def _load_alone(path: pathlib.Path):
    """A standard-library-only module by its path: the package itself is not built yet."""
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run(command):
    print(" ".join(shlex.quote(part) for part in command), flush=True)
    subprocess.run(command, check=True)


def _site_packages(package) -> pathlib.Path:
    """The folder an installed package lies in."""
    return pathlib.Path(package.__file__).resolve().parents[1]


class BuildOpLibrary(build_ext):
    """Compiles ops/*.cc with g++ (CXX overrides) into the op library."""

    def get_ext_filename(self, fullname):
        if fullname.split(".")[-1] == OP_LIBRARY.split(".")[-1]:
            return os.path.join(*fullname.split(".")) + ".so"
        return super().get_ext_filename(fullname)

    def run_path(self, folder: str, package) -> str:
        """`folder` (of the installed `package`) as a run path relative to the op library ($ORIGIN).
        Installed, the library lies in tf_dietcode/ beside that package; in an editable install it
        stays in the source tree and points into the environment it was built in. (Loaded from
        Python, op_library.py loads TVM's libraries first, wherever the library lies.)"""
        if self.editable_mode:
            library_dir = pathlib.Path(self.get_finalized_command("build_py").get_package_dir("tf_dietcode")).resolve()
        else:
            library_dir = _site_packages(package) / "tf_dietcode"
        return "$ORIGIN/" + os.path.relpath(pathlib.Path(folder).resolve(), library_dir)

    def build_extension(self, ext):
        import tensorflow as tf
        import tvm
        import tvm_ffi
        import tvm_ffi.libinfo

        tvm_lib_dir = str(pathlib.Path(tvm.__file__).parent / "lib")
        ffi_lib_dir = str(pathlib.Path(tvm_ffi.libinfo.find_libtvm_ffi()).parent)
        tf_lib_dir = tf.sysconfig.get_lib()
        cxx = os.environ.get("CXX", "g++")
        build_temp = pathlib.Path(self.build_temp).resolve()
        generated = build_temp / "generated"
        _load_alone(ROOT / "ops" / "op_contract_header.py").write_header(OP_CONTRACT, generated / "op_contract.h")
        # Paths the compiler may write into the library (__FILE__ in headers' checks) made relative.
        prefixes = {ROOT, build_temp, *(_site_packages(package) for package in (tf, tvm, tvm_ffi))}
        cflags = [
            "-I" + str(generated),
            *tf.sysconfig.get_compile_flags(),
            "-I" + tvm_ffi.libinfo.find_include_path(),
            "-I" + str(pathlib.Path(tvm.__file__).parent / "include"),
            # BoringSSL's SHA-256, which libtensorflow_framework exports.
            "-I" + str(pathlib.Path(tf.sysconfig.get_include()) / "external" / "boringssl" / "src" / "include"),
            f'-DTF_DIETCODE_TVM_VERSION="{tvm.__version__}"',
            *(f"-ffile-prefix-map={prefix}/=" for prefix in sorted(map(str, prefixes))),
            "-O3", *ISA_FLAGS, "-DNDEBUG", "-fPIC", "-fvisibility=hidden",
            "-Wno-deprecated-declarations",
            *shlex.split(os.environ.get("TF_DIETCODE_CXXFLAGS", "")),
        ]
        objects = [str(build_temp / (pathlib.Path(s).stem + ".o")) for s in ext.sources]
        with concurrent.futures.ThreadPoolExecutor(os.cpu_count()) as pool:
            list(pool.map(lambda so: _run([cxx, "-c", so[0], "-o", so[1], *cflags]),
                          zip(ext.sources, objects)))

        output = pathlib.Path(self.get_ext_fullpath(ext.name))
        output.parent.mkdir(parents=True, exist_ok=True)
        # Both TVM libraries are linked with --no-as-needed: nothing references
        # them by name yet, but TVM kernels loaded later need libtvm_runtime's
        # parallel-launch and workspace functions in the process, and
        # libtvm_runtime finds libtvm_ffi only because it is loaded first.
        run_paths = [self.run_path(tf_lib_dir, tf), self.run_path(ffi_lib_dir, tvm_ffi), self.run_path(tvm_lib_dir, tvm)]
        _run([
            cxx, "-shared", "-o", str(output), *objects,
            *tf.sysconfig.get_link_flags(),
            "-Wl,--no-as-needed", "-L" + ffi_lib_dir, "-ltvm_ffi",
            "-L" + tvm_lib_dir, "-ltvm_runtime", "-Wl,--as-needed",
            "-Wl,-rpath," + ":".join(run_paths),
        ])
        # The loader refuses a library built for another TensorFlow, or for instructions the CPU lacks.
        macros = subprocess.run([cxx, *cflags, "-dM", "-E", "-x", "c++", os.devnull],
                                check=True, capture_output=True, text=True).stdout
        build_info = {"tensorflow": tf.__version__, "tvm": tvm.__version__,
                      "cpu_features": _load_alone(ROOT / "tf_dietcode" / "cpu_features.py").compiled_features(macros)}
        (output.parent / BUILD_INFO).write_text(json.dumps(build_info))

    def copy_extensions_to_source(self):
        """Editable installs: the build info goes into the source tree with the .so."""
        super().copy_extensions_to_source()
        package_dir = self.get_finalized_command("build_py").get_package_dir("tf_dietcode")
        self.copy_file(os.path.join(self.build_lib, "tf_dietcode", BUILD_INFO),
                       os.path.join(package_dir, BUILD_INFO))


# Name, version, requirements and the command line are in pyproject.toml.
setup(
    packages=[package for name, folder in PACKAGE_DIR.items() for package in _packages(name, folder)],
    package_dir=PACKAGE_DIR,
    package_data={"tf_dietcode": [OP_CONTRACT.name]},
    ext_modules=[Extension(OP_LIBRARY, sources=sorted(str(p.relative_to(ROOT)) for p in (ROOT / "ops").glob("*.cc")))],
    cmdclass={"build_ext": BuildOpLibrary},
)
