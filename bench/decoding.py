"""Decoding throughput of Transformer-base translators whose decoder runs in a tf.while_loop.

    python -m bench.decoding [--quick] [--batches 1 8] [--decoders greedy beam] [--max-len 64]
                             [--source-lengths 1 8 17 33 64] [--seconds-per-cell 20]
                             [--model transformer_base] [--out bench/results/decoding]

The decoders of bench/decoders.py at Transformer-base size (d_model 512, 8
heads, FFN 2048, 6 + 6 layers, vocabulary 8000): the tutorial-style greedy
translator (the decoder re-run on the prefix each step) and the KV-cache
beam search (beam 4); `--model small` runs the tests' small configuration, to
check the benchmark end to end in minutes. Their END logit is lowered so the
untrained models decode exactly --max-len tokens per sentence (a trained model stops where its
translation ends): throughput is output tokens (batch x max-len; the best
beam's, for beam search) per second of one signature call. Each decoder is
optimized with tf_dietcode.optimize() for batch 1..max(batches) and source
length 1..64 and max_len 1..max-len (a range of values for the scalar): its
loop's products are sized from the loop's bound where the graph proves their
dims (the prefix, the cache), the rest from running the model at the corners
(the END bias makes it decode max_len tokens there too, so no input_fn is
needed). Peers at every (batch, source length):
- tensorflow: the original SavedModel's signature (stock TF, oneDNN on);
- dietcode: the optimized SavedModel;
- xla: the original signature inside tf.function(jit_compile=True);
- onnxruntime: the original converted by tf2onnx, run by ONNX Runtime.
A peer that cannot run a decoder (XLA refusing the loop's dynamic shapes,
tf2onnx failing to convert it) is reported with its reason in the table and
in unavailable.json, not left out silently. Timing: blocks of back-to-back
calls in alternating rounds, medians (bench.timing.block_seconds). The
optimized model's ids must equal the original's at every cell (its scores or
logits within 1e-3); other peers' disagreement is counted and printed.
Writes decoding.csv, decoding.png and unavailable.json.
"""

import dataclasses
import json
import os
import pathlib
import shutil
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import tf_dietcode  # noqa: E402
from bench import cli, decoders, onnx_peer, report, timing  # noqa: E402
from tf_dietcode.tuning.database import Database  # noqa: E402

MODELS = {"transformer_base": decoders.TRANSFORMER_BASE, "small": decoders.SMALL}
NEVER_ENDS = -1e4  # END's logit bias: the untrained models decode max_len tokens
SOURCE_LENGTHS = (1, 8, 17, 33, 64)
QUICK_SOURCE_LENGTHS = (1, 17, 64)
MAX_SOURCE = 64
SECONDS_PER_CELL = 20.0
QUICK_SECONDS_PER_CELL = 3.0
BUILDERS = {"greedy": decoders.GreedyTranslator, "beam": decoders.BeamSearchTranslator}


def feeds(config: decoders.DecoderConfig, batch: int, length: int, max_len: int) -> dict[str, np.ndarray]:
    return {"tokens": decoders.source_tokens(config, batch, length, seed=batch * 1000 + length),
            "max_len": np.int32(max_len)}


def signature_call(signature):
    """feeds -> outputs as numpy, through a SavedModel signature."""
    return lambda inputs: {k: v.numpy() for k, v in signature(**{n: tf.constant(v) for n, v in inputs.items()}).items()}


def xla_call(signature):
    compiled = tf.function(lambda tokens, max_len: signature(tokens=tokens, max_len=max_len), jit_compile=True)
    return lambda inputs: {k: v.numpy() for k, v in compiled(tf.constant(inputs["tokens"]),
                                                             tf.constant(inputs["max_len"])).items()}


def onnx_call(original: pathlib.Path, path: pathlib.Path):
    onnx_peer.convert_saved_model(original, path)
    session = onnx_peer.session(path)
    names = [output.name for output in session.get_outputs()]
    return lambda inputs: dict(zip(names, session.run(None, {k: np.asarray(v) for k, v in inputs.items()})))


def optimize(config: decoders.DecoderConfig, original: pathlib.Path, optimized: pathlib.Path, batches: list[int],
             max_len: int, quick: bool, out: pathlib.Path) -> None:
    """optimize() for batches x source 1..MAX_SOURCE x max_len 1..max_len: the loop sized from its bound."""
    started = time.perf_counter()
    ranges = {"tokens": [(min(batches), max(batches)), (1, MAX_SOURCE)], "max_len": (1, max_len)}
    result = tf_dietcode.optimize(original, optimized, shape_ranges=ranges, tuning=cli.search_options(quick),
                                  database=Database(out / "tuning.jsonl"), overwrite=True)
    print(result.summary())
    print(f"optimize() took {time.perf_counter() - started:.0f} s")


class Disagreement(Exception):
    pass


def checker(disagreements: dict[str, str]):
    """The warm-up outputs' check: the optimized model's ids equal the original's (scores/logits
    within 1e-3), or the benchmark stops; the other peers' differences are noted."""
    def check(outputs: dict[str, dict[str, np.ndarray]]) -> None:
        expected = outputs["tensorflow"]
        for peer, result in outputs.items():
            if set(result) != set(expected):
                disagreements[peer] = f"outputs named {sorted(result)}, not {sorted(expected)}"
                continue
            differ = float(np.mean(result["ids"] != expected["ids"])) if result["ids"].shape == expected["ids"].shape \
                else 1.0
            floats = [k for k in expected if k != "ids"]
            close = all(np.allclose(result[k], expected[k], rtol=1e-3, atol=1e-3) for k in floats) if not differ \
                else False
            if peer == "dietcode" and (differ or not close):
                raise Disagreement(f"the optimized model's outputs differ from the original's ({differ:.1%} of ids)")
            if differ or not close:
                disagreements[peer] = f"{differ:.1%} of ids differ" if differ else "scores differ beyond 1e-3"
    return check


def usable_peers(calls: dict, probe: dict[str, np.ndarray], unavailable: dict[str, str]) -> dict:
    """The peers whose first call on `probe` runs; the others' reasons go in `unavailable`."""
    usable = {}
    for peer, make in calls.items():
        try:
            call = make()
            call(probe)
            usable[peer] = call
        except Exception as error:  # noqa: BLE001 - a peer's failure is its result, with the reason
            unavailable[peer] = f"{type(error).__name__}: {' '.join(str(error).split())[:1000]}"
    return usable


def main(argv=None):
    parser = cli.parser(__doc__, "bench/results/decoding", "quick tuning, 3 source lengths, 16 output tokens")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--decoders", nargs="+", choices=list(BUILDERS), default=list(BUILDERS))
    parser.add_argument("--max-len", type=int, default=None, help="output tokens per sentence (64; quick: 16)")
    parser.add_argument("--source-lengths", type=int, nargs="+", default=None,
                        help=f"source lengths timed ({' '.join(map(str, SOURCE_LENGTHS))}; quick: "
                             f"{' '.join(map(str, QUICK_SOURCE_LENGTHS))})")
    parser.add_argument("--seconds-per-cell", type=float, default=None,
                        help=f"timing budget per peer and cell ({SECONDS_PER_CELL:g}; quick: {QUICK_SECONDS_PER_CELL:g})")
    parser.add_argument("--model", choices=list(MODELS), default="transformer_base")
    args = parser.parse_args(argv)
    config = dataclasses.replace(MODELS[args.model], end_bias=NEVER_ENDS)
    max_len = args.max_len or (16 if args.quick else 64)
    lengths = args.source_lengths or (QUICK_SOURCE_LENGTHS if args.quick else SOURCE_LENGTHS)
    budget = args.seconds_per_cell or (QUICK_SECONDS_PER_CELL if args.quick else SECONDS_PER_CELL)
    args.out.mkdir(parents=True, exist_ok=True)
    rows, unavailable = [], {}
    for name in args.decoders:
        original, optimized = args.out / name / "original", args.out / name / "optimized"
        shutil.rmtree(original, ignore_errors=True)
        decoders.export(BUILDERS[name](config), original)
        optimize(config, original, optimized, args.batches, max_len, args.quick, args.out)
        models = {peer: tf.saved_model.load(str(path)) for peer, path in
                  (("tensorflow", original), ("dietcode", optimized))}  # kept: signatures need their variables
        signatures = {peer: model.signatures["serving_default"] for peer, model in models.items()}
        makers = {"tensorflow": lambda: signature_call(signatures["tensorflow"]),
                  "dietcode": lambda: signature_call(signatures["dietcode"]),
                  "xla": lambda: xla_call(signatures["tensorflow"]),
                  "onnxruntime": lambda: onnx_call(original, args.out / name / "original.onnx")}
        missing = {}
        peers = usable_peers(makers, feeds(config, 1, 3, 2), missing)
        unavailable |= {f"{name}/{peer}": reason for peer, reason in missing.items()}
        disagreements: dict[str, str] = {}
        print(f"\n{name}: {' '.join(f'{p:>12s}' for p in peers)}  (output tokens per second)")
        for batch in args.batches:
            for length in lengths:
                inputs = feeds(config, batch, length, max_len)
                seconds = timing.block_medians({p: (lambda call=call: call(inputs)) for p, call in peers.items()},
                                               budget_seconds=budget * len(peers), check=checker(disagreements))
                tokens = batch * max_len
                rows += [{"workload": f"{name}_batch{batch}", "T": length, "peer": peer, "ms": value * 1e3,
                          "tokens_per_second": tokens / value,
                          "speedup_vs_tensorflow": seconds["tensorflow"] / value} for peer, value in seconds.items()]
                print(f"batch {batch:2d} source {length:3d} " + " ".join(f"{tokens / v:12.1f}"
                                                                       for v in seconds.values()))
        for peer, reason in missing.items():
            print(f"  {peer}: does not run this decoder ({reason[:300]}; unavailable.json has all of it)")
        for peer, what in disagreements.items():
            print(f"  {peer}: {what} (at one cell at least)")
    report.write_csv(rows, args.out / "decoding.csv")
    (args.out / "unavailable.json").write_text(json.dumps(unavailable, indent=1))
    report.plot_by_t(rows, args.out / "decoding.png",
                     title=f"{config.name} decoding, {max_len} output tokens (x axis: source length)")
    print_summary(rows, args.decoders, args.batches)
    print(f"wrote decoding.csv, decoding.png and unavailable.json in {args.out}")


def print_summary(rows: list[dict], names: list[str], batches: list[int]) -> None:
    print("\ngeometric-mean speed-up over TF across source lengths (worst), tokens per second:")
    for name in names:
        for batch in batches:
            cell = [r for r in rows if r["workload"] == f"{name}_batch{batch}"]
            for peer in dict.fromkeys(r["peer"] for r in cell):
                mine = [r for r in cell if r["peer"] == peer]
                print(f"  {name:>6s} batch {batch:2d} {peer:>12s} "
                      f"{report.geomean(r['speedup_vs_tensorflow'] for r in mine):5.2f}x "
                      f"({min(r['speedup_vs_tensorflow'] for r in mine):.2f}x), "
                      f"{report.geomean(r['tokens_per_second'] for r in mine):9.1f} tokens/s")


if __name__ == "__main__":
    main()
