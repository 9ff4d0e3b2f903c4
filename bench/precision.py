"""Precision modes end to end: speed and accuracy of float32, bfloat16 and int8 against their peers.

    python -m bench.precision [--quick] [--batches 1 16] [--out bench/results/precision]
                              [--tuning-database-from DIR]

Two models, each a SavedModel with a dynamic sequence length built from Keras layers:
- bert_base: BERT-base (bench/encoder.py, random weights), input_ids -> the last hidden states;
- all_minilm_l6_v2: the sentence encoder with its pretrained weights (bench/minilm.py),
  input_ids and attention_mask -> normalized sentence embeddings.
Peers, all in one run, at batch 1 and 16 and T in bench.workloads.SEQUENCE_LENGTHS (--quick: fewer T
and the quick tuning budget):
- tensorflow: the original on stock TF, float32 (oneDNN on);
- tensorflow_bf16_amp: the original with Grappler's auto_mixed_precision_onednn_bfloat16, which is
  process-wide, so it runs in a child process (`--tf-amp-worker`) before the others: its ratio to
  the parent's TF timings crosses processes and carries the machine's run-to-run noise;
- onnxruntime: the original converted by tf2onnx, ONNX Runtime with its default session options;
- onnxruntime_int8: that model after onnxruntime.quantization.quantize_dynamic with its defaults;
- dietcode_<precision>: tf_dietcode.optimize(precision=...) with its defaults for batch 1..max(batches),
  T 1..128, on representative inputs (BERT-base: random token ids at the corners and the middle;
  MiniLM: the sentences), which its output check and accuracy gate run.
Timing as bench.timing.block_medians does it (blocks of back-to-back calls, rounds alternating
between the peers, medians); float32 peers' outputs are checked against TF's at every cell.

The limit beside the figures: at small T a call reads every dense weight once (BERT-base: 85M of
them, MiniLM: 11M), so weight bytes / DRAM read bandwidth (bench/dram_read.c, measured in this run)
bounds its time from below where the weights do not fit in the last-level cache. Per peer, the bytes
a weight takes as its call reads it: 4 in float32 (TF's bf16 AMP casts its float32 weights at each
call), 2 in bfloat16, 1 in int8 (a layer the accuracy gate keeps in float32 reads 4: the floor stays a
lower bound). Beside it, the cost of the call itself (call_ms): a model with the same inputs that
computes nothing, called from Python as the peers are, through TF (every TF peer) and through ONNX
Runtime (its tf2onnx conversion).

Accuracy, in the same run, against the float32 original on stock TF: MiniLM's embeddings of
tests/data/sentences.txt (cosine similarity per sentence: min and mean), BERT-base's output on random
token ids at batch 2 and the quick T (cosine per token), and the error as max_error bounds it (the
largest row error relative to the largest row norm, output_check.row_error).

Writes precision.csv (timings, with each peer's DRAM floor), precision_accuracy.csv,
precision_limits.csv and precision.png (per model and batch: latency and speed-up over TF float32
against T), and prints the tables with geometric means.
"""

import argparse
import dataclasses
import json
import os
import pathlib
import shutil
import subprocess
import sys
import time
from collections.abc import Callable

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import tf_dietcode  # noqa: E402
from bench import cli, encoder, hf_bert, minilm, onnx_peer, peak, report, timing  # noqa: E402
from bench.workloads import QUICK_SEQUENCE_LENGTHS  # noqa: E402
from tf_dietcode import output_check  # noqa: E402
from tf_dietcode.tuning import hardware  # noqa: E402
from tf_dietcode.tuning.database import Database  # noqa: E402

MAX_LENGTH = 128
SECONDS_PER_CELL = 20.0
QUICK_SECONDS_PER_CELL = 3.0
AMP_FLAG = "--tf-amp-worker"
AMP = "tensorflow_bf16_amp"
DIETCODE_PRECISIONS = ("float32", "bfloat16", "int8")
PRECISION_BYTES = {"float32": 4, "bfloat16": 2, "int8": 1}
# Bytes per dense weight as each peer's call reads it (the DRAM floor's numerator).
WEIGHT_BYTES = {"tensorflow": 4, AMP: 4, "onnxruntime": 4, "onnxruntime_int8": 1,
                **{f"dietcode_{p}": PRECISION_BYTES[p] for p in DIETCODE_PRECISIONS}}
FLOAT32_TOLERANCE = {"dietcode_float32": 1e-4, "onnxruntime": 1e-3}  # checked at every timed cell
ACCURACY_BATCH = 2  # BERT-base's accuracy inputs: this batch at the quick T
SENTENCE_BATCH = 16  # MiniLM's sentences are embedded in batches of this many

Inputs = dict[str, np.ndarray]
Call = Callable[[Inputs], np.ndarray]  # a peer's run of a model: the signature's inputs -> its output


@dataclasses.dataclass(frozen=True)
class BenchModel:
    name: str
    build: Callable[[], object]                          # -> keras.Model
    export: Callable[[object, pathlib.Path], None]       # (keras.Model, path)
    inputs: Callable[[int, int, int], Inputs]            # (batch, T, seed) -> the signature's inputs
    output: str                                          # the signature's output key
    examples: Callable[[list[int]], list[Inputs]]        # batches -> optimize()'s representative inputs
    sentences: bool = False                              # accuracy on the sentences (else on random inputs)


def _token_ids(vocabulary: int) -> Callable[[int, int, int], Inputs]:
    return lambda batch, t, seed: {"input_ids": np.random.default_rng([seed, batch, t]).integers(
        0, vocabulary, (batch, t)).astype(np.int32)}


def _words(batch: int, t: int, seed: int) -> Inputs:
    """Random word pieces (ids past the special tokens), every token kept."""
    ids = np.random.default_rng([seed, batch, t]).integers(1000, minilm.read_config().vocab_size, (batch, t))
    return {"input_ids": ids.astype(np.int32), "attention_mask": np.ones((batch, t), np.int32)}


def _corners(inputs: Callable[[int, int, int], Inputs]) -> Callable[[list[int]], list[Inputs]]:
    """Random inputs at the corners and the middle of batch x T 1..MAX_LENGTH."""
    def examples(batches: list[int]) -> list[Inputs]:
        lowest, highest = min(batches), max(batches)
        shapes = [(lowest, 1), ((lowest + highest) // 2, MAX_LENGTH // 2), (highest, MAX_LENGTH)]
        return [inputs(batch, t, 2) for batch, t in shapes]

    return examples


def _sentence_examples(batches: list[int]) -> list[Inputs]:
    """The sentences in batches of max(batches), the corners of batch x T 1..MAX_LENGTH among them."""
    return minilm.examples(minilm.read_sentences(), max(batches), MAX_LENGTH)


MODELS = [
    BenchModel("bert_base", lambda: encoder.build(encoder.BERT_BASE),
               lambda model, path: model.export(str(path), verbose=False),
               _token_ids(encoder.BERT_BASE.vocabulary), "output_0", _corners(_token_ids(encoder.BERT_BASE.vocabulary))),
    BenchModel("all_minilm_l6_v2", minilm.pretrained, hf_bert.export, _words, "embeddings", _sentence_examples,
               sentences=True),
]


def dense_weights(model) -> int:
    """The dense weights a call reads once: every kernel (Dense, EinsumDense)."""
    return sum(int(np.prod(w.shape)) for w in model.weights if w.path.endswith("kernel"))


def signature_call(signature, output: str) -> Call:
    return lambda inputs: signature(**{k: tf.constant(v) for k, v in inputs.items()})[output].numpy()


def session_call(session) -> Call:
    return lambda inputs: session.run(None, inputs)[0]


def accuracy_outputs(model: BenchModel, call: Call) -> list[np.ndarray]:
    """What the accuracy table compares: MiniLM's embeddings of the sentences, BERT-base's outputs on
    random token ids at ACCURACY_BATCH and the quick T."""
    if model.sentences:
        def encode(ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
            return call({"input_ids": ids, "attention_mask": mask})

        return [minilm.embed_with(encode, minilm.read_sentences(), SENTENCE_BATCH)]
    return [call(model.inputs(ACCURACY_BATCH, t, 1)) for t in QUICK_SEQUENCE_LENGTHS]


def accuracy_row(model: BenchModel, peer: str, outputs: list[np.ndarray], reference: list[np.ndarray]) -> dict:
    """Cosine similarity of each output vector (a sentence's embedding, a token's hidden state) to the
    reference's, and the error as max_error bounds it (output_check.row_error: the largest row error
    relative to the largest row norm)."""
    actual, expected = (np.concatenate([o.reshape(-1, o.shape[-1]) for o in v]).astype(np.float64)
                        for v in (outputs, reference))
    cosines = np.sum(actual * expected, 1) / (np.linalg.norm(actual, axis=1) * np.linalg.norm(expected, axis=1))
    return {"model": model.name, "peer": peer, "vectors": len(cosines), "min_cosine": float(cosines.min()),
            "mean_cosine": float(cosines.mean()),
            "row_error": max(output_check.row_error(r, o) for o, r in zip(outputs, reference))}


def seconds_per_cell(quick: bool) -> float:
    return QUICK_SECONDS_PER_CELL if quick else SECONDS_PER_CELL


def cells(batches: list[int], quick: bool) -> list[tuple[int, int]]:
    return [(b, t) for b in batches for t in cli.sequence_lengths(quick)]


def amp_worker(out: pathlib.Path, batches: list[int], quick: bool) -> None:
    """The bf16 AMP peer, in its own process (the Grappler option is process-wide): its timings per
    model and cell (JSON) and its accuracy outputs (npz)."""
    tf.config.optimizer.set_experimental_options({"auto_mixed_precision_onednn_bfloat16": True})
    timings, outputs = {}, {}
    for model in MODELS:
        loaded = tf.saved_model.load(str(out / model.name / "original"))  # kept: a signature does not keep its variables
        call = signature_call(loaded.signatures["serving_default"], model.output)
        timings[model.name] = []
        for batch, t in cells(batches, quick):
            inputs = model.inputs(batch, t, 0)
            seconds = timing.block_medians({AMP: lambda: call(inputs)}, budget_seconds=seconds_per_cell(quick) / 4)
            timings[model.name].append(seconds[AMP])
        outputs |= {f"{model.name}/{i}": o for i, o in enumerate(accuracy_outputs(model, call))}
    (out / "tf_bf16_amp.json").write_text(json.dumps(timings))
    np.savez(out / "tf_bf16_amp.npz", **outputs)


def amp_from_child(out: pathlib.Path, batches: list[int], quick: bool) -> tuple[dict, dict]:
    """Runs amp_worker in a child process: (timings by model, accuracy outputs by model)."""
    subprocess.run([sys.executable, "-m", "bench.precision", AMP_FLAG, "--out", str(out), "--batches",
                    *map(str, batches), *(["--quick"] if quick else [])], check=True)
    saved = np.load(out / "tf_bf16_amp.npz")
    outputs = {m.name: [saved[k] for k in sorted((k for k in saved if k.startswith(f"{m.name}/")),
                                                  key=lambda k: int(k.split("/")[1]))] for m in MODELS}
    return json.loads((out / "tf_bf16_amp.json").read_text()), outputs


def optimize(model: BenchModel, original: pathlib.Path, optimized: pathlib.Path, precision: str,
             batches: list[int], quick: bool, database: Database) -> dict:
    """optimize() at `precision` with its defaults, on the model's representative inputs (batches x T
    1..MAX_LENGTH; the output check and the accuracy gate run them); returns how many dense layers the
    gate put back and in which precision, as accuracy rows' columns."""
    started = time.perf_counter()
    examples = model.examples(batches)
    result = tf_dietcode.optimize(original, optimized, input_fn=lambda: iter(examples), precision=precision,
                                  tuning=cli.search_options(quick), database=database, overwrite=True)
    print(result.summary())
    print(f"optimize() of {model.name} at {precision} took {time.perf_counter() - started:.0f} s")
    gate = result.accuracy_gate
    return {"dense_layers_put_back": gate.put_back if gate else 0,
            "put_back_in": gate.put_back_in if gate and gate.put_back else ""}


def onnx_sessions(original: pathlib.Path, folder: pathlib.Path) -> dict[str, Call]:
    """The original converted by tf2onnx, and quantized by ONNX Runtime's quantize_dynamic (its defaults)."""
    from onnxruntime.quantization import quantize_dynamic

    float32, int8 = folder / "original.onnx", folder / "int8.onnx"
    onnx_peer.convert_saved_model(original, float32)
    quantize_dynamic(float32, int8)
    return {"onnxruntime": session_call(onnx_peer.session(float32)),
            "onnxruntime_int8": session_call(onnx_peer.session(int8))}


class _EmptyModel(tf.Module):
    """A model taking `inputs`' names and dtypes (any shape) whose output, named `output`, costs
    nothing to compute."""

    def __init__(self, inputs: Inputs, output: str):
        super().__init__()

        def serve(*arrays):
            return {output: tf.reshape(tf.cast(tf.reduce_sum(arrays[0]), tf.float32), [1, 1])}

        self.serve = tf.function(serve, input_signature=[tf.TensorSpec([None] * array.ndim, array.dtype, name=name)
                                                         for name, array in sorted(inputs.items())])


def call_ms(model: BenchModel, folder: pathlib.Path) -> dict[str, float]:
    """Milliseconds of calling a model from Python as the timing calls the peers, where the model
    computes nothing: a SavedModel with the model's inputs through TF (every TF peer's call) and
    its tf2onnx conversion through ONNX Runtime. At small T this is a floor of its own beside the
    DRAM floor."""
    inputs = model.inputs(1, 1, 0)
    empty = _EmptyModel(inputs, model.output)
    tf.saved_model.save(empty, str(folder / "empty"), signatures={"serving_default": empty.serve})
    onnx_peer.convert_saved_model(folder / "empty", folder / "empty.onnx")
    loaded = tf.saved_model.load(str(folder / "empty"))  # kept: the signature needs it
    calls = {"tensorflow": signature_call(loaded.signatures["serving_default"], model.output),
             "onnxruntime": session_call(onnx_peer.session(folder / "empty.onnx"))}
    seconds = timing.block_medians({runtime: (lambda call=call: call(inputs)) for runtime, call in calls.items()})
    return {runtime: value * 1e3 for runtime, value in seconds.items()}


def agree_with_tensorflow(outputs: dict[str, np.ndarray]) -> None:
    """The float32 peers' outputs against the original's on stock TF."""
    for peer, tolerance in FLOAT32_TOLERANCE.items():
        np.testing.assert_allclose(outputs[peer], outputs["tensorflow"], rtol=tolerance, atol=tolerance,
                                   err_msg=peer)


def print_tables(rows: list[dict], accuracy: list[dict], limits: list[dict], peers: list[str]) -> None:
    print("\ngeometric-mean speed-up over TF float32 (worst T):")
    for workload in dict.fromkeys(r["workload"] for r in rows):
        print(f"  {workload}")
        for peer in peers[1:]:
            speedups = [r["speedup_vs_tensorflow"] for r in rows if r["workload"] == workload and r["peer"] == peer]
            print(f"    {peer:>22s} {report.geomean(speedups):.2f}x ({min(speedups):.2f}x)")
    print("\nthe limit at the smallest T, batch 1: ms per call against weight bytes / DRAM bandwidth and the call")
    for limit in limits:
        measured = [r["ms"] for r in rows if r["workload"] == f"{limit['model']}_batch1" and r["peer"] == limit["peer"]
                    and r["T"] == min(row["T"] for row in rows)]
        floor = "(in the LLC)" if limit["fits_in_llc"] else f"{limit['dram_floor_ms']:.2f} ms"
        print(f"  {limit['model']:>18s} {limit['peer']:>22s} {limit['weight_mib']:7.1f} MiB "
              f"{(measured[0] if measured else float('nan')):9.2f} ms  floor {floor}, call {limit['call_ms']:.2f} ms")
    print("\naccuracy against TF float32:")
    for row in accuracy:
        kept = f", {row['dense_layers_put_back']} dense layers put back in {row['put_back_in']} by the accuracy " \
            "gate" if row["dense_layers_put_back"] else ""
        print(f"  {row['model']:>18s} {row['peer']:>22s} cosine min {row['min_cosine']:.6f} "
              f"mean {row['mean_cosine']:.6f}, row error {row['row_error']:.2e}{kept}")


def main(argv=None):
    parser = cli.parser(__doc__, "bench/results/precision", "quick tuning and a few T")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--tuning-database-from", type=pathlib.Path,
                        help="start from a copy of this folder's tuning.jsonl (the suite: bert_base's)")
    parser.add_argument(AMP_FLAG, action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.tf_amp_worker:
        return amp_worker(args.out, args.batches, args.quick)
    args.out.mkdir(parents=True, exist_ok=True)
    database = cli.tuning_database(args.out / "tuning.jsonl", args.tuning_database_from)
    weights = {}
    for model in MODELS:
        original = args.out / model.name / "original"
        shutil.rmtree(original, ignore_errors=True)
        keras_model = model.build()
        weights[model.name] = dense_weights(keras_model)
        model.export(keras_model, original)
    amp_timings, amp_outputs = amp_from_child(args.out, args.batches, args.quick)
    put_back = {(model.name, f"dietcode_{precision}"): optimize(
        model, args.out / model.name / "original", args.out / model.name / f"dietcode_{precision}", precision,
        args.batches, args.quick, database) for model in MODELS for precision in DIETCODE_PRECISIONS}
    sessions = {model.name: onnx_sessions(args.out / model.name / "original", args.out / model.name)
                for model in MODELS}
    machine = hardware.detect()
    gbps, llc = peak.dram_read_gbps(machine.cores), machine.l3_bytes
    print(f"DRAM read bandwidth: {gbps:.1f} GB/s; last-level cache {llc / 2**20:.0f} MiB")

    peers = ["tensorflow", AMP, "onnxruntime", "onnxruntime_int8", *(f"dietcode_{p}" for p in DIETCODE_PRECISIONS)]
    calls_ms = {model.name: call_ms(model, args.out / model.name) for model in MODELS}
    limits = [{"model": model.name, "peer": peer, "weight_mib": weights[model.name] * WEIGHT_BYTES[peer] / 2**20,
               "fits_in_llc": weights[model.name] * WEIGHT_BYTES[peer] <= llc, "dram_gbps": gbps,
               "dram_floor_ms": weights[model.name] * WEIGHT_BYTES[peer] / (gbps * 1e9) * 1e3,
               "call_ms": calls_ms[model.name]["onnxruntime" if peer.startswith("onnxruntime") else "tensorflow"]}
              for model in MODELS for peer in peers]
    floors = {(limit["model"], limit["peer"]): limit["dram_floor_ms"] for limit in limits}
    rows, accuracy = [], []
    for model in MODELS:
        folders = {"tensorflow": "original", **{f"dietcode_{p}": f"dietcode_{p}" for p in DIETCODE_PRECISIONS}}
        loaded = {peer: tf.saved_model.load(str(args.out / model.name / folder))  # kept: signatures need them
                  for peer, folder in folders.items()}
        calls = {peer: signature_call(m.signatures["serving_default"], model.output) for peer, m in loaded.items()}
        calls |= sessions[model.name]
        print(f"\n{model.name}\n{'batch':>5s} {'T':>4s} " + " ".join(f"{p:>16s}" for p in peers) + "  (ms)")
        for (batch, t), amp_seconds in zip(cells(args.batches, args.quick), amp_timings[model.name]):
            inputs = model.inputs(batch, t, 0)
            seconds = timing.block_medians({p: (lambda call=call: call(inputs)) for p, call in calls.items()},
                                           budget_seconds=seconds_per_cell(args.quick), check=agree_with_tensorflow)
            seconds[AMP] = amp_seconds
            rows += [{"workload": f"{model.name}_batch{batch}", "T": t, "peer": peer, "ms": seconds[peer] * 1e3,
                      "speedup_vs_tensorflow": seconds["tensorflow"] / seconds[peer],
                      "dram_floor_ms": floors[(model.name, peer)]} for peer in peers]
            print(f"{batch:5d} {t:4d} " + " ".join(f"{seconds[p] * 1e3:16.2f}" for p in peers))
        reference = accuracy_outputs(model, calls["tensorflow"])
        outputs = {peer: accuracy_outputs(model, call) for peer, call in calls.items() if peer != "tensorflow"}
        accuracy += [accuracy_row(model, peer, found, reference) |
                     put_back.get((model.name, peer), {"dense_layers_put_back": 0, "put_back_in": ""})
                     for peer, found in [*outputs.items(), (AMP, amp_outputs[model.name])]]
        del loaded, calls
    print_tables(rows, accuracy, limits, peers)
    report.write_csv(rows, args.out / "precision.csv")
    report.write_csv(accuracy, args.out / "precision_accuracy.csv")
    report.write_csv(limits, args.out / "precision_limits.csv")
    report.plot_by_t(rows, args.out / "precision.png", title="Precision modes: BERT-base and all-MiniLM-L6-v2, "
                     "one call per inference (speed-up over TF float32)")
    print(f"wrote {args.out}/precision.csv, precision_accuracy.csv, precision_limits.csv and precision.png")


if __name__ == "__main__":
    main()
