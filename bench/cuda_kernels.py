"""Measure a CUDA kernel set (tuning/cuda/build.py) on a GPU against cuBLAS.

Runs where the GPU is: needs only numpy, torch and the CUDA driver (no TVM, no
TensorFlow, not this package), so it is a plain script:

    python3 bench/cuda_kernels.py KERNEL_SET_DIR OUT_DIR [ROUNDS [WORKLOAD]]

For every workload of the set, at every shape its manifest lists: each kernel
is launched through the driver on torch's tensors, checked against torch in
float64 (the output is NaN-filled first, so an unwritten tile shows), and
timed; the peer is torch's cuBLAS call computing the same fused op (addmm
with the bias, or baddbmm with the scale and addend; TF32 off), timed the same
way in the same run, before the kernels and again after them (cublas_again: the
two bound the drift). Timing: n back-to-back launches captured in a CUDA graph,
replayed between CUDA events (so Python's launch cost is not counted), the
median of repeats divided by n. With ROUNDS > 1 every kernel of a shape is
timed once per round, round after round, so kernels compared with each other
(a symbolic build and its static one) are timed interleaved, not minutes
apart. A CUDA bundle (tuning/cuda/build.write_bundle) runs, at each shape, only
the kernel its compiled tree picks (none outside its ranges: cuBLAS alone).
WORKLOAD (an index into the set's workloads) measures only that one: run one
process per workload and a kernel that faults (which ends the CUDA context)
costs only its own workload's record.
Writes measurements.csv (a row per kernel, shape and round) and device.json.
"""

import csv
import ctypes
import json
import pathlib
import statistics
import sys

import numpy as np
import torch

REPEATS = 7
TARGET_SECONDS = 5e-4  # per repeat
TOLERANCE = 1e-5       # max |error| / max |reference| against float64
_SCALARS = {"int32": ctypes.c_int32, "int64": ctypes.c_int64, "float32": ctypes.c_float}


class Driver:
    """The few CUDA driver calls a launch needs, on torch's context and stream."""

    def __init__(self):
        torch.zeros(1, device="cuda")  # makes the primary context current
        self.lib = ctypes.CDLL("libcuda.so.1")

    def _check(self, status: int, what: str) -> None:
        if status:
            name = ctypes.c_char_p()
            self.lib.cuGetErrorName(status, ctypes.byref(name))
            raise RuntimeError(f"{what}: {name.value.decode() if name.value else status}")

    def load(self, image: bytes):
        module = ctypes.c_void_p()
        self._check(self.lib.cuModuleLoadData(ctypes.byref(module), image), "cuModuleLoadData")
        return module

    def function(self, module, symbol: str):
        function = ctypes.c_void_p()
        self._check(self.lib.cuModuleGetFunction(ctypes.byref(function), module, symbol.encode()),
                    f"cuModuleGetFunction {symbol}")
        return function

    def launch(self, function, grid, block, values) -> None:
        pointers = (ctypes.c_void_p * len(values))(*[ctypes.cast(ctypes.byref(v), ctypes.c_void_p) for v in values])
        stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
        self._check(self.lib.cuLaunchKernel(function, *grid, *block, 0, stream, pointers, None), "cuLaunchKernel")


def operands(workload: dict, dims: dict, generator: torch.Generator) -> dict:
    """Random inputs named as the kernels' parameters, and a NaN-filled output."""
    b, m, n, k = (dims[d] for d in "bmnk")

    def uniform(*shape):
        return torch.rand(shape, generator=generator, device="cuda") * 2 - 1

    if workload["kind"] == "dense":
        tensors = {"x": uniform(1, m, k), "w": uniform(k, n)}
        if workload["bias"]:
            tensors["bias"] = uniform(n)
    else:
        tensors = {"x": uniform(b, m, k), "y": uniform(*((b, n, k) if workload["transpose_b"] else (b, k, n))),
                   "alpha": 0.125}
        if workload["bias"]:
            tensors["addend"] = uniform(b, m, n)
    tensors["out"] = torch.full((b if workload["kind"] != "dense" else 1, m, n), float("nan"), device="cuda")
    return tensors


def activation(name: str, x: torch.Tensor) -> torch.Tensor:
    functions = {"none": lambda v: v, "relu": torch.relu, "tanh": torch.tanh, "sigmoid": torch.sigmoid,
                 "gelu": torch.nn.functional.gelu,
                 "gelu_tanh": lambda v: torch.nn.functional.gelu(v, approximate="tanh"),
                 "silu": torch.nn.functional.silu}
    return functions[name](x)


def reference(workload: dict, t: dict) -> torch.Tensor:
    """The fused op in float64."""
    x = t["x"].double()
    if workload["kind"] == "dense":
        product = x @ t["w"].double() + (t["bias"].double() if workload["bias"] else 0)
        return activation(workload["activation"], product)
    y = t["y"].double()
    product = t["alpha"] * (x @ (y.transpose(1, 2) if workload["transpose_b"] else y))
    return product + t["addend"].double() if workload["bias"] else product


def cublas_call(workload: dict, t: dict):
    """torch's one cuBLAS call for the same fused op (plus the activation, if any), writing t["out"]."""
    out = t["out"]
    if workload["kind"] == "dense":
        x, flat = t["x"][0], out[0]
        if workload["bias"]:
            run = lambda: torch.addmm(t["bias"], x, t["w"], out=flat)  # noqa: E731
        else:
            run = lambda: torch.mm(x, t["w"], out=flat)  # noqa: E731
        if workload["activation"] == "none":
            return run
        return lambda: flat.copy_(activation(workload["activation"], run()))
    y = t["y"].transpose(1, 2) if workload["transpose_b"] else t["y"]
    if workload["bias"]:
        return lambda: torch.baddbmm(t["addend"], t["x"], y, alpha=t["alpha"], out=out)
    unused = torch.zeros_like(out)  # beta = 0: cuBLAS never reads it
    return lambda: torch.baddbmm(unused, t["x"], y, beta=0, alpha=t["alpha"], out=out)


def kernel_call(driver: Driver, function, launch: dict, dims: dict, t: dict):
    values, alignment = [], launch.get("alignment", 4)
    for name, kind in launch["params"]:
        if kind == "pointer":
            if t[name].data_ptr() % alignment:
                raise ValueError(f"{launch['symbol']}: {name} is not {alignment}-byte aligned, as its copies need")
            values.append(ctypes.c_void_p(t[name].data_ptr()))
        else:
            values.append(_SCALARS[kind](t[name] if name in t else dims[name.lower()]))
    grid = [-(-dims[d] // tile) for d, tile in launch["grid"]]
    return lambda: driver.launch(function, grid, launch["block"], values)


def seconds(call) -> float:
    """Median time of one call: n calls in a CUDA graph, replayed between events."""
    call()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    call()
    end.record()
    end.synchronize()
    n = int(min(100, max(4, TARGET_SECONDS / max(start.elapsed_time(end) * 1e-3, 1e-7))))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(n):
            call()
    graph.replay()
    times = []
    for _ in range(REPEATS):
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e-3 / n)
    return statistics.median(times)


def error(t: dict, expected: torch.Tensor, call) -> float:
    """max |out - expected| / max |expected| after one call on a NaN-filled output (inf if any NaN)."""
    t["out"].fill_(float("nan"))
    call()
    torch.cuda.synchronize()
    difference = (t["out"].double() - expected).abs().max().item()
    scale = max(expected.abs().max().item(), 1e-30)
    return float("inf") if np.isnan(difference) else difference / scale


def device_properties() -> dict:
    p = torch.cuda.get_device_properties(0)
    return {"name": p.name, "capability": f"{p.major}.{p.minor}", "sms": p.multi_processor_count,
            "memory_gib": round(p.total_memory / 2**30, 1), "torch": torch.__version__,
            "cuda": torch.version.cuda, "blas": str(torch.backends.cuda.preferred_blas_library())}


def main(kernel_set: pathlib.Path, out: pathlib.Path, rounds: int = 1, workload_index: int | None = None) -> None:
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    manifest = json.loads((kernel_set / "manifest.json").read_text())
    driver = Driver()
    out.mkdir(parents=True, exist_ok=True)
    (out / "device.json").write_text(json.dumps(device_properties(), indent=1))
    print(device_properties(), flush=True)
    generator = torch.Generator(device="cuda").manual_seed(0)
    library = manifest.get("dispatch_library")
    trees = ctypes.CDLL(str(kernel_set / library)) if library else None
    with open(out / "measurements.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["workload", "kernel", "static", "t", "b", "m", "n", "k", "round", "seconds", "error"])
        entries = manifest["workloads"]
        for entry in entries if workload_index is None else [entries[workload_index]]:
            workload, failures = entry["workload"], 0
            module = driver.load((kernel_set / entry["fatbin"]).read_bytes())
            for shape in entry["shapes"]:
                dims = {d: shape[d] for d in "bmnk"}
                t = operands(workload, dims, generator)
                expected = reference(workload, t)
                peer = cublas_call(workload, t)
                records = [r for r in entry["kernels"] if r["static_dims"] in (None, dims)]
                if trees is not None:  # a bundle: only the kernel its tree picks (none outside its ranges)
                    tree = getattr(trees, entry["dispatch"])
                    tree.restype, tree.argtypes = ctypes.c_int64, [ctypes.c_int64] * 4
                    index = tree(*(dims[d] for d in "bmnk"))
                    records = [] if index < 0 else [entry["kernels"][index]]
                calls = [(record, kernel_call(driver, driver.function(module, record["launch"]["symbol"]),
                                              record["launch"], dims, t)) for record in records]
                for record, call in calls:
                    record["error"] = error(t, expected, call)
                    failures += record["error"] > TOLERANCE
                for round_ in range(rounds):  # each round times every kernel: rounds interleave them
                    row = [entry["describe"], shape["t"], *(dims[d] for d in "bmnk"), round_]
                    writer.writerow([row[0], "cublas", False, *row[1:], seconds(peer), error(t, expected, peer)])
                    for record, call in calls:
                        writer.writerow([row[0], record["name"], record["static_dims"] is not None, *row[1:],
                                         seconds(call), record["error"]])
                    # cuBLAS again after the kernels: the two timings bound the run's drift at this shape
                    writer.writerow([row[0], "cublas_again", False, *row[1:], seconds(peer),
                                     error(t, expected, peer)])
                f.flush()
                print(entry["describe"], "T =", shape["t"], "done", flush=True)
            print(entry["describe"], "kernels over tolerance:", failures, flush=True)

if __name__ == "__main__":
    main(pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2]), *map(int, sys.argv[3:5]))
