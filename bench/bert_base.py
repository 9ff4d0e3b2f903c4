"""BERT-base end to end: the optimized SavedModel against its peers, one call per inference.

    python -m bench.bert_base [--quick] [--families keras exported] [--batches 1 16] [--out bench/results/bert_base]

Two families of BERT-base encoders (12 layers, hidden 768, 12 heads, FFN 3072):
- keras (bert_base): Keras 3 layers as users write them (bench/encoder.py:
  MultiHeadAttention, tanh GELU), input_ids -> the last hidden states; random
  token ids;
- exported (bert_base_exported): shaped like a Hugging Face TFBertModel
  exported as a SavedModel (bench/exported_bert.py: segment and position
  embeddings, embedding LayerNorm, the padding mask as an attention bias,
  attention written out in TF ops, exact GELU, a tanh pooler), random
  weights; input_ids, token_type_ids and attention_mask -> sequence and
  pooled outputs; fed sentence pairs, every row but the first padded at
  batch > 1 (every peer gets the same feed).
Each is exported, optimized with tf_dietcode.optimize() for
batch 1..max(batches) and T in [1, 128], and timed at every (batch, T):
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
noise. Outputs are checked against the original at every cell. The families
run one after another, from one tuning database (out/tuning.jsonl); each
writes <name>.csv and <name>.png (models in out/<name>/) and prints its table
with geometric means.
"""

import argparse
import dataclasses
import json
import os
import pathlib
import shutil
import time
from collections.abc import Callable

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import tf_dietcode  # noqa: E402
from bench import cli, encoder, exported_bert, hf_bert, onednn_off, onnx_peer, report, timing  # noqa: E402
from tf_dietcode.optimizer import Report  # noqa: E402
from tf_dietcode.tuning.database import Database  # noqa: E402
from tf_dietcode.tuning.search import SearchOptions  # noqa: E402

MAX_LENGTH = 128  # T 1..MAX_LENGTH
SECONDS_PER_CELL = 20.0
QUICK_SECONDS_PER_CELL = 3.0
TOLERANCE = {"dietcode": 1e-4, "dietcode_merged_qkv": 1e-4, "xla": 1e-3, "onnxruntime": 1e-3}

Feed = dict[str, np.ndarray]
Outputs = tuple[np.ndarray, ...]  # a peer's outputs, in the family's order


@dataclasses.dataclass(frozen=True)
class Family:
    """An encoder the benchmark runs: its SavedModel and the inputs it is fed."""
    key: str                                    # its name on the command line
    name: str                                   # its CSV's, plot's and workloads' name
    title: str                                  # its plot's title
    export: Callable[[pathlib.Path], None]      # writes the original SavedModel
    feed: Callable[[int, int], Feed]            # the inputs at (batch, T), the same for every peer
    outputs: tuple[str, ...]                    # the serving signature's outputs the peers return


def token_ids(batch: int, t: int) -> np.ndarray:
    rng = np.random.default_rng(batch * 1000 + t)
    return rng.integers(0, encoder.BERT_BASE.vocabulary, (batch, t)).astype(np.int32)


FAMILIES = {family.key: family for family in [
    Family("keras", "bert_base", "BERT-base encoder (Keras layers), one call per inference",
           lambda path: encoder.build(encoder.BERT_BASE).export(str(path), verbose=False),
           lambda batch, t: {"input_ids": token_ids(batch, t)}, ("output_0",)),
    Family("exported", "bert_base_exported",
           "BERT-base shaped like an exported Hugging Face BERT, one call per inference",
           lambda path: hf_bert.export(exported_bert.with_random_weights(exported_bert.BERT_BASE), path),
           lambda batch, t: exported_bert.inputs(exported_bert.BERT_BASE, batch, t), exported_bert.OUTPUTS)]}


def output_call(signature, family: Family) -> Callable[[Feed], Outputs]:
    """A feed (numpy) -> the family's outputs (numpy), through a SavedModel signature."""
    def call(feed: Feed) -> Outputs:
        result = signature(**{name: tf.constant(value) for name, value in feed.items()})
        return tuple(result[name].numpy() for name in family.outputs)
    return call


def agree_with_tensorflow(outputs: dict[str, Outputs]) -> None:
    """Every peer's outputs against the original's on stock TF."""
    for peer, tolerance in TOLERANCE.items():
        for index, (actual, expected) in enumerate(zip(outputs.get(peer, ()), outputs["tensorflow"])):
            np.testing.assert_allclose(actual, expected, rtol=tolerance, atol=tolerance,
                                       err_msg=f"{peer} output {index}")


def onnx_session(saved_model: pathlib.Path, path: pathlib.Path, family: Family) -> Callable[[Feed], Outputs]:
    """The original converted by tf2onnx, in an ONNX Runtime session."""
    onnx_peer.convert_saved_model(saved_model, path)
    session = onnx_peer.session(path)
    names = [output.name for output in session.get_outputs()]
    if not set(family.outputs) <= set(names):
        raise RuntimeError(f"{path}: outputs {names}, the signature's are {list(family.outputs)}")
    return lambda feed: tuple(session.run(list(family.outputs), feed))


def seconds_per_cell(quick: bool) -> float:
    return QUICK_SECONDS_PER_CELL if quick else SECONDS_PER_CELL


def onednn_off_worker(saved_model: pathlib.Path, family: Family, cells: list[tuple[int, int]], quick: bool,
                      out: pathlib.Path) -> None:
    model = tf.saved_model.load(str(saved_model))  # kept: a signature does not keep its variables alive
    signature = model.signatures["serving_default"]
    timings = []
    for batch, t in cells:
        feed = {name: tf.constant(value) for name, value in family.feed(batch, t).items()}
        seconds = timing.block_medians({"off": lambda: signature(**feed)}, budget_seconds=seconds_per_cell(quick) / 4)
        timings.append(seconds["off"])
    onednn_off.result_path(out).write_text(json.dumps(timings))


def optimize(original: pathlib.Path, optimized: pathlib.Path, family: Family, batches: list[int],
             tuning: SearchOptions, database: Database, **passes: bool) -> Report:
    """optimize() for batches x T 1..MAX_LENGTH (every input) at this budget, from this tuning database;
    `passes`: its switches (horizontal_fusion, layer_norm_fusion). Returns its report."""
    started = time.perf_counter()
    ranges = {name: [(min(batches), max(batches)), (1, MAX_LENGTH)] for name in family.feed(1, 1)}
    result = tf_dietcode.optimize(original, optimized, shape_ranges=ranges, tuning=tuning, database=database,
                                  overwrite=True, **passes)
    print(result.summary())
    print(f"optimize() took {time.perf_counter() - started:.0f} s")
    return result


def run_family(family: Family, args) -> None:
    """Exports, optimizes and times one family; writes <name>.csv and <name>.png in args.out."""
    models_dir = args.out / family.name
    original = models_dir / "original"
    # (peer, SavedModel, horizontal fusion): the merged Q/K/V variant only in the full run
    variants = [("dietcode", models_dir / "optimized", False),
                *([] if args.quick else [("dietcode_merged_qkv", models_dir / "optimized_merged_qkv", True)])]
    shutil.rmtree(original, ignore_errors=True)
    models_dir.mkdir(parents=True, exist_ok=True)
    family.export(original)
    for _, path, fuse in variants:
        optimize(original, path, family, args.batches, cli.search_options(args.quick),
                 Database(args.out / "tuning.jsonl"), horizontal_fusion=fuse)
    cells = [(b, t) for b in args.batches for t in cli.sequence_lengths(args.quick)]
    off = dict(zip(cells, onednn_off.timings_from_child(
        "bench.bert_base", ["--families", family.key, "--cells", json.dumps(cells),
                            *(["--quick"] if args.quick else [])], args.out)))

    models = {peer: tf.saved_model.load(str(path))  # kept alive: a signature does not keep its variables
              for peer, path in [("tensorflow", original), *((p, path) for p, path, _ in variants)]}
    signatures = {peer: model.signatures["serving_default"] for peer, model in models.items()}
    xla = tf.function(lambda feed: signatures["tensorflow"](**feed), jit_compile=True)
    peers = {peer: output_call(signature, family) for peer, signature in signatures.items()}
    peers |= {"xla": output_call(lambda **feed: xla(feed), family),
              "onnxruntime": onnx_session(original, models_dir / "original.onnx", family)}
    rows = []
    print(f"\n{family.name}\n{'batch':>5s} {'T':>4s} "
          + " ".join(f"{p:>12s}" for p in [*peers, "onednn_off"]) + "  (ms)")
    for batch, t in cells:
        feed = family.feed(batch, t)
        seconds = timing.block_medians({p: (lambda call=call: call(feed)) for p, call in peers.items()},
                                       budget_seconds=seconds_per_cell(args.quick), check=agree_with_tensorflow)
        seconds["tensorflow_onednn_off"] = off[(batch, t)]
        rows += [{"workload": f"{family.name}_batch{batch}", "T": t, "peer": peer, "ms": value * 1e3,
                  "speedup_vs_tensorflow": seconds["tensorflow"] / value} for peer, value in seconds.items()]
        print(f"{batch:5d} {t:4d} " + " ".join(f"{v * 1e3:12.2f}" for v in seconds.values()))
    for batch in args.batches:
        print(f"{family.name} batch {batch}, geometric-mean speed-up over TF (worst T):")
        for peer in [*peers, "tensorflow_onednn_off"][1:]:
            speedups = [r["speedup_vs_tensorflow"] for r in rows
                        if r["peer"] == peer and r["workload"].endswith(f"batch{batch}")]
            print(f"  {peer:>22s} {report.geomean(speedups):.2f}x ({min(speedups):.2f}x)")
    report.write_csv(rows, args.out / f"{family.name}.csv")
    report.plot_by_t(rows, args.out / f"{family.name}.png", title=family.title)
    print(f"wrote {args.out / f'{family.name}.csv'} and {args.out / f'{family.name}.png'}")


def main(argv=None):
    parser = cli.parser(__doc__, "bench/results/bert_base", "quick tuning and a few T")
    parser.add_argument("--families", nargs="+", choices=list(FAMILIES), default=list(FAMILIES),
                        help="the encoders to run (default: all)")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 16])
    parser.add_argument(onednn_off.FLAG, action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--cells", type=json.loads, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    families = [FAMILIES[key] for key in args.families]
    if args.onednn_off_worker:
        family, = families
        return onednn_off_worker(args.out / family.name / "original", family, args.cells, args.quick, args.out)
    args.out.mkdir(parents=True, exist_ok=True)
    for family in families:
        run_family(family, args)


if __name__ == "__main__":
    main()
