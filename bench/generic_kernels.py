"""Generic kernels of the fused ops against TF's own op sequence, in-graph.

    python -m bench.generic_kernels [--quick] [--out bench/results]

Writes generic_kernels.csv (ms, GFLOP/s and speed-up over TF per workload and
T) and generic_kernels.png, and prints the geometric-mean speed-ups.
"""

import math
import os

import tensorflow as tf
from tqdm import tqdm

from bench import cli, in_graph_timing, report
from bench.threads import use_threads
from bench.workloads import QUICK_SEQUENCE_LENGTHS, WORKLOADS

PEERS = ("tensorflow", "dietcode")


def measure(workloads, sequence_lengths, repeats):
    rows = []
    jobs = [(w, t) for w in workloads for t in (sequence_lengths if "seed" not in w.name else (17,))]
    for workload, t in tqdm(jobs, desc="generic kernels", unit="shape"):
        inputs = workload.inputs(t)
        times = {peer: in_graph_timing.seconds_per_call(getattr(workload, peer), inputs, repeats)
                 for peer in PEERS}
        for peer, seconds in times.items():
            rows.append({"workload": workload.name, "T": t, "peer": peer, "ms": seconds * 1e3,
                         "gflops": workload.flops(t) / max(seconds, 1e-12) / 1e9,
                         "speedup_vs_tensorflow": times["tensorflow"] / max(seconds, 1e-12)})
    return rows


def geomean_speedups(rows):
    by_workload = {}
    for row in rows:
        if row["peer"] == "dietcode":
            by_workload.setdefault(row["workload"], []).append(row["speedup_vs_tensorflow"])
    return {w: math.exp(sum(map(math.log, s)) / len(s)) for w, s in by_workload.items()}


def main(argv=None):
    parser = cli.parser(__doc__, "bench/results", f"T in {QUICK_SEQUENCE_LENGTHS} only")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2, help="intra-op threads for every peer")
    args = parser.parse_args(argv)
    use_threads(args.threads)

    rows = measure(WORKLOADS, cli.sequence_lengths(args.quick), args.repeats)
    args.out.mkdir(parents=True, exist_ok=True)
    csv_path = args.out / "generic_kernels.csv"
    report.write_csv(rows, csv_path)
    report.speedup_by_t(rows, args.out / "generic_kernels.png",
                       title=f"Generic kernels vs TF {tf.__version__} (in-graph, {args.threads} threads)")

    print(f"\n{'workload':36s} {'T':>4s} {'TF ms':>9s} {'dietcode ms':>12s} {'speed-up':>9s}")
    for row in rows:
        if row["peer"] == "dietcode":
            tf_ms = row["ms"] * row["speedup_vs_tensorflow"]
            print(f"{row['workload']:36s} {row['T']:4d} {tf_ms:9.3f} {row['ms']:12.3f} {row['speedup_vs_tensorflow']:8.2f}x")
    print(f"\n{'workload':36s} {'geomean speed-up vs TF':>24s}")
    for workload, speedup in geomean_speedups(rows).items():
        print(f"{workload:36s} {speedup:24.2f}x")
    print(f"\nwrote {csv_path} and {args.out / 'generic_kernels.png'}")


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    main()
