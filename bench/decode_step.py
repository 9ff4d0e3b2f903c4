"""The seeds' shape as a decoder's step runs it: the fused ops against TF's, in-graph.

    python -m bench.decode_step [--quick] [--out bench/results/decode_step]

One new query per sentence x beam x head (64 x 8 = 512 rows, depth 128) against
t cached positions: the scores, q @ k^T plus a padding bias [64, 1, 1, t]
(DietcodeFusedBatchMatMulAdd), and the context, probabilities @ v transposed
back to [64, 1, 8, 128] (DietcodeFusedBatchMatMulTranspose). A SavedModel
computing both with TF's ops is optimized for t in 1..64 (each product one
workload tuned for the whole range); then at each t the optimized model's fused
ops, called with its bundle, and TF's BatchMatMulV2 + AddV2 / + Transpose are
timed in-graph (bench.timing), in interleaved rounds, and checked against each
other. Writes decode_step.csv and decode_step.png.
"""

import os
import pathlib
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import tf_dietcode  # noqa: E402
from bench import cli, report, timing  # noqa: E402
from tf_dietcode import ops  # noqa: E402
from tf_dietcode.tuning.database import Database  # noqa: E402

SENTENCES, HEADS, DEPTH, LONGEST = 64, 8, 128, 64
LENGTHS = (1, 8, 17, 33, 64)
QUICK_LENGTHS = (1, 17, 64)


def scores(q, k, bias):
    return tf.matmul(q, k, adjoint_b=True) + bias


def context(p, v):
    return tf.transpose(tf.matmul(p, v), [0, 2, 1, 3])


class DecodeStep(tf.Module):
    @tf.function(input_signature=[tf.TensorSpec([SENTENCES, HEADS, 1, DEPTH], tf.float32, name="q"),
                                  tf.TensorSpec([SENTENCES, HEADS, None, DEPTH], tf.float32, name="k"),
                                  tf.TensorSpec([SENTENCES, 1, 1, None], tf.float32, name="bias"),
                                  tf.TensorSpec([SENTENCES, HEADS, 1, None], tf.float32, name="p"),
                                  tf.TensorSpec([SENTENCES, HEADS, None, DEPTH], tf.float32, name="v")])
    def step(self, q, k, bias, p, v):
        return {"scores": scores(q, k, bias), "context": context(p, v)}


def tuned_bundle(out: pathlib.Path, quick: bool) -> str:
    """The bundle optimize() tunes for the step's two products over t in 1..64."""
    module = DecodeStep()
    with tempfile.TemporaryDirectory() as scratch:
        tf.saved_model.save(module, scratch, signatures={"serving_default": module.step})
        t = [(1, LONGEST)]
        ranges = {"k": [SENTENCES, HEADS, *t, DEPTH], "bias": [SENTENCES, 1, 1, *t],
                  "p": [SENTENCES, HEADS, 1, *t], "v": [SENTENCES, HEADS, *t, DEPTH]}
        result = tf_dietcode.optimize(scratch, out / "optimized", shape_ranges=ranges, overwrite=True,
                                      tuning=cli.search_options(quick), database=Database(out / "tuning.jsonl"))
    print(result.summary())
    (manifest,) = [p for p in (out / "optimized" / "assets").glob("*.json")]
    return str(manifest)


def operands(t: int, rng) -> list[tf.Tensor]:
    shapes = [(SENTENCES, HEADS, 1, DEPTH), (SENTENCES, HEADS, t, DEPTH), (SENTENCES, 1, 1, t),
              (SENTENCES, HEADS, 1, t), (SENTENCES, HEADS, t, DEPTH)]
    return [tf.constant(rng.standard_normal(s, np.float32)) for s in shapes]


def main(argv=None):
    parser = cli.parser(__doc__, "bench/results/decode_step", "quick tuning, t in 1, 17, 64")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    bundle = tuned_bundle(args.out, args.quick)
    peers = {
        "scores": {"tensorflow": lambda q, k, bias, p, v: scores(q, k, bias),
                   "dietcode": lambda q, k, bias, p, v: ops.fused_batch_matmul_add(q, k, bias, adj_y=True,
                                                                                   bundle=bundle)},
        "context": {"tensorflow": lambda q, k, bias, p, v: context(p, v),
                    "dietcode": lambda q, k, bias, p, v: ops.fused_batch_matmul_transpose(p, v, [0, 2, 1, 3],
                                                                                         bundle=bundle)},
    }
    rng, rows = np.random.default_rng(0), []
    for t in QUICK_LENGTHS if args.quick else LENGTHS:
        inputs = operands(t, rng)
        for product, calls in peers.items():
            expected, actual = (calls[name](*inputs).numpy() for name in ("tensorflow", "dietcode"))
            np.testing.assert_allclose(actual, expected, rtol=1e-4, atol=1e-4, err_msg=f"{product} at t={t}")
            seconds = timing.median_seconds(*(timing.in_graph_timer(call, inputs) for call in calls.values()))
            for name, s in zip(calls, seconds):
                rows.append({"workload": f"{product} [{SENTENCES}x{HEADS}, 1, t, {DEPTH}]", "T": t, "peer": name,
                             "ms": s * 1e3, "speedup_vs_tensorflow": seconds[0] / s})
            print(f"{product:8s} t={t:3d}  TF {seconds[0] * 1e6:8.1f} us  dietcode {seconds[1] * 1e6:8.1f} us  "
                  f"{seconds[0] / seconds[1]:.2f}x")
    report.write_csv(rows, args.out / "decode_step.csv")
    report.plot_by_t(rows, args.out / "decode_step.png", "The seeds' decode-step attention, in-graph", baseline="TF")


if __name__ == "__main__":
    main()
