"""Builds the repository's BUILD targets with Debian's bazel-bootstrap, offline,
against the pip wheels of TensorFlow and TVM: the check that the Bazel
targets a TF Serving build links (//:tf_dietcode_ops) compile, link and
register the ops.

A TF Serving source tree provides @org_tensorflow, @eigen_archive and
@boringssl, and the user adds @tvm_runtime. Here a workspace in `--workspace`
maps each to the wheels: the real BUILD and ops/ are linked in unchanged, and
the repositories in this folder stand in for the source trees (rules_cc and
rules_java forward to Bazel 4's native rules, which is all those rules were
then). Prints the paths of the built op library and registered_ops binary.

    python serving/bazel/build_offline.py --workspace build/bazel
"""

import argparse
import json
import pathlib
import shutil
import subprocess

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parents[1]
TARGETS = ["//:libtf_dietcode_ops.so", "//:tf_dietcode_ops", "//registered_ops"]
# As TensorFlow's own .bazelrc builds; standalone: no sandbox over the wheel's 18k headers.
FLAGS = ["-c", "opt", "--cxxopt=-std=c++17", "--copt=-Wno-deprecated-declarations", "--spawn_strategy=standalone"]


def _link(link: pathlib.Path, target: pathlib.Path) -> None:
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(target)


def _repository(workspace: pathlib.Path, name: str, links: dict[str, pathlib.Path]) -> pathlib.Path:
    """external/<name>: this folder's files for it (or a BUILD file), plus links to the wheels."""
    root = workspace / "external_repositories" / name
    if (HERE / name).is_dir():
        shutil.copytree(HERE / name, root)
    else:
        root.mkdir(parents=True)
        (root / "WORKSPACE").write_text(f'workspace(name = "{name}")\n')
        shutil.copy(HERE / f"{name}.BUILD", root / "BUILD")
    for relative, target in links.items():
        _link(root / relative, target)
    return root


def make_workspace(workspace: pathlib.Path) -> None:
    """A fresh workspace: the repository's BUILD and ops/, and the stand-in repositories."""
    import tensorflow as tf
    import tvm
    import tvm_ffi.libinfo

    shutil.rmtree(workspace, ignore_errors=True)
    for name in ("BUILD", "ops"):
        _link(workspace / name, REPO / name)
    _link(workspace / "registered_ops", HERE / "registered_ops")
    tf_lib = pathlib.Path(tf.sysconfig.get_lib())
    tvm_dir = pathlib.Path(tvm.__file__).parent
    repositories = {
        "rules_cc": HERE / "rules_cc",
        "rules_java": HERE / "rules_java",
        "org_tensorflow": _repository(workspace, "org_tensorflow", {
            "include": pathlib.Path(tf.sysconfig.get_include()),
            "libtensorflow_framework.so.2": tf_lib / "libtensorflow_framework.so.2"}),
        "eigen_archive": HERE / "eigen_archive",
        "boringssl": HERE / "boringssl",
        "tvm_runtime": _repository(workspace, "tvm_runtime", {
            "ffi_include": pathlib.Path(tvm_ffi.libinfo.find_include_path()),
            "tvm_include": tvm_dir / "include",
            "lib/libtvm_ffi.so": pathlib.Path(tvm_ffi.libinfo.find_libtvm_ffi()),
            "lib/libtvm_runtime.so": tvm_dir / "lib" / "libtvm_runtime.so"}),
    }
    (workspace / "WORKSPACE").write_text("".join(
        f'local_repository(name = "{name}", path = "{path}")\n' for name, path in repositories.items()))


def build(workspace: pathlib.Path) -> dict[str, pathlib.Path]:
    """Builds TARGETS; returns the op library's and registered_ops' paths.

    The op library gets the build_info.json that setup.py writes too, so that
    tf_dietcode loads it (TF_DIETCODE_OP_LIBRARY); it is built for no SIMD
    extension beyond the compiler's default.
    """
    import tensorflow as tf
    import tvm

    make_workspace(workspace)
    subprocess.run(["bazel", "--batch", "build", *FLAGS, *TARGETS], cwd=workspace, check=True)
    bin_dir = (workspace / "bazel-bin").resolve()
    build_info = {"tensorflow": tf.__version__, "tvm": tvm.__version__, "cpu_features": []}
    (bin_dir / "build_info.json").write_text(json.dumps(build_info))
    return {"op_library": bin_dir / "libtf_dietcode_ops.so", "registered_ops": bin_dir / "registered_ops" / "registered_ops"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workspace", type=pathlib.Path, default=REPO / "build" / "bazel")
    for name, path in build(parser.parse_args().workspace.absolute()).items():
        print(f"{name}: {path}")


if __name__ == "__main__":
    main()
