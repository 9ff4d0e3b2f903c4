"""BERT-base end to end: the optimized SavedModel against its peers, one call per inference.

    python -m bench.bert_base [--quick] [--batches 1 16] [--out bench/results/bert_base]

Builds a BERT-base encoder (12 layers, hidden 768, 12 heads, FFN 3072) with
Keras 3 layers, exports it, optimizes it with tf_dietcode.optimize() for
batch 1..max(batches) and T in [1, 128], and times at every (batch, T):
- tensorflow: the original SavedModel's signature on stock TF (oneDNN on);
- dietcode: the SavedModel optimize() writes with its defaults (horizontal
  fusion off: Q, K and V as three GEMMs);
- dietcode_merged_qkv (full run only): optimized with horizontal fusion (Q, K
  and V as one GEMM), from the same database;
- xla: the original signature inside tf.function(jit_compile=True), steady
  state (each new shape's compilation happens in the warm-up call);
- onnxruntime: the original converted with tf2onnx, run by ONNX Runtime with
  its default session options;
- tensorflow_onednn_off: the original with TF_ENABLE_ONEDNN_OPTS=0, which TF
  reads once at start-up, so it runs in a child process before the others.
Every peer with its default options, timed in blocks of back-to-back calls,
rounds of blocks alternating between the peers, medians (bench.timing.block_seconds);
the oneDNN-off ratio crosses processes, so it carries the machine's run-to-run
noise. Outputs are checked against the original at every cell.
Writes bert_base.csv and bert_base.png and prints the table with geometric means.
"""

import argparse
import json
import os
import pathlib
import shutil
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import tf_dietcode  # noqa: E402
from bench import cli, encoder, onednn_off, onnx_peer, report, timing  # noqa: E402
from tf_dietcode.tuning.database import Database  # noqa: E402

MODEL = encoder.BERT_BASE
SECONDS_PER_CELL = 20.0
QUICK_SECONDS_PER_CELL = 3.0
TOLERANCE = {"dietcode": 1e-4, "dietcode_merged_qkv": 1e-4, "xla": 1e-3, "onnxruntime": 1e-3}


def token_ids(batch: int, t: int) -> np.ndarray:
    return np.random.default_rng(batch * 1000 + t).integers(0, MODEL.vocabulary, (batch, t)).astype(np.int32)


def output_call(signature):
    """token ids (numpy) -> the encoder's output (numpy), through a SavedModel signature."""
    return lambda ids: signature(input_ids=tf.constant(ids))["output_0"].numpy()


def agree_with_tensorflow(outputs: dict[str, np.ndarray]) -> None:
    """Every peer's output against the original's on stock TF."""
    for peer, tolerance in TOLERANCE.items():
        if peer in outputs:
            np.testing.assert_allclose(outputs[peer], outputs["tensorflow"], rtol=tolerance, atol=tolerance,
                                       err_msg=peer)


def onnx_session(saved_model: pathlib.Path, path: pathlib.Path):
    """The original converted by tf2onnx, in an ONNX Runtime session."""
    onnx_peer.convert_saved_model(saved_model, path)
    session = onnx_peer.session(path)
    return lambda ids: session.run(None, {"input_ids": ids})[0]


def seconds_per_cell(quick: bool) -> float:
    return QUICK_SECONDS_PER_CELL if quick else SECONDS_PER_CELL


def onednn_off_worker(saved_model: pathlib.Path, cells: list[tuple[int, int]], quick: bool,
                      out: pathlib.Path) -> None:
    model = tf.saved_model.load(str(saved_model))  # kept: a signature does not keep its variables alive
    signature = model.signatures["serving_default"]
    timings = []
    for batch, t in cells:
        ids = tf.constant(token_ids(batch, t))
        seconds = timing.block_medians({"off": lambda: signature(input_ids=ids)},
                                             budget_seconds=seconds_per_cell(quick) / 4)
        timings.append(seconds["off"])
    onednn_off.result_path(out).write_text(json.dumps(timings))


def optimize(original: pathlib.Path, optimized: pathlib.Path, batches: list[int], quick: bool,
             out: pathlib.Path, **passes: bool) -> None:
    """optimize() for batches x T 1..max_length from out's tuning database; `passes`: its switches
    (horizontal_fusion, layer_norm_fusion)."""
    started = time.perf_counter()
    result = tf_dietcode.optimize(original, optimized,
                                  shape_ranges={"input_ids": [(min(batches), max(batches)), (1, MODEL.max_length)]},
                                  tuning=cli.search_options(quick), database=Database(out / "tuning.jsonl"),
                                  overwrite=True, **passes)
    print(result.summary())
    print(f"optimize() took {time.perf_counter() - started:.0f} s")


def main(argv=None):
    parser = cli.parser(__doc__, "bench/results/bert_base", "quick tuning and a few T")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 16])
    parser.add_argument(onednn_off.FLAG, action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--cells", type=json.loads, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    original = args.out / "original"
    # (peer, SavedModel, horizontal fusion): the merged Q/K/V variant only in the full run
    variants = [("dietcode", args.out / "optimized", False),
                *([] if args.quick else [("dietcode_merged_qkv", args.out / "optimized_merged_qkv", True)])]
    if args.onednn_off_worker:
        return onednn_off_worker(original, args.cells, args.quick, args.out)
    args.out.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(original, ignore_errors=True)
    encoder.build(MODEL).export(str(original), verbose=False)
    for _, path, fuse in variants:
        optimize(original, path, args.batches, args.quick, args.out, horizontal_fusion=fuse)
    cells = [(b, t) for b in args.batches for t in cli.sequence_lengths(args.quick)]
    off = dict(zip(cells, onednn_off.timings_from_child(
        "bench.bert_base", ["--cells", json.dumps(cells), *(["--quick"] if args.quick else [])], args.out)))

    models = {peer: tf.saved_model.load(str(path))  # kept alive: a signature does not keep its variables
              for peer, path in [("tensorflow", original), *((p, path) for p, path, _ in variants)]}
    signatures = {peer: model.signatures["serving_default"] for peer, model in models.items()}
    xla = tf.function(lambda ids: signatures["tensorflow"](input_ids=ids)["output_0"], jit_compile=True)
    peers = {peer: output_call(signature) for peer, signature in signatures.items()}
    peers |= {"xla": lambda ids: xla(tf.constant(ids)).numpy(),
              "onnxruntime": onnx_session(original, args.out / "original.onnx")}
    rows = []
    print(f"\n{'batch':>5s} {'T':>4s} " + " ".join(f"{p:>12s}" for p in [*peers, "onednn_off"]) + "  (ms)")
    for batch, t in cells:
        ids = token_ids(batch, t)
        seconds = timing.block_medians({p: (lambda call=call: call(ids)) for p, call in peers.items()},
                                             budget_seconds=seconds_per_cell(args.quick),
                                             check=agree_with_tensorflow)
        seconds["tensorflow_onednn_off"] = off[(batch, t)]
        rows += [{"workload": f"{MODEL.name}_batch{batch}", "T": t, "peer": peer, "ms": value * 1e3,
                  "speedup_vs_tensorflow": seconds["tensorflow"] / value} for peer, value in seconds.items()]
        print(f"{batch:5d} {t:4d} " + " ".join(f"{v * 1e3:12.2f}" for v in seconds.values()))
    for batch in args.batches:
        print(f"batch {batch}, geometric-mean speed-up over TF (worst T):")
        for peer in [*peers, "tensorflow_onednn_off"][1:]:
            speedups = [r["speedup_vs_tensorflow"] for r in rows
                        if r["peer"] == peer and r["workload"].endswith(f"batch{batch}")]
            print(f"  {peer:>22s} {report.geomean(speedups):.2f}x ({min(speedups):.2f}x)")
    report.write_csv(rows, args.out / "bert_base.csv")
    report.plot_by_t(rows, args.out / "bert_base.png", title="BERT-base encoder, one call per inference")
    print(f"wrote {args.out / 'bert_base.csv'} and {args.out / 'bert_base.png'}")


if __name__ == "__main__":
    main()
