"""The kernel workloads against every peer a user could pick instead, in one run.

    python -m bench.kernel_peers [--quick] [--out bench/results]

Per workload of bench.workloads and T, with 2 threads everywhere:
- tensorflow: TF's own ops (Grappler and oneDNN on), in-graph (bench.timing);
- dietcode_generic: the fused op's generic kernel (no bundle), in-graph; the
  tuned kernels are bench.tuned_kernels';
- xla: the TF ops as an XLA cluster (jit_compile) per iteration of the same loop,
  steady state; xla_first_call: the first call of a fresh jit_compile function
  at that shape (trace, compile, run): what the first request of a new length pays;
- onnxruntime: the TF ops converted by tf2onnx, ORT's CPU provider, inputs bound
  once, its per-call cost (an Identity model's) taken out;
- tensorflow_onednn_off: as tensorflow, in a child process with oneDNN off.
Every peer's output is checked against TF's. Writes kernel_peers.csv and
kernel_peers.png and prints geometric-mean speed-ups over TF.
"""

import argparse
import json
import os
import pathlib
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from tqdm import tqdm  # noqa: E402

from bench import cli, onednn_off, onnx_peer, report, timing  # noqa: E402
from bench.threads import use_threads  # noqa: E402
from bench.workloads import WORKLOADS  # noqa: E402

TOLERANCE = {"dietcode_generic": 1e-4, "xla": 1e-3, "onnxruntime": 1e-3}
PEERS_PRINTED = ("dietcode_generic", "xla", "onnxruntime", "tensorflow_onednn_off")


def jobs(quick: bool):
    """(workload, T) pairs; the seeds' fixed shape is timed once (at T=17, which it ignores)."""
    return [(w, t) for w in WORKLOADS for t in (cli.sequence_lengths(quick) if "seed" not in w.name else (17,))]


def xla_first_call(compute, inputs) -> tuple[float, np.ndarray]:
    """A fresh XLA function's first call at these shapes (tracing, compiling and one run):
    its seconds and its output."""
    fresh = tf.function(lambda *xs: compute(*xs), jit_compile=True)
    start = time.perf_counter()
    output = fresh(*inputs).numpy()
    return time.perf_counter() - start, output


def onednn_off_worker(quick: bool, out: pathlib.Path) -> None:
    use_threads()
    timings = [timing.in_graph_seconds(w.tensorflow, w.inputs(t)) for w, t in jobs(quick)]
    onednn_off.result_path(out).write_text(json.dumps(timings))


def measure(quick: bool, out: pathlib.Path) -> list[dict]:
    onnx_dir = out / "onnx"
    onnx_peer.export_all(onnx_dir)
    sessions = {w.name: onnx_peer.session(onnx_peer.model_path(onnx_dir, w.name)) for w in WORKLOADS}
    rows = []
    for workload, t in tqdm(jobs(quick), desc="kernel peers", unit="shape"):
        inputs = workload.inputs(t)
        arrays = [x.numpy() for x in inputs]
        expected = workload.tensorflow(*inputs).numpy()
        ort_call = onnx_peer.bound_call(sessions[workload.name], arrays)
        first_call, xla_output = xla_first_call(workload.tensorflow, inputs)
        outputs = {"dietcode_generic": workload.dietcode(*inputs).numpy(), "xla": xla_output,
                   "onnxruntime": ort_call()}
        # Float32 sums of K products differ in their last bits with the summation order, by an
        # amount that scales with the terms, not with the sum: near-zero outputs of a
        # K = 3072 product whose outputs reach 100 differed from TF's by 1.1e-4.
        scale = max(float(np.abs(expected).max(initial=0.0)), 1.0)
        for peer, tolerance in TOLERANCE.items():
            np.testing.assert_allclose(outputs[peer], expected, rtol=tolerance, atol=tolerance * scale,
                                       err_msg=f"{peer} {workload.name} T={t}")
        seconds = {"tensorflow": timing.in_graph_seconds(workload.tensorflow, inputs),
                   "dietcode_generic": timing.in_graph_seconds(workload.dietcode, inputs),
                   "xla": timing.in_graph_seconds(workload.tensorflow, inputs, jit_compile=True),
                   "xla_first_call": first_call,
                   "onnxruntime": max(timing.repeated_call_seconds(ort_call)
                                      - onnx_peer.call_overhead_seconds(arrays[0]), 1e-7)}
        rows += rows_of(workload, t, seconds)
    return rows


def rows_of(workload, t: int, seconds: dict[str, float]) -> list[dict]:
    return [{"workload": workload.name, "T": t, "peer": peer, "ms": value * 1e3,
             "gflops": workload.flops(t) / value / 1e9, "speedup_vs_tensorflow": seconds["tensorflow"] / value}
            for peer, value in seconds.items()]


def main(argv=None):
    parser = cli.parser(__doc__, "bench/results", "T in {1, 17, 62, 128} only")
    parser.add_argument(onednn_off.FLAG, action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.onednn_off_worker:
        return onednn_off_worker(args.quick, args.out)
    off = onednn_off.timings_from_child("bench.kernel_peers", ["--quick"] if args.quick else [], args.out)
    use_threads()
    tf.get_logger().setLevel("ERROR")  # xla_first_call retraces on purpose
    rows = measure(args.quick, args.out)
    tf_seconds = {(r["workload"], r["T"]): r["ms"] / 1e3 for r in rows if r["peer"] == "tensorflow"}
    for (workload, t), seconds in zip(jobs(args.quick), off):
        rows += rows_of(workload, t, {"tensorflow": tf_seconds[workload.name, t],
                                      "tensorflow_onednn_off": seconds})[1:]
    report.write_csv(rows, args.out / "kernel_peers.csv")
    report.plot_by_t([r for r in rows if r["peer"] != "xla_first_call"], args.out / "kernel_peers.png",
                     title=f"Kernels vs peers, latency and speed-up over TF {tf.__version__} (2 threads)")
    print(f"\n{'workload':34s} " + " ".join(f"{p:>22s}" for p in PEERS_PRINTED) + "  (geomean speed-up over TF)")
    by_peer = {peer: report.speedups(rows, peer) for peer in PEERS_PRINTED}
    for workload in WORKLOADS:
        print(f"{workload.name:34s} " + " ".join(
            f"{report.geomean(s for _, s in by_peer[peer][workload.name]):21.2f}x" for peer in PEERS_PRINTED))
    print(f"wrote {args.out / 'kernel_peers.csv'} and {args.out / 'kernel_peers.png'}")


if __name__ == "__main__":
    main()
