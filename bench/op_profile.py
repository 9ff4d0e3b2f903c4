"""Where an inference's time goes, op by op: stock TF, the optimized model and ONNX Runtime.

    python -m bench.op_profile [--quick] [--family keras] [--batch 1] [--T 1 17] [--optimized DIR]
                               [--out bench/results/op_profile]

A BERT-base family of bench.bert_base (keras or exported), built and
optimized as bench.bert_base does (or read from --optimized), fed as it feeds
it, profiled at each T:
- TF (original and optimized): the SavedModel run in a TF1 session with full
  tracing (RunOptions.FULL_TRACE), whose step stats time every node of the
  inlined graph;
- ONNX Runtime: the same model converted by tf2onnx, its session's own profiler
  (`enable_profiling`, otherwise default options), which times every node.
Profiling adds a little time per op, alike for all three: read shares and
per-op times, not end-to-end latency (bench.bert_base times that).

Dense layers are the products that read a fixed weight (DENSE_OPS): the summary
splits each profile into their time and the other ops'. Their bandwidth is
bench.dense_stream's to measure, untraced: the profiler's cost per op made
the dense layers read 0.6 of the DRAM bandwidth at T = 1 where, timed alone,
they read 0.9.

Writes op_profile.csv (runtime, T, op type, ms per inference, share) and
op_profile.png; prints the summary and each profile's largest op types.
"""

import collections
import json
import os
import pathlib
import shutil

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import tf_dietcode  # noqa: E402
from bench import bert_base, cli, onnx_peer, report  # noqa: E402

CALLS = 20           # profiled inferences per cell (after WARMUP)
QUICK_CALLS = 5
WARMUP = 3
# Op types that multiply by a fixed weight in each runtime (TF's oneDNN rewrites included).
DENSE_OPS = frozenset({"DietcodeFusedMatMul", "DietcodeFusedMatMulInt8", "DietcodeFusedMatMulBf16",
                       "MatMul", "_MklMatMul", "_MklFusedMatMul", "_FusedMatMul", "Einsum", "_MklEinsum",
                       "Gemm", "FusedMatMul", "MatMulInteger", "DynamicQuantizeMatMul", "MatMulIntegerToFloat"})



class TracedSavedModel:
    """A SavedModel's serving signature in a TF1 session, run with full tracing."""

    def __init__(self, path: pathlib.Path):
        self.graph = tf.Graph()
        self.session = tf.compat.v1.Session(graph=self.graph)
        with self.graph.as_default():
            meta = tf.compat.v1.saved_model.load(self.session, ["serve"], str(path))
        signature = meta.signature_def["serving_default"]
        self.inputs = {name: tensor.name for name, tensor in signature.inputs.items()}
        self.outputs = [tensor.name for tensor in signature.outputs.values()]

    def profile(self, feed: dict[str, np.ndarray], calls: int) -> tuple[dict[str, float], dict[str, str]]:
        """Microseconds per inference by node (of the graph TF runs: inlined and rewritten), and each
        node's op type."""
        options = tf.compat.v1.RunOptions(trace_level=tf.compat.v1.RunOptions.FULL_TRACE,
                                          output_partition_graphs=True)
        feed = {self.inputs[name]: value for name, value in feed.items()}
        for _ in range(WARMUP):
            self.session.run(self.outputs, feed)
        micros: dict[str, float] = collections.defaultdict(float)
        for _ in range(calls):
            metadata = tf.compat.v1.RunMetadata()
            self.session.run(self.outputs, feed, options=options, run_metadata=metadata)
            for device in metadata.step_stats.dev_stats:
                for node in device.node_stats:
                    micros[node.node_name] += (node.op_end_rel_micros - node.op_start_rel_micros) / calls
        op_types = {node.name: node.op for graph in metadata.partition_graphs for node in graph.node}
        return dict(micros), {n: op_types.get(n, n) for n in micros}


def onnx_profile(model_path: pathlib.Path, feed: dict[str, np.ndarray], calls: int,
                 scratch: pathlib.Path) -> tuple[dict[str, float], dict[str, str]]:
    """ONNX Runtime's own profile of `calls` inferences after WARMUP: microseconds per inference
    by node, and op types."""
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.enable_profiling = True
    options.profile_file_prefix = str(scratch / "ort_profile")
    session = onnxruntime.InferenceSession(str(model_path), options, providers=["CPUExecutionProvider"])
    for _ in range(WARMUP + calls):
        session.run(None, feed)
    events = json.loads(pathlib.Path(session.end_profiling()).read_text())
    runs = sorted(e["ts"] for e in events if e.get("cat") == "Session" and e.get("name") == "model_run")
    measured_from = runs[WARMUP]
    micros: dict[str, float] = collections.defaultdict(float)
    op_types: dict[str, str] = {}
    for event in events:
        if event.get("cat") == "Node" and event["name"].endswith("_kernel_time") and event["ts"] >= measured_from:
            node = event["name"].removesuffix("_kernel_time")
            micros[node] += event["dur"] / calls
            op_types[node] = event["args"]["op_name"]
    return dict(micros), op_types


def profile_rows(runtime: str, t: int, micros: dict[str, float], op_types: dict[str, str]) -> list[dict]:
    """ms per inference and share by op type, largest first."""
    by_type: dict[str, float] = collections.defaultdict(float)
    for node, value in micros.items():
        by_type[op_types[node]] += value
    total = sum(by_type.values())
    return [{"runtime": runtime, "T": t, "op": op, "ms": value / 1e3, "share": value / total}
            for op, value in sorted(by_type.items(), key=lambda item: -item[1])]


def summary(rows: list[dict]) -> list[tuple[str, int, float, float]]:
    """(runtime, T, profiled ms, dense layers' ms) per profile."""
    cells = dict.fromkeys((r["runtime"], r["T"]) for r in rows)
    return [(runtime, t, sum(r["ms"] for r in rows if (r["runtime"], r["T"]) == (runtime, t)),
             sum(r["ms"] for r in rows if (r["runtime"], r["T"]) == (runtime, t) and r["op"] in DENSE_OPS))
            for runtime, t in cells]


def plot(rows: list[dict], path: pathlib.Path, title: str, top: int = 8) -> None:
    """Stacked bars of ms per inference by op type, one bar per (runtime, T)."""
    import matplotlib.pyplot as plt

    bars = sorted({(r["T"], r["runtime"]) for r in rows})
    totals = collections.Counter()
    for r in rows:
        totals[r["op"]] += r["ms"]
    shown = [op for op, _ in totals.most_common(top)]
    figure, axis = plt.subplots(figsize=(max(6, len(bars) * 0.9), 4.5))
    bottoms = np.zeros(len(bars))
    for op in [*shown, "other"]:
        heights = np.array([sum(r["ms"] for r in rows if (r["T"], r["runtime"]) == bar and
                                (r["op"] == op or (op == "other" and r["op"] not in shown))) for bar in bars])
        axis.bar(range(len(bars)), heights, bottom=bottoms, label=op)
        bottoms += heights
    axis.set_xticks(range(len(bars)), [f"{runtime}\nT={t}" for t, runtime in bars], fontsize=7)
    axis.set_ylabel("ms per inference (profiled)")
    axis.legend(fontsize=7)
    report.save(figure, path, title)


def main(argv=None):
    parser = cli.parser(__doc__, "bench/results/op_profile", "quick tuning and fewer profiled calls")
    parser.add_argument("--family", choices=list(bert_base.FAMILIES), default="keras")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--T", type=int, nargs="+", default=[1, 17])
    parser.add_argument("--optimized", type=pathlib.Path, help="an optimized SavedModel of the family to profile "
                        "(its original beside it as ../original); default: optimize one here")
    args = parser.parse_args(argv)
    family = bert_base.FAMILIES[args.family]
    args.out.mkdir(parents=True, exist_ok=True)
    original, optimized = args.out / "original", args.optimized or args.out / "optimized"
    if args.optimized:
        original = args.optimized.parent / "original"
    else:
        shutil.rmtree(original, ignore_errors=True)
        family.export(original)
        bert_base.optimize(original, optimized, family, [args.batch], args.quick, args.out)
    onnx_model = args.out / "original.onnx"
    onnx_peer.convert_saved_model(original, onnx_model)
    calls = QUICK_CALLS if args.quick else CALLS
    tf_dietcode.load_op_library()  # the optimized graph's ops (optimize() loads them, --optimized does not)
    traced = {"tensorflow": TracedSavedModel(original), "dietcode": TracedSavedModel(optimized)}
    profile = []
    for t in args.T:
        feed = family.feed(args.batch, t)
        runs = {runtime: (lambda model=model: model.profile(feed, calls)) for runtime, model in traced.items()}
        runs["onnxruntime"] = lambda: onnx_profile(onnx_model, feed, calls, args.out)
        for runtime, run in runs.items():
            profile += profile_rows(runtime, t, *run())
    report.write_csv(profile, args.out / "op_profile.csv")
    plot(profile, args.out / "op_profile.png", f"{family.name}, batch {args.batch}: time by op type")
    print(f"{'runtime':>12s} {'T':>4s} {'profiled ms':>11s} {'dense ms':>9s} {'other ms':>9s}")
    for runtime, t, total, dense in summary(profile):
        print(f"{runtime:>12s} {t:4d} {total:11.2f} {dense:9.2f} {total - dense:9.2f}")
    for t in args.T:
        for runtime in [*traced, "onnxruntime"]:
            rows = [r for r in profile if r["T"] == t and r["runtime"] == runtime]
            print(f"\n{runtime}, T = {t}: {sum(r['ms'] for r in rows):.2f} ms profiled")
            for r in rows[:10]:
                print(f"  {r['op']:>36s} {r['ms']:8.3f} ms {r['share']:6.1%}")
    print(f"wrote {args.out / 'op_profile.csv'} and {args.out / 'op_profile.png'}")


if __name__ == "__main__":
    main()
