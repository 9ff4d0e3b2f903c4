"""The int8 and bfloat16 dense ops against DietcodeFusedMatMul (float32, generic kernel) on each
kernel path this CPU runs, and the weight bytes each streams per second.

    python -m bench.studies.low_precision_dense [--threads 2]

Times each op in-graph (bench.timing) in interleaved rounds at M = 1, 16, 128 for BERT-base's
two FFN shapes; a path is forced with TF_DIETCODE_DISABLE_ISA around its samples (the op
library reads it on every call). Prints a table: microseconds per call and, for the weight,
GB/s (its bytes over the time). The weights (2.4 to 9.4 MB) stay in the last-level cache
between calls: a model's layers read theirs from DRAM.
"""

import argparse
import contextlib
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from bench import timing  # noqa: E402
from bench.threads import use_threads  # noqa: E402
from tf_dietcode import ops  # noqa: E402
from tf_dietcode.precision import bf16_weights, int8_weights  # noqa: E402

SHAPES = [(768, 3072), (3072, 768)]  # (K, N)
ROWS = [1, 16, 128]
# label -> (op, TF_DIETCODE_DISABLE_ISA)
PATHS = {"int8 avx512_vnni": ("int8", ""), "int8 avx2": ("int8", "amx_int8,avx512_vnni"),
         "bf16 avx512_bf16": ("bf16", ""), "bf16 avx2": ("bf16", "amx_bf16,avx512_bf16")}


@contextlib.contextmanager
def disabled(names: str):
    before = os.environ.get("TF_DIETCODE_DISABLE_ISA", "")
    os.environ["TF_DIETCODE_DISABLE_ISA"] = names
    try:
        yield
    finally:
        os.environ["TF_DIETCODE_DISABLE_ISA"] = before


def timers(m: int, k: int, n: int, rng) -> dict:
    a = tf.constant(rng.standard_normal((m, k)).astype(np.float32))
    w = rng.standard_normal((k, n)).astype(np.float32)
    bias = tf.constant(rng.standard_normal(n).astype(np.float32))
    q = int8_weights.quantize(w)
    int8 = [tf.constant(q.packed), tf.constant(q.scale), tf.constant(q.column_sums)]
    bf16 = tf.constant(bf16_weights.pack(w))
    computations = {
        "float32": (lambda a, w, bias: ops.fused_matmul(a, w, bias), [a, tf.constant(w), bias], 4 * k * n),
        "int8": (lambda a, b, s, c, bias: ops.fused_matmul_int8(a, b, s, c, bias, n=n), [a, *int8, bias], k * n),
        "bf16": (lambda a, b, bias: ops.fused_matmul_bf16(a, b, bias, n=n), [a, bf16, bias], 2 * k * n),
    }
    result = {"float32": (timing.in_graph_timer(*computations["float32"][:2]), computations["float32"][2])}
    for label, (op, names) in PATHS.items():
        with disabled(names):
            if not ops.low_precision_isa()[{"int8": "int8", "bf16": "bfloat16"}[op]] in label:
                continue
            timer = timing.in_graph_timer(*computations[op][:2])

        def sample(timer=timer, names=names):
            with disabled(names):
                return timer()
        result[label] = (sample, computations[op][2])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    use_threads(args.threads)
    rng = np.random.default_rng(0)
    print(f"{'K':>5} {'N':>5} {'M':>4}  " + "  ".join(f"{label:>22}" for label in ["float32", *PATHS]))
    for k, n in SHAPES:
        for m in ROWS:
            entries = timers(m, k, n, rng)
            seconds = dict(zip(entries, timing.median_seconds(*(timer for timer, _ in entries.values()))))
            cells = [f"{seconds[label] * 1e6:8.1f} us {entries[label][1] / seconds[label] / 1e9:6.1f} GB/s"
                     if label in seconds else f"{'-':>22}" for label in ["float32", *PATHS]]
            print(f"{k:>5} {n:>5} {m:>4}  " + "  ".join(cells), flush=True)


if __name__ == "__main__":
    main()
