"""Attention's two products in float32 and, at best, in bfloat16 on this CPU: what running them
in bfloat16 could gain.

    python -m bench.studies.attention_products [--lengths 43 128] [--out bench/results/attention_products]

BERT-base's attention at batch 1 (12 heads of depth 64) at each T: the scores Q @ K^T ([T, 64] x
[64, T] per head) and the context P @ V ([T, T] x [T, 64] per head), timed in-graph in
interleaved rounds (bench.timing):
- float32: TF's BatchMatMulV2 over the heads, one op, as stock TF runs them;
- bfloat16: the bfloat16 dense op once per head, its right operand rounded and packed before the
  timing. A bound on a bfloat16 product built on those tiles: a real one also rounds and packs
  both operands, activations both, on every call.
Beside each: GFLOP/s and its share of this run's float32 FMA and bfloat16 dot-product peaks
(bench/fma_peak.c, two threads). Writes attention_products.csv and prints it.
"""

import argparse
import os
import pathlib

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from bench import peak, report, timing  # noqa: E402
from bench.threads import use_threads  # noqa: E402
from tf_dietcode import ops  # noqa: E402
from tf_dietcode.precision import bf16_weights  # noqa: E402

HEADS, DEPTH, THREADS = 12, 64, 2


def products(t: int) -> dict[str, tuple[int, int, int]]:
    """Each product's per-head (M, K, N)."""
    return {"scores": (t, DEPTH, t), "context": (t, t, DEPTH)}


def timers(m: int, k: int, n: int, rng: np.random.Generator) -> dict:
    """precision -> in-graph timer of the product over the heads."""
    left = rng.standard_normal((1, HEADS, m, k)).astype(np.float32)
    right = rng.standard_normal((1, HEADS, k, n)).astype(np.float32)
    packed = [tf.constant(bf16_weights.pack(right[0, h])) for h in range(HEADS)]

    def per_head_bf16(x):  # a corner of each head's product read, so that none is pruned
        return tf.add_n([ops.fused_matmul_bf16(x[0, h], packed[h], None, n=n)[:1, :1] for h in range(HEADS)])

    return {"float32": timing.in_graph_timer(tf.linalg.matmul, [tf.constant(left), tf.constant(right)]),
            "bfloat16": timing.in_graph_timer(per_head_bf16, [tf.constant(left)])}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", type=int, nargs="+", default=[43, 128])
    parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path("bench/results/attention_products"))
    args = parser.parse_args(argv)
    use_threads(THREADS)
    rng = np.random.default_rng(0)
    peaks = {"float32": peak.fma_peak_gflops(THREADS),
             "bfloat16": dict((m, v) for m, v, _ in peak.dot_loop_peaks(THREADS)).get("bf16_dot_loop")}
    path = ops.low_precision_isa()["bfloat16"]
    rows = []
    for t in args.lengths:
        for product, (m, k, n) in products(t).items():
            found = timers(m, k, n, rng)
            for precision, samples in zip(found, timing.round_samples(*found.values())):
                seconds = float(np.median(samples))
                gflops = 2.0 * HEADS * m * k * n / seconds / 1e9
                limit = peaks[precision]
                rows.append({"T": t, "product": product, "precision": precision,
                             "kernel": "tensorflow" if precision == "float32" else f"dietcode {path}",
                             "us": seconds * 1e6, "gflops": gflops, "peak_gflops": limit,
                             "share_of_peak": gflops / limit if limit else None})
    args.out.mkdir(parents=True, exist_ok=True)
    report.write_csv(rows, args.out / "attention_products.csv")
    for row in rows:
        share = f"{row['share_of_peak']:.2f}" if row["share_of_peak"] is not None else "-"
        print(f"T={row['T']:4d} {row['product']:8s} {row['precision']:9s} {row['kernel']:22s} "
              f"{row['us']:8.1f} us {row['gflops']:6.1f} GFLOP/s  {share} of its peak")
    print(f"wrote {args.out / 'attention_products.csv'}")


if __name__ == "__main__":
    main()
