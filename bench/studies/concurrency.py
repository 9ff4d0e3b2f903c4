"""Concurrent callers of the tuned ops: do they share the cores or fight over them?

    python -m bench.studies.concurrency [--bundle bench/results/bundle]

Tuned kernels run their parallel loops on TF's intra-op pool, so concurrent
ops queue on the same threads instead of each starting its own. This runs 1,
2 and 4 callers at once (Python threads, each an in-graph loop of its own
tf.function; and 2 TF1 Sessions) on one tuned op, and TF's own op for the
same product as the peer. Per caller count it reports the aggregate
throughput relative to one caller: 1.0 means the cores stay busy with no loss,
well below 1.0 means oversubscription costs. Writes concurrency.csv.
"""

import argparse
import os
import pathlib

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from bench import report, timing, workloads  # noqa: E402
from bench.threads import use_threads  # noqa: E402
from bench.tuned_kernels import read_bundle_manifest  # noqa: E402
from tf_dietcode import ops  # noqa: E402
from tf_dietcode.tuning.templates import dense  # noqa: E402

ITERATIONS = 200
SEQUENCE_LENGTHS = (1, 5, 62)  # T = 1 (M = 16): calls small enough that the op's thread joins the pool


def eager_loops(compute, inputs, callers):
    loops = [timing.in_graph_loop(compute, inputs) for _ in range(callers)]
    for loop in loops:
        loop(tf.constant(2)).numpy()  # trace and warm up
    return [lambda n, loop=loop: loop(tf.constant(n)).numpy() for loop in loops]


def session_loops(compute, inputs, callers):
    """One TF1 Session per caller, each with its own graph of the same loop."""
    runs = []
    for _ in range(callers):
        graph = tf.Graph()
        with graph.as_default():
            count = tf.compat.v1.placeholder(tf.int32, [])
            result = timing.in_graph_loop(compute, [tf.constant(x) for x in inputs])(count)
        session = tf.compat.v1.Session(graph=graph)
        session.run(result, {count: 2})
        runs.append(lambda n, session=session, result=result, count=count: session.run(result, {count: n}))
    return runs


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bundle", type=pathlib.Path, default=pathlib.Path("bench/results/bundle"))
    parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path("bench/results"))
    args = parser.parse_args(argv)
    manifest = read_bundle_manifest(args.bundle)
    use_threads(inter_op=4)
    layout = manifest["workloads"][0]["weight_layout"]  # dense b16, N=2304, K=768
    rng = np.random.default_rng(0)
    w = rng.uniform(-1, 1, (2304, 768)).astype(np.float32)
    bias = rng.uniform(-1, 1, 2304).astype(np.float32)
    weight, packed_n = dense.weight_operand(w, layout)
    path = str(args.bundle)
    peers = {
        "dietcode": (lambda x, wp, b: ops.fused_matmul(x, wp, b, packed_n=packed_n, bundle=path), weight),
        "tensorflow": (workloads.tf_dense, np.ascontiguousarray(w.T)),
    }
    rows = []
    for t in SEQUENCE_LENGTHS:
        x = rng.uniform(-1, 1, (16 * t, 768)).astype(np.float32)
        for peer, (compute, weight) in peers.items():
            inputs = [x, weight, bias]
            for mode, make in (("threads", eager_loops), ("sessions", session_loops)):
                single = timing.concurrent_seconds(make(compute, [tf.constant(v) for v in inputs]
                                                 if mode == "threads" else inputs, 1), ITERATIONS)
                for callers in (1, 2, 4) if mode == "threads" else (1, 2):
                    runs = make(compute, [tf.constant(v) for v in inputs] if mode == "threads" else inputs, callers)
                    seconds = timing.concurrent_seconds(runs, ITERATIONS)
                    rows.append({"T": t, "peer": peer, "mode": mode, "callers": callers,
                                 "ms_per_call": seconds / (callers * ITERATIONS) * 1e3,
                                 "throughput_vs_one_caller": single * callers / seconds})
                    print(f"T={t:4d} {peer:10s} {mode:8s} callers={callers}  "
                          f"{rows[-1]['ms_per_call']:8.3f} ms/call  throughput x{rows[-1]['throughput_vs_one_caller']:.2f}")
    args.out.mkdir(parents=True, exist_ok=True)
    report.write_csv(rows, args.out / "concurrency.csv")
    print(f"wrote {args.out / 'concurrency.csv'}")


if __name__ == "__main__":
    main()
