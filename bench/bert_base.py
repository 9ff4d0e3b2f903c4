"""BERT-base end to end: the optimized SavedModel against its peers, one call per inference.

    python -m bench.bert_base [--quick] [--batches 1 16] [--out bench/results/bert_base]

Builds a BERT-base encoder (12 layers, hidden 768, 12 heads, FFN 3072) with
Keras 3 layers, exports it, optimizes it with tf_dietcode.optimize() for
batch 1..max(batches) and T in [1, 128], and times at every (batch, T):
- tensorflow: the original SavedModel's signature on stock TF (oneDNN on);
- dietcode: the optimized SavedModel;
- dietcode_unfused: optimized without horizontal fusion (Q, K and V as three
  GEMMs; tuned from the same database, so only the merged GEMM adds tuning);
- xla: the original signature inside tf.function(jit_compile=True), steady
  state (each new shape's compilation happens in the warm-up call);
- onnxruntime: the original converted with tf2onnx, run by ONNX Runtime;
- tensorflow_onednn_off: the original with TF_ENABLE_ONEDNN_OPTS=0, which TF
  reads once at start-up, so it runs in a child process before the others.
All with 2 threads. In-process peers are interleaved and the median taken;
the oneDNN-off ratio crosses processes, so it carries this VM's run-to-run
noise (10-20%). Outputs are checked against the original at every cell.
Writes bert_base.csv and bert_base.png and prints the table with geometric means.
"""

import argparse
import json
import os
import pathlib
import shutil
import subprocess
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import tf_dietcode  # noqa: E402
from bench import cli, encoder, report  # noqa: E402
from bench.threads import use_threads  # noqa: E402
from tf_dietcode.tuning.database import Database  # noqa: E402

MODEL = encoder.BERT_BASE
SECONDS_PER_CELL = 20.0
TOLERANCE = {"dietcode": 1e-4, "dietcode_unfused": 1e-4, "xla": 1e-3, "onnxruntime": 1e-3}


def token_ids(batch: int, t: int) -> np.ndarray:
    return np.random.default_rng(batch * 1000 + t).integers(0, MODEL.vocabulary, (batch, t)).astype(np.int32)


def onnx_session(saved_model: pathlib.Path, path: pathlib.Path):
    """The original converted by tf2onnx (in a child process: it rewrites TF's graph state)."""
    import onnxruntime

    subprocess.run([sys.executable, "-m", "tf2onnx.convert", "--saved-model", str(saved_model), "--output",
                    str(path), "--opset", "17"], check=True, capture_output=True)
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = 2, 1
    session = onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    return lambda ids: session.run(None, {"input_ids": ids})[0]


def onednn_off_seconds(saved_model: pathlib.Path, cells: list[tuple[int, int]], out: pathlib.Path) -> dict:
    """Seconds per cell of the original with oneDNN off, timed in a child process."""
    result = out / "onednn_off.json"
    environment = dict(os.environ, TF_ENABLE_ONEDNN_OPTS="0")
    subprocess.run([sys.executable, "-m", "bench.bert_base", "--onednn-off-worker", str(saved_model),
                    "--cells", json.dumps(cells), "--out", str(out)], check=True, env=environment)
    return {tuple(cell): seconds for cell, seconds in json.loads(result.read_text())}


def onednn_off_worker(saved_model: str, cells: list[tuple[int, int]], out: pathlib.Path) -> None:
    use_threads()
    model = tf.saved_model.load(saved_model)  # kept: a signature does not keep its variables alive
    signature = model.signatures["serving_default"]
    timings = []
    for batch, t in cells:
        ids = tf.constant(token_ids(batch, t))
        seconds = encoder.median_seconds({"off": lambda: signature(input_ids=ids)}, budget_seconds=SECONDS_PER_CELL / 4)
        timings.append(((batch, t), seconds["off"]))
    (out / "onednn_off.json").write_text(json.dumps(timings))


def optimize(original: pathlib.Path, optimized: pathlib.Path, batches: list[int], quick: bool,
             out: pathlib.Path, horizontal_fusion: bool) -> None:
    started = time.perf_counter()
    result = tf_dietcode.optimize(original, optimized,
                                  shape_ranges={"input_ids": [(min(batches), max(batches)), (1, MODEL.max_length)]},
                                  tuning=cli.search_options(quick), horizontal_fusion=horizontal_fusion,
                                  database=Database(out / "tuning.jsonl"), overwrite=True)
    print(result.summary())
    print(f"optimize() took {time.perf_counter() - started:.0f} s")


def main(argv=None):
    parser = cli.parser(__doc__, "bench/results/bert_base", "quick tuning and a few T")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--onednn-off-worker", metavar="SAVED_MODEL", help=argparse.SUPPRESS)
    parser.add_argument("--cells", type=json.loads, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.onednn_off_worker:
        return onednn_off_worker(args.onednn_off_worker, args.cells, args.out)
    use_threads()
    args.out.mkdir(parents=True, exist_ok=True)
    original, optimized, unfused = (args.out / name for name in ("original", "optimized", "optimized_unfused"))
    shutil.rmtree(original, ignore_errors=True)
    encoder.build(MODEL).export(str(original), verbose=False)
    for path, fuse in ((optimized, True), (unfused, False)):
        optimize(original, path, args.batches, args.quick, args.out, horizontal_fusion=fuse)
    cells = [(b, t) for b in args.batches for t in cli.sequence_lengths(args.quick)]
    off = onednn_off_seconds(original, cells, args.out)

    models = [tf.saved_model.load(str(path)) for path in (original, optimized, unfused)]  # kept alive
    before, after, after_unfused = (model.signatures["serving_default"] for model in models)
    xla = tf.function(lambda ids: before(input_ids=ids)["output_0"], jit_compile=True)
    peers = {"tensorflow": lambda ids: before(input_ids=tf.constant(ids))["output_0"].numpy(),
             "dietcode": lambda ids: after(input_ids=tf.constant(ids))["output_0"].numpy(),
             "dietcode_unfused": lambda ids: after_unfused(input_ids=tf.constant(ids))["output_0"].numpy(),
             "xla": lambda ids: xla(tf.constant(ids)).numpy(),
             "onnxruntime": onnx_session(original, args.out / "original.onnx")}
    rows = []
    print(f"\n{'batch':>5s} {'T':>4s} " + " ".join(f"{p:>12s}" for p in [*peers, "onednn_off"]) + "  (ms)")
    for batch, t in cells:
        ids = token_ids(batch, t)
        expected = peers["tensorflow"](ids)
        for peer, tolerance in TOLERANCE.items():
            np.testing.assert_allclose(peers[peer](ids), expected, rtol=tolerance, atol=tolerance, err_msg=peer)
        seconds = encoder.median_seconds({p: (lambda call=call: call(ids)) for p, call in peers.items()},
                                         budget_seconds=SECONDS_PER_CELL)
        seconds["tensorflow_onednn_off"] = off[(batch, t)]
        rows += [{"workload": f"{MODEL.name}_batch{batch}", "T": t, "peer": peer, "ms": value * 1e3,
                  "speedup_vs_tensorflow": seconds["tensorflow"] / value} for peer, value in seconds.items()]
        print(f"{batch:5d} {t:4d} " + " ".join(f"{v * 1e3:12.2f}" for v in seconds.values()))
    for batch in args.batches:
        print(f"batch {batch}, geometric-mean speed-up over TF (worst T):")
        for peer in [*peers, "tensorflow_onednn_off"][1:]:
            speedups = [r["speedup_vs_tensorflow"] for r in rows
                        if r["peer"] == peer and r["workload"].endswith(f"batch{batch}")]
            print(f"  {peer:>22s} {np.exp(np.mean(np.log(speedups))):.2f}x ({min(speedups):.2f}x)")
    report.write_csv(rows, args.out / "bert_base.csv")
    report.speedup_by_t(rows, args.out / "bert_base.png", title="BERT-base encoder, one call per inference")
    print(f"wrote {args.out / 'bert_base.csv'} and {args.out / 'bert_base.png'}")


if __name__ == "__main__":
    main()
