"""Kernel bundles: one shared library with every tuned micro-kernel and a C
dispatch function per workload, plus a manifest. Using one needs no Python.

A bundle is only written after every (shape, kernel) pair its trees can yield
was checked against numpy: the range ends, the sample shapes and random shapes
(the compiled C dispatch is checked against the tree too).
"""

import ctypes
import hashlib
import importlib.metadata
import json
import os
import pathlib
import subprocess

import numpy as np
import tvm
from tvm.support import cc

from tf_dietcode.atomic_output import atomic_directory
from tf_dietcode.op_contract import BUNDLE_FORMAT
from tf_dietcode.tuning import hardware, measure, templates
from tf_dietcode.tuning.dispatch import Dispatch
from tf_dietcode.tuning.hardware import Hardware
from tf_dietcode.tuning.kernel_objects import KernelObjects
from tf_dietcode.tuning.templates import dense
from tf_dietcode.tuning.workload import DIMS

LIBRARY = "kernels.so"
MANIFEST = "manifest.json"


def kernel_symbol(workload_index: int, kernel_index: int) -> str:
    return f"tf_dietcode_w{workload_index}_k{kernel_index}"


def dispatch_symbol(workload_index: int) -> str:
    return f"tf_dietcode_dispatch_w{workload_index}"


def compile_dispatch(dispatches: list[Dispatch], directory: pathlib.Path) -> pathlib.Path:
    """The trees as C (dispatch.c, one dispatch_symbol(i) each) compiled to an object file in `directory`."""
    source = directory / "dispatch.c"
    source.write_text("#include <stdint.h>\n\n" + "\n".join(
        d.c_source(dispatch_symbol(i)) for i, d in enumerate(dispatches)))
    obj = directory / "dispatch.o"
    subprocess.run([os.environ.get("CC", "gcc"), "-c", "-O2", "-fPIC", str(source), "-o", str(obj)], check=True)
    return obj


def _check(library: pathlib.Path, dispatches: list[Dispatch], samples: list[list[tuple[int, ...]]],
           seed: int) -> None:
    """Runs each kernel the trees can pick against numpy; raises on any mismatch."""
    module = tvm.runtime.load_module(str(library))
    c_library = ctypes.CDLL(str(library))
    rng = np.random.default_rng(seed)
    for w, (dispatch, sample_shapes) in enumerate(zip(dispatches, samples)):
        workload = dispatch.workload
        template = templates.for_workload(workload)
        c_dispatch = getattr(c_library, dispatch_symbol(w))
        c_dispatch.restype, c_dispatch.argtypes = ctypes.c_int64, [ctypes.c_int64] * len(DIMS)
        ranges = [size for _, size in workload.variables()]
        edges = [tuple(r.lo for r in ranges), tuple(r.hi for r in ranges),
                 tuple(r.lo - 1 for r in ranges), tuple(r.hi + 1 for r in ranges)]
        randoms = [tuple(int(rng.integers(r.lo, r.hi + 1)) for r in ranges) for _ in range(8)]
        for shape in dict.fromkeys([*edges, *sample_shapes, *randoms]):
            dims = workload.dims_at(shape)
            index = dispatch.kernel_index(dims)
            if c_dispatch(*(dims[d] for d in DIMS)) != index:
                raise RuntimeError(f"compiled dispatch of workload {w} disagrees with its tree at {dims}")
            if index < 0:
                continue
            kernel = dispatch.kernels[index]
            operands = template.random_operands(workload, dims, rng)
            arguments = template.kernel_arguments(operands, workload, kernel)
            module[kernel_symbol(w, index)](*arguments)
            if not np.allclose(arguments[-1].numpy(), template.reference_output(operands, workload),
                               rtol=1e-3, atol=1e-3):
                raise RuntimeError(f"kernel {kernel.name} of workload {w} is wrong at {dims}")


def _workload_entry(index: int, dispatch: Dispatch) -> dict:
    entry = {
        "key": dispatch.workload.key(),
        "dispatch": dispatch_symbol(index),
        "dispatch_arguments": list(DIMS),
        "kernels": [{"symbol": kernel_symbol(index, k), "name": kernel.name, "params": kernel.__dict__}
                    for k, kernel in enumerate(dispatch.kernels)],
    }
    if dispatch.workload.kind == "dense":
        entry["weight_layout"] = dense.weight_layout(dispatch.workload, dispatch.kernels[0])
    return entry


def _kernel_objects(dispatches: list[Dispatch], hw: Hardware, directory: pathlib.Path,
                   objects: KernelObjects) -> list[pathlib.Path]:
    """Every kernel's object file (from `objects`, compiled there if the runner did not), copied into
    `directory` with its function exported under kernel_symbol; raises the first error. Those not kept
    yet are compiled side by side (measure.in_threads). A CPU build has no imported modules, so the
    objects are all export_library would link."""
    functions = [(kernel_symbol(w, k), dispatch.workload, kernel)
                 for w, dispatch in enumerate(dispatches) for k, kernel in enumerate(dispatch.kernels)]

    def copied(function) -> pathlib.Path:
        name, workload, kernel = function
        return objects.renamed_object(workload, kernel, hw, name, directory / f"{name}.o")

    return measure.in_threads(copied, functions, hardware.detect().cores, strict=True)  # this machine's cores


def build_bundle(dispatches: list[Dispatch], hw: Hardware, directory: str | pathlib.Path,
                 samples: list[list[tuple[int, ...]]], seed: int = 0, objects: KernelObjects | None = None) -> dict:
    """Links (compiling what `objects` lacks), checks and writes the bundle into `directory` (atomically);
    returns the manifest."""
    directory = pathlib.Path(directory)
    with atomic_directory(directory) as staging:
        linked = [*_kernel_objects(dispatches, hw, staging, objects or KernelObjects()),
                  compile_dispatch(dispatches, staging)]
        cc.create_shared(str(staging / LIBRARY), [str(o) for o in linked])  # as export_library links
        for leftover in (*linked, staging / "dispatch.c"):
            leftover.unlink()
        _check(staging / LIBRARY, dispatches, samples, seed)
        manifest = {
            "format": BUNDLE_FORMAT,
            "library": LIBRARY,
            "sha256": hashlib.sha256((staging / LIBRARY).read_bytes()).hexdigest(),
            "target": {"kind": "llvm", "mcpu": hw.mcpu, "cores": hw.cores},
            "cpu_features": list(hw.features),
            "tvm": tvm.__version__,
            "tensorflow": importlib.metadata.version("tensorflow"),  # without importing it
            "workloads": [_workload_entry(w, d) for w, d in enumerate(dispatches)],
        }
        (staging / MANIFEST).write_text(json.dumps(manifest, indent=1))
    return manifest
