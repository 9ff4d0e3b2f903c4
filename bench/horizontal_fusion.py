"""Horizontal fusion on BERT-base: Q/K/V as one GEMM against three, paired by round, with an A/A control.

    python -m bench.horizontal_fusion [--quick] [--separate DIR --merged DIR] [--out bench/results/horizontal_fusion]

Issue 9 asks that the pass make no T slower "by more than noise". A
bench.bert_base cell at batch 16 fits about three rounds of its five peers,
too few to tell a few percent from this VM's drift. Here only the two
optimized models run, many rounds per cell, each round calling the separate
model, the merged one and the separate one again (the A/A control), in a
fresh random order. Per cell, the median over rounds of the paired ratio
t(separate) / t(merged) (above 1: merging is faster) with a bootstrap 95%
interval; the A/A pair's interval shows what noise alone gives. A cell is
"slower" only when the merged model's whole interval lies below 1.

--separate and --merged take two optimized BERT-base SavedModels tuned from
one database (bench.bert_base writes such a pair); without them both are
built here the same way. Outputs are checked against each other at every cell.
Writes horizontal_fusion.csv and horizontal_fusion.png.
"""

import os
import pathlib
import random
import shutil

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import tf_dietcode  # noqa: E402

from bench import bert_base, cli, encoder, report  # noqa: E402
from bench.threads import use_threads  # noqa: E402

SECONDS_PER_CELL = 45.0
QUICK_SECONDS_PER_CELL = 8.0
BOOTSTRAP_SAMPLES = 2000
VARIANTS = {"separate": False, "merged": True}  # name -> horizontal_fusion


def median_ratio_interval(numerator: list[float], denominator: list[float],
                          rng: np.random.Generator) -> tuple[float, float, float]:
    """Median of the per-round ratios and its bootstrap 95% interval."""
    ratios = np.asarray(numerator) / np.asarray(denominator)
    resampled = np.median(rng.choice(ratios, (BOOTSTRAP_SAMPLES, ratios.size)), axis=1)
    low, high = np.percentile(resampled, [2.5, 97.5])
    return float(np.median(ratios)), float(low), float(high)


def verdict(low: float, high: float) -> str:
    return "slower" if high < 1 else "faster" if low > 1 else "within noise"


def build_models(out: pathlib.Path, batches: list[int], quick: bool) -> dict[str, pathlib.Path]:
    """BERT-base exported and optimized both ways from one tuning database, as bench.bert_base does."""
    original = out / "original"
    shutil.rmtree(original, ignore_errors=True)
    encoder.build(bert_base.MODEL).export(str(original), verbose=False)
    for name, fuse in VARIANTS.items():
        bert_base.optimize(original, out / name, batches, quick, out, horizontal_fusion=fuse)
    return {name: out / name for name in VARIANTS}


def agree(outputs: dict[str, np.ndarray]) -> None:
    tolerance = bert_base.TOLERANCE["dietcode_merged_qkv"]
    for name in ("merged", "separate_again"):
        np.testing.assert_allclose(outputs[name], outputs["separate"], rtol=tolerance, atol=tolerance, err_msg=name)


def plot(rows: list[dict], path: pathlib.Path) -> None:
    """Per batch: merged over separate and the A/A pair against T, with their 95% intervals."""
    workloads = sorted({r["workload"] for r in rows})
    figure, axes = plt.subplots(1, len(workloads), squeeze=False, figsize=(6 * len(workloads), 4),
                                layout="constrained")
    for axis, workload in zip(axes[0], workloads):
        for pair, offset in (("merged", -0.6), ("separate_again", 0.6)):
            points = sorted((r["T"], r["ratio"], r["low"], r["high"]) for r in rows
                            if r["workload"] == workload and r["pair"] == pair)
            ts, ratio, low, high = map(np.asarray, zip(*points))
            axis.errorbar(ts + offset, ratio, yerr=[ratio - low, high - ratio], marker="o", capsize=3,
                          label=f"separate / {pair}")
        axis.axhline(1.0, color="grey", linewidth=0.8)
        axis.set_title(workload, fontsize=9)
        axis.set_xlabel("T")
        axis.set_ylabel("paired ratio (above 1: faster than separate)")
        axis.legend(fontsize=7)
    figure.suptitle("Horizontal fusion (Q/K/V as one GEMM) on BERT-base, median and bootstrap 95% interval")
    figure.savefig(path, dpi=110)
    plt.close(figure)


def main(argv=None):
    parser = cli.parser(__doc__, "bench/results/horizontal_fusion", "quick tuning, a few T, short cells")
    for name in VARIANTS:
        parser.add_argument(f"--{name}", type=pathlib.Path, help=f"an optimized BERT-base SavedModel ({name} Q/K/V)")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 16])
    args = parser.parse_args(argv)
    use_threads()
    args.out.mkdir(parents=True, exist_ok=True)
    given = {name: getattr(args, name) for name in VARIANTS}
    if None in given.values() and any(given.values()):
        parser.error("--separate and --merged go together")
    paths = given if all(given.values()) else build_models(args.out, args.batches, args.quick)
    tf_dietcode.load_op_library()
    models = {name: tf.saved_model.load(str(path)) for name, path in paths.items()}
    signatures = {name: model.signatures["serving_default"] for name, model in models.items()}
    calls = {name: bert_base.output_call(signature) for name, signature in signatures.items()}
    calls["separate_again"] = calls["separate"]
    budget = QUICK_SECONDS_PER_CELL if args.quick else SECONDS_PER_CELL
    shuffle, rng = random.Random(0), np.random.default_rng(0)
    rows = []
    print(f"{'batch':>5s} {'T':>4s} {'rounds':>6s} {'separate/merged':>24s} {'A/A':>24s}")
    for batch in args.batches:
        for t in cli.sequence_lengths(args.quick):
            ids = bert_base.token_ids(batch, t)
            samples = encoder.interleaved_seconds({name: (lambda call=call: call(ids)) for name, call in calls.items()},
                                                  budget_seconds=budget, check=agree, shuffle=shuffle)
            cell = {}
            for pair in ("merged", "separate_again"):
                ratio, low, high = median_ratio_interval(samples["separate"], samples[pair], rng)
                cell[pair] = {"workload": f"{bert_base.MODEL.name}_batch{batch}", "T": t, "pair": pair,
                              "rounds": len(samples[pair]), "ms": 1e3 * float(np.median(samples[pair])),
                              "separate_ms": 1e3 * float(np.median(samples["separate"])),
                              "ratio": ratio, "low": low, "high": high, "verdict": verdict(low, high)}
            rows += cell.values()
            intervals = [f"{r['ratio']:.3f} [{r['low']:.3f}, {r['high']:.3f}]" for r in cell.values()]
            print(f"{batch:5d} {t:4d} {cell['merged']['rounds']:6d} {intervals[0]:>24s} {intervals[1]:>24s} "
                  f"{cell['merged']['verdict']}", flush=True)
    for batch in args.batches:
        merged = [r for r in rows if r["pair"] == "merged" and r["workload"].endswith(f"batch{batch}")]
        slower = [r["T"] for r in merged if r["verdict"] == "slower"]
        print(f"batch {batch}: merged over separate, geometric mean {report.geomean(r['ratio'] for r in merged):.3f}x; "
              f"slower beyond noise at T = {slower or 'none'}")
    report.write_csv(rows, args.out / "horizontal_fusion.csv")
    plot(rows, args.out / "horizontal_fusion.png")
    print(f"wrote {args.out / 'horizontal_fusion.csv'} and {args.out / 'horizontal_fusion.png'}")


if __name__ == "__main__":
    main()
