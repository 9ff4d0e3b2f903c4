"""docs/BENCHMARKS.md from the CSVs bench.suite wrote: machine, versions,
method, tables, and where tf_dietcode loses. Every number in it is read from
those CSVs (or, for the machine, from the system) here; none is typed in."""

import datetime
import importlib.metadata
import os
import pathlib
import platform
from collections import defaultdict

from bench.report import geomean, read, speedups
from tf_dietcode import cpu_features
from tf_dietcode.tuning import hardware

PACKAGES = ("tensorflow", "apache-tvm", "apache-tvm-ffi", "onnxruntime", "tf2onnx", "xgboost", "scikit-learn",
            "numpy")
KERNEL_PEERS = ("xla", "onnxruntime", "tensorflow_onednn_off", "dietcode_generic")
BERT_PEERS = ("dietcode", "dietcode_merged_qkv", "xla", "onnxruntime", "tensorflow_onednn_off")
BERT_FAMILIES = ("bert_base.csv", "bert_base_exported.csv")  # bench.bert_base's CSVs, those the run wrote
PRECISION_PEERS = ("tensorflow_bf16_amp", "onnxruntime", "onnxruntime_int8", "dietcode_float32", "dietcode_bfloat16",
                   "dietcode_int8")
# The multiply-add loop of bench.peak that bounds each precision peer at large T.
PEER_PEAK = {"tensorflow": "fma_loop", "onnxruntime": "fma_loop", "dietcode_float32": "fma_loop",
             "tensorflow_bf16_amp": "bf16_dot_loop", "dietcode_bfloat16": "bf16_dot_loop",
             "onnxruntime_int8": "int8_dot_loop", "dietcode_int8": "int8_dot_loop"}
# (ours, the peer it must stay ahead of at every T) in the precision run: "where tf_dietcode loses"
PRECISION_RIVALS = (("dietcode_float32", "onnxruntime"), ("dietcode_int8", "onnxruntime_int8"))

METHOD = """\
- Threads: kernels through TF run with 2 intra-op threads (this machine's cores) and one inter-op
  thread, TVM's time_evaluator with TVM_NUM_THREADS=2. Whole models (BERT-base) and ONNX Runtime
  run with their default options, as their users run them.
- Kernels through TF (TF, XLA, the op's generic kernel) are timed in-graph: the op runs k times
  inside one `tf.while_loop` and the time per call is (t(k) - t(0)) / k, the median of 5 repeats,
  k chosen so one repeat lasts about 50 ms. That leaves out Python's ~0.2 ms per call.
- XLA: the TF ops as an XLA cluster called once per loop iteration (steady state, compiled in a
  warm-up call); `xla_first_call` is a fresh jit function's first call at each shape (tracing,
  compilation and one run), what the first request of each new length pays.
- ONNX Runtime: the TF ops converted by tf2onnx (opset 17, dynamic dims), default session options,
  inputs bound once, the median over repeats of many calls, minus the cost of a bound call to an
  Identity model.
- TF with oneDNN off (`TF_ENABLE_ONEDNN_OPTS=0`, read at start-up) runs in a child process, so its
  ratio to TF crosses processes and carries the machine's run-to-run drift.
- Tuned kernels (`tuned_kernels`, `tuning_cost`) are timed by TVM's time_evaluator (21 interleaved
  rounds of at least 30 ms, median), TF in-graph as above in the same process, the FMA loop once in each
  round (`tuned_kernels.csv`'s `fraction_of_fma_loop_in_rounds`: speed over the loop's, paired by round). DietCode tunes each workload
  once for T in [1, 128]; the largest-shape (Nimble-like) baseline tunes T=128 only and uses its
  best kernel everywhere; MetaSchedule (Ansor-like) tunes each shape on its own.
- BERT-base end to end: one signature call per inference from Python (as a server would), each
  peer timed in blocks of back-to-back calls (the block's first call untimed), several rounds of
  blocks alternating between the peers in balanced orders, median over rounds; no peer's settings
  are changed for another's sake. Outputs checked against TF at every cell.
- Dense kernels' peers get the weight stored [K, N], as Keras' Dense stores it; the workload names
  keep the paper's `x[N,K]^T` notation. With the weight [N, K] and transpose_b, TF's MatMul ran
  1.15-11x slower (AMD EPYC Zen 1; 11x at M = 1), which would flatter every kernel compared with it.
- Speed-ups are ratios to TF measured in the same run; geometric means are over the T listed."""


def cell(points) -> str:
    """geomean (worst at T=..)."""
    if not points:
        return "n/a"
    worst_t, worst = min(points, key=lambda p: p[1])
    return f"{geomean(v for _, v in points):.2f}x ({worst:.2f}x at T={worst_t})"


def machine() -> str:
    cpu = cpu_features.cpuinfo_fields().get("model name") or platform.processor() or "unknown"
    flags = cpu_features.cpu_flags()
    simd = [f for f in ("sse4_2", "avx", "avx2", "fma", "avx512f", "avx512_bf16", "amx_tile") if f in flags]
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    versions = ", ".join(f"{p} {_version(p)}" for p in PACKAGES)
    limits = hardware.detect()  # a model name like "AMD EPYC" does not say which generation
    return (f"- CPU: {cpu} (LLVM's name: {limits.mcpu}); L2 {limits.l2_bytes >> 10} KiB per core, "
            f"L3 {limits.l3_bytes >> 20} MiB; SIMD flags: {', '.join(simd) or 'none'}; "
            f"{len(os.sched_getaffinity(0))} cores usable; {memory:.0f} GiB memory; {platform.platform()}\n"
            f"- Python {platform.python_version()}; {versions}")


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def table(header: list[str], lines: list[list[str]]) -> str:
    rows = [header, ["---"] * len(header), *lines]
    return "\n".join("| " + " | ".join(r) + " |" for r in rows)


def render(results: pathlib.Path, docs: pathlib.Path, quick: bool) -> str:
    """The markdown for the CSVs in `results` (links relative to `docs`)."""
    def link(name):
        return f"[`{name}`]({(results / name).relative_to(docs)})"

    runs = read(results / "suite_runs.csv")
    peaks = read(results / "peak.csv")
    kernels = read(results / "kernel_peers.csv")
    tuned = read(results / "tuned_kernels.csv")
    cost = read(results / "tuning_cost.csv")
    bert_files = [name for name in BERT_FAMILIES if (results / name).exists()]
    bert = [row for name in bert_files for row in read(results / name)]
    mode = "quick" if quick else "full"
    parts = [f"# Benchmarks\n\nWritten by `python -m bench.suite{' --quick' if quick else ''}` "
             f"({mode} run) on {datetime.date.today()} from {commits(runs)}. Every figure below is read from the CSVs in "
             f"[`results/suite/`]({results.relative_to(docs)}) that this run wrote; the command that wrote each is in {link('suite_runs.csv')}."
             + (" A quick run tunes 12 micro-kernels per workload (the default budget: 64) at 4 sample "
                "lengths per range and times T in {1, 17, 62, 128}: its tuned figures are below what the "
                "default budget gives. It tunes DietCode's four kernel workloads only (BERT's other dense "
                "shapes are tuned in the full run) and runs BERT-base without the merged-Q/K/V variant."
                if quick else "")
             + ("" if (results / "precision.csv").exists() else
                " This run has no precision part (it was stopped before that part finished): the precision "
                "figures are not on this page."),
             "## Machine\n\n" + machine(),
             "## Method\n\n" + METHOD,
             "## Peak\n\n" + table(["measure", "threads", "value"],
                                   [[r["measure"], f"{r['threads']:.0f}", f"{r['value']:.0f} {r['unit']}"]
                                    for r in peaks])]

    tuned_speedups = speedups(tuned, "dietcode")
    peer_speedups = {peer: speedups(kernels, peer) for peer in KERNEL_PEERS}
    lines = [[f"`{w}`", cell(tuned_speedups.get(w)), *(cell(peer_speedups[p].get(w)) for p in KERNEL_PEERS)]
             for w in dict.fromkeys(r["workload"] for r in kernels)]
    first_calls = speedups(kernels, "xla_first_call")
    compile_ms = {w: max(r["ms"] for r in kernels if r["workload"] == w and r["peer"] == "xla_first_call")
                  for w in first_calls}
    parts.append(
        "## Kernels\n\nGeometric-mean speed-up over TF (worst T in brackets). `dietcode` is the tuned "
        f"micro-kernel from {link('tuned_kernels.csv')} (timed against TF in that run); the other columns come "
        f"from {link('kernel_peers.csv')}, all peers in one run. Plots: {link('kernel_peers.png')}, "
        f"{link('tuned_kernels.png')}.\n\n"
        + table(["workload", "dietcode (tuned)", *KERNEL_PEERS], lines)
        + "\n\nXLA's first call at a new shape (tracing + compilation + run), the slowest T per workload: "
        + "; ".join(f"`{w}` {ms:.0f} ms" for w, ms in compile_ms.items()) + ".")

    largest = speedups(tuned, "largest_shape")
    ratio = defaultdict(list)
    for row in tuned:
        if row["peer"] == "dietcode":
            ratio[row["workload"]].append(row["symbolic_over_static"])
    tuning_seconds = {(r["workload"], r["peer"]): r["tuning_seconds"] for r in tuned}
    parts.append(
        f"## Tuned micro-kernels and their baselines\n\nFrom {link('tuned_kernels.csv')}: DietCode (one "
        "symbolic kernel set for T in [1, 128]) against the largest-shape baseline, speed-ups over TF, "
        "and DietCode's symbolic kernel over the same micro-kernel compiled for each static shape.\n\n"
        + table(["workload", "DietCode", "largest shape", "symbolic / static, worst", "tuning s (DietCode / largest)"],
                [[f"`{w}`", cell(points), cell(largest.get(w)), f"{max(ratio[w]):.3f}",
                  f"{tuning_seconds[w, 'dietcode']:.0f} / {tuning_seconds[w, 'largest_shape']:.0f}"]
                 for w, points in tuned_speedups.items()]))

    methods = defaultdict(dict)
    for row in cost:
        methods[row["method"]][row["T"]] = row
    per_shape = methods["metaschedule_per_shape"]
    per_shape_seconds = sum(r["tuning_seconds"] for r in per_shape.values())
    dietcode_seconds = next(iter(methods["dietcode"].values()))["tuning_seconds"]
    largest_seconds = next(iter(methods["largest_shape"].values()))["tuning_seconds"]
    parts.append(
        f"## Tuning cost\n\nFrom {link('tuning_cost.csv')} (`{cost[0]['workload']}`, plot "
        f"{link('tuning_cost.png')}): DietCode tunes once for "
        f"all of T in [1, 128] in {dietcode_seconds:.0f} s; per-shape MetaSchedule took {per_shape_seconds:.0f} s "
        f"for {len(per_shape)} shape(s), {per_shape_seconds / len(per_shape) * 128 / 3600:.1f} h projected to "
        f"all 128 lengths; the largest-shape baseline {largest_seconds:.0f} s.\n\n"
        + table(["T", "DietCode ms", "MetaSchedule ms", "largest shape ms"],
                [[str(t), f"{methods['dietcode'][t]['ms']:.3f}", f"{per_shape[t]['ms']:.3f}",
                  f"{methods['largest_shape'][t]['ms']:.3f}"] for t in sorted(per_shape)]))

    bert_speedups = {peer: speedups(bert, peer) for peer in BERT_PEERS}
    parts.append(
        "## BERT-base end to end\n\nFrom " + ", ".join(
            f"{link(name)} (plot {link(name.replace('.csv', '.png'))})" for name in bert_files)
        + ": 12 layers, hidden 768, 12 heads, FFN 3072; `bert_base` from Keras 3 layers "
        "(MultiHeadAttention), `bert_base_exported` shaped like an exported Hugging Face BERT (segment "
        "embeddings, the padding mask as an attention bias, a tanh pooler); optimized by "
        "`tf_dietcode.optimize()` with its defaults (`dietcode`: Q/K/V as three GEMMs) and with horizontal "
        "fusion (`dietcode_merged_qkv`; full run only). Speed-up over TF:\n\n"
        + speedup_table(bert, BERT_PEERS, "encoder, batch"))

    precision = read(results / "precision.csv") if (results / "precision.csv").exists() else []
    if precision:
        parts.append(precision_section(precision, read(results / "precision_accuracy.csv"),
                                       read(results / "precision_limits.csv"), peaks, link))
    parts.append("## Where tf_dietcode loses\n\n"
                 + "\n".join(losses(tuned_speedups, peer_speedups, bert_speedups)
                             + behind_at_each_t(bert, [("dietcode", "onnxruntime")])
                             + behind_at_each_t(precision, PRECISION_RIVALS) or ["- nowhere in this run"])
                 + "\n\n## Suite run\n\n" + table(["part", "command", "wall s", "commit"],
                                                  [[r["part"], f"`{r['command']}`", f"{r['seconds']:.0f}",
                                                    r.get("commit", "unknown")] for r in runs]))
    return "\n\n".join(parts) + "\n"


def speedup_table(rows: list[dict], peers, header: str) -> str:
    """One row per workload (in the rows' order), one column per peer: cell() of its speed-ups over TF."""
    by_peer = {peer: speedups(rows, peer) for peer in peers}
    return table([header, *peers], [[f"`{w}`", *(cell(by_peer[p].get(w)) for p in peers)]
                                     for w in dict.fromkeys(r["workload"] for r in rows)])


def commits(runs: list[dict]) -> str:
    """The commit the suite's parts ran from, or each part's where a rerun part (--parts) ran from another."""
    parts = defaultdict(list)
    for run in runs:
        parts[run.get("commit", "unknown")].append(run["part"])
    if len(parts) == 1:
        return f"commit {next(iter(parts))}"
    return "commits " + "; ".join(f"{commit} ({', '.join(names)})" for commit, names in parts.items())


def compute_floor_table(rows: list[dict], limits: list[dict], peaks: list[dict]) -> str:
    """At the largest batch and T: each peer's dense multiply-adds over the peak of the loop of its
    precision's instruction (bench.peak), against its time."""
    peak = {r["measure"]: r for r in peaks}
    params = {r["model"]: r["weight_mib"] * 2**20 / 4 for r in limits if r["peer"] == "tensorflow"}  # float32
    batch = max(int(r["workload"].rpartition("_batch")[2]) for r in rows)
    largest = max(r["T"] for r in rows)
    lines = []
    for r in rows:
        model, _, at_batch = r["workload"].rpartition("_batch")
        if r["T"] != largest or int(at_batch) != batch:
            continue
        gflop = 2 * params[model] * batch * largest / 1e9
        loop = peak.get(PEER_PEAK[r["peer"]])
        floor = (f"{gflop / loop['value'] * 1e3:.1f} ({loop['measure']}, {loop['value']:.0f} {loop['unit']})"
                 if loop else "no such loop in peak.csv")
        lines.append([f"`{r['workload']}`", r["peer"], f"{gflop:.3g}", f"{r['ms']:.1f}", floor])
    return table(["model, batch", "peer", "dense GFLOP", "ms", "compute floor ms"], lines)


def put_back(accuracy_row: dict) -> str:
    """The accuracy gate's put-back as the table states it: "6 in bfloat16", or "0"."""
    count = int(float(accuracy_row["dense_layers_put_back"]))
    return f"{count} in {accuracy_row['put_back_in']}" if count else "0"


def precision_section(rows: list[dict], accuracy: list[dict], limits: list[dict], peaks: list[dict], link) -> str:
    """Speed-ups over TF float32 per precision and peer, accuracy against TF float32, the DRAM floor at
    batch 1's smallest T and the compute floor at the largest batch and T."""
    smallest = min(r["T"] for r in rows)
    measured = {(r["workload"], r["peer"]): r["ms"] for r in rows if r["T"] == smallest}
    dram = limits[0]["dram_gbps"]
    return (
        f"## Precision modes\n\nFrom {link('precision.csv')} (plot {link('precision.png')}), "
        f"{link('precision_accuracy.csv')} and {link('precision_limits.csv')}: BERT-base (Keras layers, random "
        "weights) and all-MiniLM-L6-v2 (pretrained weights), each optimized by `optimize(precision=...)` with "
        "its defaults, against TF float32, TF's bfloat16 auto mixed precision (`tensorflow_bf16_amp`, in a "
        "child process), ONNX Runtime float32 and ONNX Runtime int8 (`quantize_dynamic`, its defaults). "
        "Speed-up over TF float32:\n\n"
        + speedup_table(rows, PRECISION_PEERS, "model, batch")
        + "\n\nAccuracy against TF float32 (MiniLM: every sentence's embedding; BERT-base: every token's "
        "output on random token ids): the lowest cosine similarity, the row error as `max_error` bounds it, "
        "and the dense layers the accuracy gate put back in a wider precision.\n\n"
        + table(["model", "peer", "min cosine", "row error", "put back"],
                [[f"`{r['model']}`", r["peer"], f"{r['min_cosine']:.5f}", f"{r['row_error']:.2g}", put_back(r)]
                 for r in accuracy])
        + f"\n\nThe limit at batch 1, T = {smallest}: a call reads every dense weight once, so its weight bytes "
        f"over the DRAM read bandwidth measured in this run ({dram:.1f} GB/s) bound its time from below, "
        "unless they fit in the last-level cache; so does the call itself, from Python, timed on a model "
        "with the same inputs that computes nothing (TF's signature call for every TF peer, ONNX Runtime's "
        "session run for its peers).\n\n"
        + table(["model", "peer", "weights MiB", "ms", "DRAM floor ms", "call ms"],
                [[f"`{r['model']}`", r["peer"], f"{r['weight_mib']:.0f}",
                  f"{measured.get((r['model'] + '_batch1', r['peer']), float('nan')):.2f}",
                  "in the LLC" if str(r["fits_in_llc"]) == "True" else f"{r['dram_floor_ms']:.2f}",
                  f"{r['call_ms']:.2f}"]
                 for r in limits])
        + f"\n\nThe limit at the largest batch and T = {max(r['T'] for r in rows)}: the dense layers' multiply-adds "
        "(two operations each) over the peak of a loop of the instruction each precision multiplies with "
        "(`bench.peak`, in the suite's peak part: FMA for float32, the bfloat16 and int8 dot products for the "
        "others), as if every dense layer ran in that precision; attention, layer norms and softmax come on "
        "top.\n\n" + compute_floor_table(rows, limits, peaks))


def behind_at_each_t(rows: list[dict], pairs) -> list[str]:
    """Per (ours, rival) pair: the workloads and T where the rival's call was faster than ours."""
    ms = {(r["workload"], r["T"], r["peer"]): r["ms"] for r in rows}
    lines = []
    for ours, rival in pairs:
        for workload in dict.fromkeys(r["workload"] for r in rows):
            slower = [f"T={t} ({ms[w, t, rival]:.2f} against {ms[w, t, ours]:.2f} ms)"
                      for (w, t, peer) in ms if w == workload and peer == ours and (w, t, rival) in ms
                      and ms[w, t, rival] < ms[w, t, ours]]
            if slower:
                lines.append(f"- `{workload}`: {ours} behind {rival} at " + ", ".join(slower))
    return lines


def losses(tuned, peers, bert) -> list[str]:
    """Plain statements of every workload where tf_dietcode is slower than TF or than the best peer."""
    lines = []
    for workload, points in {**tuned, **bert["dietcode"]}.items():
        slower = [f"T={t} ({s:.3f}x)" for t, s in points if s < 1.0]
        if slower:
            lines.append(f"- `{workload}`: slower than TF at " + ", ".join(slower))
        ours = geomean(s for _, s in points)
        rivals = {p: source[p][workload] for source in (peers, bert) for p in source
                  if not p.startswith("dietcode") and workload in source[p]}
        better = {p: geomean(s for _, s in v) for p, v in rivals.items() if geomean(s for _, s in v) > ours}
        if better:
            lines.append(f"- `{workload}`: {ours:.2f}x over TF, behind " +
                         ", ".join(f"{p} ({s:.2f}x)" for p, s in sorted(better.items(), key=lambda i: -i[1])))
    for workload in peers["dietcode_generic"]:
        if workload not in tuned:
            lines.append(f"- `{workload}`: no tuned kernel is benchmarked for it; the generic kernel's figures "
                         "are in the kernels table")
    return lines
