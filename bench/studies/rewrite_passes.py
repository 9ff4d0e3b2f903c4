"""One optimize() pass on BERT-base, the model with it against the model without, paired by round
with an A/A control.

    python -m bench.studies.rewrite_passes PASS [--quick] [--family keras] [--without DIR --with DIR]
                                                [--out bench/results/PASS]

PASS is an optimize() switch: horizontal_fusion (Q/K/V as one GEMM, off by
default) or layer_norm_fusion (each layer norm as one DietcodeLayerNorm, on by
default). The question is whether a pass makes any T slower by more than noise.
A bench.bert_base cell at batch 16 fits about three rounds of its peers, too few
to tell a few percent from the machine's drift. Here only the two optimized
models run, many rounds per cell, each round timing a block of the model
without the pass, one of the model with it and one of the model without again
(the A/A control; bench.timing.block_seconds). Per cell, the median over rounds
of the paired ratio t(without) / t(with) (above 1: the pass makes it faster)
with a bootstrap 95% interval; the A/A pair's interval shows what noise alone
gives.
A cell is "slower" only when the whole interval of the model with the pass
lies below 1.

--without and --with take two optimized BERT-base SavedModels tuned from one
database (bench.bert_base writes such a pair for horizontal_fusion); without
them both are built here the same way, of a bench.bert_base family (--family). Outputs are checked against each other
at every cell. Writes PASS.csv and PASS.png.
"""

import os
import pathlib
import shutil

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import tf_dietcode  # noqa: E402

from bench import bert_base, cli, report, timing  # noqa: E402

SECONDS_PER_CELL = 45.0
QUICK_SECONDS_PER_CELL = 8.0
PASSES = ("horizontal_fusion", "layer_norm_fusion")  # optimize() switches
VARIANTS = {"without": False, "with": True}  # name -> the pass's switch


def verdict(low: float, high: float) -> str:
    return "slower" if high < 1 else "faster" if low > 1 else "within noise"


def build_models(rewrite_pass: str, family: bert_base.Family, out: pathlib.Path, batches: list[int],
                 quick: bool) -> dict[str, pathlib.Path]:
    """The family exported and optimized with and without the pass from one tuning database, as
    bench.bert_base does."""
    original = out / "original"
    shutil.rmtree(original, ignore_errors=True)
    family.export(original)
    for name, on in VARIANTS.items():
        bert_base.optimize(original, out / name, family, batches, quick, out, **{rewrite_pass: on})
    return {name: out / name for name in VARIANTS}


def agree(outputs: dict[str, bert_base.Outputs]) -> None:
    tolerance = bert_base.TOLERANCE["dietcode"]
    for name in ("with", "without_again"):
        np.testing.assert_allclose(outputs[name], outputs["without"], rtol=tolerance, atol=tolerance, err_msg=name)


def plot(rows: list[dict], rewrite_pass: str, path: pathlib.Path) -> None:
    """Per batch: with the pass over without and the A/A pair against T, with their 95% intervals."""
    workloads = sorted({r["workload"] for r in rows})
    figure, axes = plt.subplots(1, len(workloads), squeeze=False, figsize=(6 * len(workloads), 4),
                                layout="constrained")
    for axis, workload in zip(axes[0], workloads):
        for pair, offset in (("with", -0.6), ("without_again", 0.6)):
            points = sorted((r["T"], r["ratio"], r["low"], r["high"]) for r in rows
                            if r["workload"] == workload and r["pair"] == pair)
            ts, ratio, low, high = map(np.asarray, zip(*points))
            axis.errorbar(ts + offset, ratio, yerr=[ratio - low, high - ratio], marker="o", capsize=3,
                          label=f"without / {pair}")
        axis.axhline(1.0, color="grey", linewidth=0.8)
        axis.set_title(workload, fontsize=9)
        axis.set_xlabel("T")
        axis.set_ylabel("paired ratio (above 1: faster than without)")
        axis.legend(fontsize=7)
    figure.suptitle(f"{rewrite_pass} on BERT-base, median and bootstrap 95% interval")
    figure.savefig(path, dpi=110)
    plt.close(figure)


def main(argv=None):
    parser = cli.parser(__doc__, None, "quick tuning, a few T, short cells")
    parser.add_argument("rewrite_pass", choices=PASSES, metavar="PASS", help=" or ".join(PASSES))
    for name in VARIANTS:
        parser.add_argument(f"--{name}", type=pathlib.Path, help=f"an optimized BERT-base SavedModel {name} the pass")
    parser.add_argument("--family", choices=list(bert_base.FAMILIES), default="keras")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 16])
    args = parser.parse_args(argv)
    family = bert_base.FAMILIES[args.family]
    args.out = args.out or pathlib.Path("bench/results") / args.rewrite_pass
    args.out.mkdir(parents=True, exist_ok=True)
    given = {name: getattr(args, name) for name in VARIANTS}
    if None in given.values() and any(given.values()):
        parser.error("--without and --with go together")
    paths = (given if all(given.values())
             else build_models(args.rewrite_pass, family, args.out, args.batches, args.quick))
    tf_dietcode.load_op_library()
    models = {name: tf.saved_model.load(str(path)) for name, path in paths.items()}
    signatures = {name: model.signatures["serving_default"] for name, model in models.items()}
    calls = {name: bert_base.output_call(signature, family) for name, signature in signatures.items()}
    calls["without_again"] = calls["without"]
    budget = QUICK_SECONDS_PER_CELL if args.quick else SECONDS_PER_CELL
    rng = np.random.default_rng(0)
    rows = []
    print(f"{'batch':>5s} {'T':>4s} {'rounds':>6s} {'without/with':>24s} {'A/A':>24s}")
    for batch in args.batches:
        for t in cli.sequence_lengths(args.quick):
            feed = family.feed(batch, t)
            samples = timing.block_seconds({name: (lambda call=call: call(feed)) for name, call in calls.items()},
                                           budget_seconds=budget, check=agree)
            cell = {}
            for pair in ("with", "without_again"):
                ratio, low, high = timing.median_ratio_interval(samples["without"], samples[pair], rng)
                cell[pair] = {"workload": f"{family.name}_batch{batch}", "T": t, "pair": pair,
                              "rounds": len(samples[pair]), "ms": 1e3 * float(np.median(samples[pair])),
                              "without_ms": 1e3 * float(np.median(samples["without"])),
                              "ratio": ratio, "low": low, "high": high, "verdict": verdict(low, high)}
            rows += cell.values()
            intervals = [f"{r['ratio']:.3f} [{r['low']:.3f}, {r['high']:.3f}]" for r in cell.values()]
            print(f"{batch:5d} {t:4d} {cell['with']['rounds']:6d} {intervals[0]:>24s} {intervals[1]:>24s} "
                  f"{cell['with']['verdict']}", flush=True)
    for batch in args.batches:
        paired = [r for r in rows if r["pair"] == "with" and r["workload"].endswith(f"batch{batch}")]
        slower = [r["T"] for r in paired if r["verdict"] == "slower"]
        print(f"batch {batch}: with {args.rewrite_pass} over without, geometric mean "
              f"{report.geomean(r['ratio'] for r in paired):.3f}x; slower beyond noise at T = {slower or 'none'}")
    csv, png = (args.out / f"{args.rewrite_pass}{suffix}" for suffix in (".csv", ".png"))
    report.write_csv(rows, csv)
    plot(rows, args.rewrite_pass, png)
    print(f"wrote {csv} and {png}")


if __name__ == "__main__":
    main()
