"""The main job end to end: a BERT-style encoder SavedModel with a dynamic
sequence length, optimized by tf_dietcode, timed against the original.

    python -m bench.demo [--quick] [--out bench/results/demo]

Builds the encoder with Keras 3 layers as users write them (token and position
embeddings, MultiHeadAttention, a GELU feed-forward block, LayerNorm), exports
it, runs tf_dietcode.optimize() for batch 1 and T in [1, 128] (quick tuning
with --quick), checks the outputs agree, and times one signature call per
inference of each model at every T (TF's default options; blocks of back-to-back calls
in alternating rounds, medians: bench.timing.block_seconds). Writes
demo.csv and demo.png and prints the table.
"""

import os
import shutil
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import tf_dietcode  # noqa: E402
from bench import cli, encoder, report, timing  # noqa: E402
from tf_dietcode.tuning.database import Database  # noqa: E402


def outputs_agree(outputs: dict[str, dict[str, tf.Tensor]]) -> None:
    """The optimized signature's outputs against the original's."""
    for key, expected in outputs["tensorflow"].items():
        np.testing.assert_allclose(outputs["dietcode"][key], expected, rtol=1e-4, atol=1e-4)


def main(argv=None):
    parser = cli.parser(__doc__, "bench/results/demo", "quick tuning and a few T")
    args = parser.parse_args(argv)
    original, optimized = args.out / "original", args.out / "optimized"
    shutil.rmtree(original, ignore_errors=True)
    model = encoder.DEMO
    encoder.build(model).export(str(original), verbose=False)
    started = time.perf_counter()
    result = tf_dietcode.optimize(original, optimized, shape_ranges={"input_ids": [1, (1, model.max_length)]},
                                  tuning=cli.search_options(args.quick),
                                  database=Database(args.out / "tuning.jsonl"), overwrite=True)
    print(result.summary())
    print(f"optimize() took {time.perf_counter() - started:.0f} s")

    before = tf.saved_model.load(str(original)).signatures["serving_default"]
    after = tf.saved_model.load(str(optimized)).signatures["serving_default"]
    rows = []
    rng = np.random.default_rng(0)
    print(f"\n{'T':>4s} {'original ms':>12s} {'optimized ms':>13s} {'speed-up':>9s}")
    for t in cli.sequence_lengths(args.quick):
        ids = tf.constant(rng.integers(0, model.vocabulary, (1, t)), tf.int32)
        seconds = timing.block_medians({"tensorflow": lambda: before(input_ids=ids),
                                        "dietcode": lambda: after(input_ids=ids)}, check=outputs_agree)
        for peer, value in seconds.items():
            rows.append({"workload": f"{model.name}_batch1", "T": t, "peer": peer, "ms": value * 1e3,
                         "speedup_vs_tensorflow": seconds["tensorflow"] / value})
        print(f"{t:4d} {seconds['tensorflow'] * 1e3:12.2f} {seconds['dietcode'] * 1e3:13.2f} "
              f"{seconds['tensorflow'] / seconds['dietcode']:8.2f}x")
    speedups = [r["speedup_vs_tensorflow"] for r in rows if r["peer"] == "dietcode"]
    print(f"geometric-mean speed-up {report.geomean(speedups):.2f}x "
          f"(worst {min(speedups):.2f}x); outputs agree at every T")
    report.write_csv(rows, args.out / "demo.csv")
    report.plot_by_t(rows, args.out / "demo.png", title=f"optimize() on a {model.layers}-layer encoder, batch 1")
    print(f"wrote {args.out / 'demo.csv'} and {args.out / 'demo.png'}")


if __name__ == "__main__":
    main()
