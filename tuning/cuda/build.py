"""Compile GPU micro-kernels ahead of time: TVM -> CUDA C -> nvcc -> one fatbin.

TVM's exported CUDA module embeds source that it compiles when loaded, through
a Python callback: unusable from C++ and a run-time compile. So each kernel's
CUDA C is taken from TVM, renamed, and all of a set are compiled by nvcc into
one fatbin with machine code for every target architecture. Beside it a
manifest records, per kernel, its symbol, parameter types and launch rule
(grid from the dims, block size), which is all a runner needs.
"""

import concurrent.futures
import dataclasses
import hashlib
import json
import multiprocessing
import os
import pathlib
import re
import shutil
import subprocess

import tvm

from tf_dietcode.atomic_output import atomic_directory
from tf_dietcode.tuning import bundle
from tf_dietcode.tuning.cuda import schedule
from tf_dietcode.tuning.cuda.space import GpuKernel
from tf_dietcode.tuning.dispatch import Dispatch
from tf_dietcode.tuning.workload import Workload

FORMAT = "tf_dietcode.cuda_kernels"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
DISPATCH = "dispatch.so"
ARCHS = ("sm_80", "sm_90")
_SIGNATURE = re.compile(r'extern "C" __global__ void __launch_bounds__\((\d+)\) (\w+)\(([^)]*)\)\s*\{')
_PARAM_TYPES = {"float*": "pointer", "int": "int32", "float": "float32", "int64_t": "int64"}
_PARALLEL_FROM = 64  # kernels: fewer compile faster in this process than a pool of fresh ones starts
_HELPER = re.compile(r"^__forceinline__ __device__ .*?^}\n", re.S | re.M)  # a device function TVM's prelude defines


@dataclasses.dataclass(frozen=True)
class Launch:
    """How to launch one compiled kernel."""

    symbol: str
    params: tuple[tuple[str, str], ...]   # (name, "pointer" | "int32" | "int64" | "float32"), in order
    block: tuple[int, int, int]
    grid: tuple[tuple[str, int], ...]     # per grid axis x, y, z: (dim, tile): ceil(dims[dim] / tile)
    alignment: int = 4                    # bytes every pointer must be aligned to (16-byte copies need 16)

    def grid_at(self, dims: dict[str, int]) -> tuple[int, ...]:
        return tuple(-(-dims[d] // tile) for d, tile in self.grid)


def nvcc() -> str | None:
    """nvcc's path, or None where the CUDA toolkit is not installed."""
    return shutil.which("nvcc") or next((str(p) for p in sorted(pathlib.Path("/usr/local").glob("cuda*/bin/nvcc"))),
                                        None)


def cuda_source(workload: Workload, kernel: GpuKernel, symbol: str,
                dims: dict[str, int] | None = None) -> tuple[str, str, Launch]:
    """(TVM's CUDA prelude, the kernel's definition renamed to `symbol`, its launch rule)."""
    target = tvm.target.Target({"kind": "cuda", "arch": ARCHS[0]}, host={"kind": "llvm"})
    with tvm.transform.PassContext(config={"tirx.use_async_copy": True}):  # a pipelined kernel's cp.async copies
        source = tvm.compile(schedule.schedule(workload, kernel, dims), target=target).mod.imports[0].inspect_source()
    definition = _SIGNATURE.search(source)
    if definition is None:
        raise RuntimeError(f"no kernel definition in TVM's CUDA source for {kernel.name}")
    threads, name, params = definition.groups()
    prelude = source[:source.index('extern "C"')]
    body = source[definition.start():].replace(f" {name}(", f" {symbol}(", 1)
    parsed = []
    for param in params.split(","):
        words = param.replace("__restrict__", "").split()
        kind = _PARAM_TYPES[" ".join(words[:-1])]
        # TVM names a buffer's pointer "<buffer>_ptr"; records name the buffer
        parsed.append((words[-1].removesuffix("_ptr") if kind == "pointer" else words[-1], kind))
    threads_x, threads_y = kernel.threads
    if int(threads) != threads_x * threads_y:
        raise RuntimeError(f"{kernel.name}: TVM bound {threads} threads, the kernel has {threads_x * threads_y}")
    launch = Launch(symbol, tuple(parsed), (threads_x, threads_y, 1),
                    (("n", kernel.block_n), ("m", kernel.block_m), ("b", 1)),
                    4 * max(schedule.vector_width(workload, operand, kernel)
                            for operand in schedule.operands(workload)))
    return prelude, body, launch


def cuda_sources(jobs: list[tuple[Workload, GpuKernel, str, dict[str, int] | None]]) -> list[tuple[str, str, Launch]]:
    """cuda_source of each (workload, kernel, symbol, dims), over every core for a large set
    (one TVM compile runs on one core: a whole space took 15 minutes on two, one at a time)."""
    if len(jobs) < _PARALLEL_FROM or (os.cpu_count() or 1) == 1:
        return [cuda_source(*job) for job in jobs]
    with concurrent.futures.ProcessPoolExecutor(os.cpu_count(), mp_context=multiprocessing.get_context("spawn")) as pool:
        return list(pool.map(cuda_source, *zip(*jobs), chunksize=8))


def merged_prelude(preludes: list[str]) -> str:
    """One source file's prelude for several kernels: TVM's header once, then each device
    function any of them needs once (pipelined kernels bring cp.async helpers, others none)."""
    headers, helpers = set(), {}
    for prelude in preludes:
        found = list(_HELPER.finditer(prelude))
        headers.add(prelude[:found[0].start()] if found else prelude)
        helpers.update(dict.fromkeys(m.group() for m in found))
    if len(headers) > 1:
        raise RuntimeError("TVM's CUDA preludes differ between kernels of one set; cannot share one source")
    return "".join([*headers, *helpers])


def compile_fatbin(source: pathlib.Path, output: pathlib.Path, archs: tuple[str, ...] = ARCHS,
                   ptx: bool = True) -> str:
    """nvcc's fatbin of `source` with machine code for each arch (and, with `ptx`, the
    newest's PTX, which newer GPUs compile when loading);
    returns ptxas' resource report (registers, spills per kernel)."""
    compiler = nvcc()
    if compiler is None:
        raise RuntimeError("nvcc not found: install the CUDA toolkit to build CUDA kernels")
    gencode = [f"-gencode=arch=compute_{a[3:]},code={a}" for a in archs]
    if ptx:
        gencode.append(f"-gencode=arch=compute_{archs[-1][3:]},code=compute_{archs[-1][3:]}")
    # 177: TVM's common subexpressions that ended up unused
    done = subprocess.run([compiler, "--fatbin", "-O3", "--resource-usage", "-diag-suppress=177", *gencode,
                           "-o", str(output), str(source)],
                          capture_output=True, text=True)
    if done.returncode:
        errors = [line for line in done.stderr.splitlines() if "error" in line.lower()]
        raise RuntimeError(f"nvcc failed on {source}:\n" + "\n".join(errors[:20] or [done.stderr[-4000:]]))
    return done.stdout + done.stderr


def spills(report: str) -> dict[str, int]:
    """Spill-store bytes per kernel symbol (the largest over the archs) from ptxas' report."""
    result, symbol = {}, None
    for line in report.splitlines():
        if m := re.search(r"Function properties for (\w+)", line):
            symbol = m.group(1)
        elif symbol and (m := re.search(r"(\d+) bytes spill stores", line)):
            result[symbol] = max(result.get(symbol, 0), int(m.group(1)))
    return result


def build(entries: list[tuple[Workload, list[tuple[GpuKernel, dict[str, int] | None]]]],
          shapes: dict[str, list[dict[str, int]]] | None, directory: pathlib.Path | str,
          archs: tuple[str, ...] = ARCHS, ptx: bool = True, dispatches: list[Dispatch] | None = None) -> dict:
    """Compile every (kernel, dims) of every workload (dims None: symbolic) into one
    fatbin per workload and write them with a manifest to `directory` (atomically).
    `shapes`: per workload key, the dims a runner should measure the workload at.
    `archs`: the machine code it carries and `ptx` whether PTX comes too (a
    measurement set for one GPU needs only that GPU's machine code). `dispatches`:
    one per workload, choosing among its kernels in order; their trees are compiled
    into DISPATCH, a C library (see write_bundle)."""
    shapes = shapes or {}
    with atomic_directory(pathlib.Path(directory)) as staging:
        sources, workloads = [], []
        compiled = iter(cuda_sources([(workload, kernel, f"w{w}_k{i}", dims) for w, (workload, kernels)
                                      in enumerate(entries) for i, (kernel, dims) in enumerate(kernels)]))
        for w, (workload, kernels) in enumerate(entries):
            preludes, bodies, records = [], [], []
            for kernel, dims in kernels:
                prelude, body, launch = next(compiled)
                preludes.append(prelude)
                bodies.append(body)
                records.append({"kernel": dataclasses.asdict(kernel), "name": kernel.name, "static_dims": dims,
                                "launch": dataclasses.asdict(launch)})
            (staging / f"w{w}.cu").write_text(merged_prelude(preludes) + "\n".join(bodies))
            sources.append(staging / f"w{w}.cu")
            workloads.append({"workload": json.loads(workload.key()), "describe": workload.describe(),
                              "fatbin": f"w{w}.fatbin", "shapes": shapes.get(workload.key(), []),
                              "kernels": records})
        with concurrent.futures.ThreadPoolExecutor(os.cpu_count()) as pool:  # nvcc is one process per file
            reports = list(pool.map(lambda s: compile_fatbin(s, s.with_suffix(".fatbin"), archs, ptx), sources))
        spilled = spills("\n".join(reports))
        for entry in workloads:
            entry["fatbin_sha256"] = hashlib.sha256((staging / entry["fatbin"]).read_bytes()).hexdigest()
            for record in entry["kernels"]:
                record["spill_bytes"] = spilled.get(record["launch"]["symbol"], 0)
        if dispatches is not None:
            _link_dispatch(dispatches, staging)
            for w, entry in enumerate(workloads):
                entry["dispatch"] = bundle.dispatch_symbol(w)
        manifest = {"format": FORMAT, "version": FORMAT_VERSION, "archs": list(archs), "tvm": tvm.__version__,
                    "dispatch_library": DISPATCH if dispatches is not None else None, "workloads": workloads}
        text = json.dumps(manifest, indent=1)
        (staging / MANIFEST).write_text(text)
    return json.loads(text)  # as a reader sees it (lists, not tuples)


def _link_dispatch(dispatches: list[Dispatch], directory: pathlib.Path) -> None:
    """The trees as a C shared library: dispatch_symbol(w)(b, m, n, k) -> kernel index, -1 outside the range."""
    obj = bundle.compile_dispatch(dispatches, directory)
    subprocess.run([os.environ.get("CC", "gcc"), "-shared", "-o", str(directory / DISPATCH), str(obj)], check=True)
    obj.unlink()


def write_bundle(dispatches: list[Dispatch], directory: pathlib.Path | str,
                 shapes: dict[str, list[dict[str, int]]] | None = None) -> dict:
    """A CUDA kernel bundle: each dispatch's kernels, symbolic, in fatbins with sm_80 and
    sm_90 machine code and PTX, the launch rules in the manifest, and the trees compiled
    to C beside them, so a host program needs the CUDA driver and no compiler. Its kernels
    are checked numerically where they are measured (bench/cuda_kernels.py), on the GPU:
    a build machine without one cannot run them; `shapes` (per workload key) lists the
    dims at which a runner should check and time the bundle."""
    return build([(d.workload, [(k, None) for k in d.kernels]) for d in dispatches], shapes, directory,
                 dispatches=dispatches)
