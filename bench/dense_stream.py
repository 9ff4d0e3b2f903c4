"""A model's dense layers at small M, where they stream their weights: effective bandwidth against DRAM.

    python -m bench.dense_stream [--quick] [--rows 1 5 17] [--precisions float32 bfloat16 int8]
                                 [--out bench/results/dense_stream]

BERT-base's 72 dense layers (12 x [4 x 768x768, 768x3072 with GELU, 3072x768], with bias) as the fused
ops an optimized model runs, one after another in one graph, each with a weight of its own (340 MB in
float32, ten times a 32 MiB last-level cache, so each call reads its weight from DRAM as the model's
do), at M rows. Each precision converts and calls its weights through its mode
(tf_dietcode.precision.modes); float32 runs the kernels tuned for M = 1..128 (from the user's tuning
database, tuned where absent; --quick: the quick budget). The layers alone, timed in-graph: no
profiler adds its cost per op, and no other op shares their time.

Effective bandwidth = weight bytes per pass / time per pass, against the DRAM read bandwidth
(bench/dram_read.c, two threads) measured in the same rounds (bench.timing.round_samples: interleaved,
medians): how close a call at small T comes to the limit its weights set.
Writes dense_stream.csv (precision, M, ms, weight MB, GB/s, DRAM read GB/s, fraction of it) and
prints it.
"""

import os
import pathlib
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from bench import cli, peak, report, timing  # noqa: E402
from bench.threads import use_threads  # noqa: E402
from tf_dietcode.precision import modes  # noqa: E402

HIDDEN, FFN, LAYERS, HEADS_PROJECTIONS = 768, 3072, 12, 4
# (K, N, activation) of one encoder layer's dense layers, in the order a call runs them.
LAYER = [(HIDDEN, HIDDEN, "none")] * HEADS_PROJECTIONS + [(HIDDEN, FFN, "gelu"), (FFN, HIDDEN, "none")]
MAX_ROWS = 128
THREADS = 2


def float32_layouts(quick: bool, store: pathlib.Path) -> tuple[str, dict]:
    """The tuned float32 bundle of the three layer shapes for M = 1..MAX_ROWS (weights read from DRAM),
    and each shape's weight layout."""
    from tf_dietcode import tuned_bundles
    from tf_dietcode.tuning.workload import Workload

    workloads = {(k, n, act): Workload("dense", (1, MAX_ROWS), n, k, bias=True, activation=act, cold_weight=True)
                 for k, n, act in dict.fromkeys(LAYER)}
    tuned = tuned_bundles.tune_and_install(list(workloads.values()), store, options=cli.search_options(quick))
    return str(tuned.manifest), {shape: tuned.kernels[w]["weight_layout"] for shape, w in workloads.items()}


def layer_stack(precision: str, bundle: str, layouts: dict, rng: np.random.Generator):
    """compute(x) running the 72 layers in `precision`, and the bytes of their converted weights."""
    mode = modes.get(precision)
    layers, weight_bytes = [], 0
    for k, n, act in LAYER * LAYERS:
        weight = (rng.uniform(-1, 1, (k, n)) / np.sqrt(k)).astype(np.float32)
        arrays = mode.convert(weight, layouts.get((k, n, act)))
        weight_bytes += sum(value.nbytes for value in arrays.values())
        converted = {name: tf.Variable(value) for name, value in arrays.items()}
        layers.append((converted, tf.Variable(rng.uniform(-1, 1, n).astype(np.float32)), n, act))

    def compute(x):
        for converted, bias, n, act in layers:
            x = mode.product(x, converted, bias, n=n, activation=act, bundle=bundle if mode.tuned else "")
        return x

    return compute, weight_bytes


def main(argv=None):
    parser = cli.parser(__doc__, "bench/results/dense_stream", "the quick tuning budget for the float32 kernels")
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 5, 17])
    parser.add_argument("--precisions", nargs="+", default=list(modes.PRECISIONS), choices=list(modes.PRECISIONS))
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    use_threads(THREADS)
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory(prefix="dense_stream-") as scratch:
        bundle, layouts = float32_layouts(args.quick, pathlib.Path(scratch) / "bundles")
        stacks = {p: layer_stack(p, bundle, layouts, rng) for p in args.precisions}
        dram = peak.build("dram_read", pathlib.Path(scratch))
        rows = []
        for m in args.rows:
            x = tf.constant(rng.uniform(-1, 1, (m, HIDDEN)).astype(np.float32))
            timers = [timing.in_graph_timer(compute, [x]) for compute, _ in stacks.values()]
            samples = timing.round_samples(lambda: peak.run_measure(dram, THREADS), *timers)
            dram_gbps = float(np.median(samples[0]))
            for (precision, (_, weight_bytes)), runs in zip(stacks.items(), samples[1:]):
                seconds = float(np.median(runs))
                gbps = weight_bytes / seconds / 1e9
                rows.append({"precision": precision, "M": m, "ms": seconds * 1e3, "weight_mb": weight_bytes / 1e6,
                             "gbps": gbps, "dram_read_gbps": dram_gbps, "fraction_of_dram_read": gbps / dram_gbps})
    report.write_csv(rows, args.out / "dense_stream.csv")
    print(f"{'precision':>9} {'M':>4} {'ms':>7} {'MB':>6} {'GB/s':>6} {'DRAM':>6} {'share':>6}")
    for row in rows:
        print(f"{row['precision']:>9} {row['M']:>4} {row['ms']:7.2f} {row['weight_mb']:6.0f} {row['gbps']:6.1f} "
              f"{row['dram_read_gbps']:6.1f} {row['fraction_of_dram_read']:6.2f}")
    print(f"wrote {args.out / 'dense_stream.csv'}")


if __name__ == "__main__":
    main()
