"""DietCode-tuned dense micro-kernels against TF, and symbolic vs static AOT.

    python -m bench.tuned_dense [--quick] [--out bench/results]

Tunes Dense [16T,768]x[2304,768]^T + bias and [T,768]x[2304,768]^T + bias once
each for T in [1, 128] (tuning database <out>/tuning.jsonl, resumed), then at
each T times TF's MatMul+BiasAdd in-graph, the bundle's dispatched kernel
(TVM's time_evaluator: no Python in the loop) and the same micro-kernel
compiled for that static M. Writes tuned_dense.csv and tuned_dense.png.
"""

import argparse
import csv
import math
import os
import pathlib
import time

os.environ.setdefault("TVM_NUM_THREADS", "2")
os.environ.setdefault("TVM_BIND_THREADS", "0")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import tvm  # noqa: E402

from bench import in_graph_timing, plots  # noqa: E402
from bench.workloads import QUICK_SEQUENCE_LENGTHS, SEQUENCE_LENGTHS  # noqa: E402
from tf_dietcode import reference  # noqa: E402
from tf_dietcode.tuning import bundle, hardware, measure, search  # noqa: E402
from tf_dietcode.tuning.database import Database  # noqa: E402
from tf_dietcode.tuning.tune import tune  # noqa: E402
from tf_dietcode.tuning.workload import Workload  # noqa: E402

BATCHES = (16, 1)
N, K = 2304, 768


def tvm_seconds(module, name, arguments):
    timer = module.time_evaluator(name, tvm.cpu(), number=1, repeat=7, min_repeat_ms=30)
    return float(np.median(timer(*arguments).results))


def tf_seconds(operands):
    inputs = [tf.constant(operands[name]) for name in ("x", "w", "bias")]
    return in_graph_timing.seconds_per_call(
        lambda x, w, b: reference.fused_matmul(x, w, b, transpose_b=True), inputs)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="T in a few values and the quick search budget")
    parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path("bench/results"))
    args = parser.parse_args(argv)
    tf.config.threading.set_intra_op_parallelism_threads(2)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    args.out.mkdir(parents=True, exist_ok=True)
    sequence_lengths = QUICK_SEQUENCE_LENGTHS if args.quick else SEQUENCE_LENGTHS
    options = search.QUICK if args.quick else search.SearchOptions()
    hw = hardware.detect()
    rng = np.random.default_rng(0)

    workloads = [Workload("dense", (b, 128 * b), N, K, bias=True) for b in BATCHES]
    started = time.perf_counter()
    report = tune(workloads, args.out / "bundle_dense", options=options,
                  database=Database(args.out / "tuning.jsonl"))
    tuning_seconds = time.perf_counter() - started
    module = tvm.runtime.load_module(str(args.out / "bundle_dense" / bundle.LIBRARY))

    cases = [(b, t, w, d) for b, w, d in zip(BATCHES, workloads, report.dispatches) for t in sequence_lengths]
    operands = {(b, t): measure.random_operands(w, b * t, rng) for b, t, w, _ in cases}
    tf_times = {key: tf_seconds(value) for key, value in operands.items()}  # before TVM's pool spins up

    rows = []
    for w_index, (b, t, workload, dispatch) in enumerate(cases):
        m = b * t
        index = dispatch.kernel_index(m)
        kernel = dispatch.kernels[index]
        arguments = measure.kernel_arguments(operands[(b, t)], workload, kernel)
        symbolic = tvm_seconds(module, bundle.kernel_symbol(BATCHES.index(b), index), arguments)
        static = tvm_seconds(measure.compile_kernel(workload, kernel, hw, m).mod, "main", arguments)
        for peer, seconds in (("tensorflow", tf_times[(b, t)]), ("dietcode", symbolic), ("dietcode_static", static)):
            rows.append({"workload": f"dense_b{b}_{N}x{K}", "T": t, "peer": peer, "kernel": kernel.name,
                         "ms": seconds * 1e3, "gflops": workload.flops(m) / seconds / 1e9,
                         "speedup_vs_tensorflow": tf_times[(b, t)] / seconds,
                         "symbolic_over_static": symbolic / static})

    csv_path = args.out / "tuned_dense.csv"
    with open(csv_path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    plots.speedup_by_t(rows, args.out / "tuned_dense.png",
                       title=f"Tuned dense micro-kernels vs TF {tf.__version__} ({hw.mcpu}, 2 threads)")

    print(f"\ntuning wall time: {tuning_seconds:.0f} s for {len(workloads)} workloads "
          f"({options.trials} micro-kernels x {options.samples}+ shapes each)")
    print(f"{'workload':22s} {'T':>4s} {'kernel':>20s} {'TF ms':>8s} {'tuned ms':>9s} {'speed-up':>9s} {'sym/static':>10s}")
    for row in rows:
        if row["peer"] == "dietcode":
            print(f"{row['workload']:22s} {row['T']:4d} {row['kernel']:>20s} "
                  f"{row['ms'] * row['speedup_vs_tensorflow']:8.3f} {row['ms']:9.3f} "
                  f"{row['speedup_vs_tensorflow']:8.2f}x {row['symbolic_over_static']:10.3f}")
    for b in BATCHES:
        speedups = [r["speedup_vs_tensorflow"] for r in rows if r["peer"] == "dietcode" and r["workload"].startswith(f"dense_b{b}_")]
        print(f"dense batch {b}: geometric-mean speed-up over TF {math.exp(np.mean(np.log(speedups))):.2f}x, "
              f"worst {min(speedups):.2f}x")
    print(f"wrote {csv_path}")


if __name__ == "__main__":
    main()
