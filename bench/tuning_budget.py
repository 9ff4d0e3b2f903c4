"""Tuning budgets end to end: what the default budget buys over the quick one, per encoder.

    python -m bench.tuning_budget [--quick] [--families keras exported] [--batches 1 16]
                                  [--tuning-database-from DIR] [--out bench/results/tuning_budget]

For each BERT-base family of bench.bert_base, optimize() runs twice with its defaults, once per
budget (search.BUDGETS: "default" and "quick"), each from its own tuning database so that neither
reads the other's kernels. With --tuning-database-from, the default budget's database starts from a
copy of DIR/tuning.jsonl (the suite's bert_base folder holds that same tuning of the same encoders),
so it is not tuned twice; its tuning time is then the earlier run's, and the cost CSV's
kernels_measured (0) says so. The quick budget always tunes here, from nothing.

TF and the two optimized models are timed as bench.bert_base times its peers (blocks of
back-to-back calls, rounds alternating between them, medians; outputs checked against TF at every
cell), at batch 1 and 16 and T in bench.workloads.SEQUENCE_LENGTHS (--quick: the quick T; the budgets
compared stay the same). Writes tuning_budget.csv (ms and speed-up over TF per family, batch, T and
budget), tuning_budget_cost.csv (per family and budget: optimize()'s tuning seconds and the kernels
it measured) and tuning_budget.png, and prints default over quick per family and batch (geometric
mean over T, the range).
"""

import os
import pathlib
import shutil

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from bench import bert_base, cli, report, timing  # noqa: E402
from tf_dietcode.tuning import search  # noqa: E402
from tf_dietcode.tuning.database import Database  # noqa: E402

TOLERANCE = bert_base.TOLERANCE["dietcode"]
SECONDS_PER_CELL = 12.0  # three peers: about what bench.bert_base gives each of its five


def peer(budget: str) -> str:
    return f"dietcode_{budget}"


def agree_with_tensorflow(outputs: dict[str, bert_base.Outputs]) -> None:
    for budget in search.BUDGETS:
        for index, (actual, expected) in enumerate(zip(outputs[peer(budget)], outputs["tensorflow"])):
            np.testing.assert_allclose(actual, expected, rtol=TOLERANCE, atol=TOLERANCE,
                                       err_msg=f"{peer(budget)} output {index}")


def databases(folder: pathlib.Path, copy_from: pathlib.Path | None) -> dict[str, Database]:
    """Budget -> its own tuning database in `folder`, fresh (the default's a copy of copy_from's)."""
    for stale in folder.glob("tuning_*"):
        shutil.rmtree(stale) if stale.is_dir() else stale.unlink()
    return {budget: cli.tuning_database(folder / f"tuning_{budget}.jsonl", copy_from if budget == "default" else None)
            for budget in search.BUDGETS}


def run_family(family: bert_base.Family, args) -> tuple[list[dict], list[dict]]:
    """Optimizes the family at each budget and times both against TF: (timing rows, cost rows)."""
    models_dir = args.out / family.name
    original = models_dir / "original"
    shutil.rmtree(original, ignore_errors=True)
    models_dir.mkdir(parents=True, exist_ok=True)
    family.export(original)
    costs = []
    for budget, database in databases(models_dir, args.tuning_database_from).items():
        result = bert_base.optimize(original, models_dir / peer(budget), family, args.batches,
                                    search.BUDGETS[budget], database)
        costs.append({"family": family.name, "budget": budget, "trials": search.BUDGETS[budget].trials,
                      "tuning_seconds": result.timings.get("build", 0.0),
                      "workloads": len(result.tuning_times),
                      "kernels_measured": sum(t.kernels_measured for t in result.tuning_times.values())})
    models = {name: tf.saved_model.load(str(models_dir / folder))  # kept: a signature needs its variables
              for name, folder in [("tensorflow", "original"), *((peer(b), peer(b)) for b in search.BUDGETS)]}
    calls = {name: bert_base.output_call(model.signatures["serving_default"], family) for name, model in models.items()}
    rows = []
    for batch in args.batches:
        for t in cli.sequence_lengths(args.quick):
            feed = family.feed(batch, t)
            seconds = timing.block_medians({name: (lambda call=call: call(feed)) for name, call in calls.items()},
                                           budget_seconds=bert_base.QUICK_SECONDS_PER_CELL if args.quick
                                           else SECONDS_PER_CELL,
                                           check=agree_with_tensorflow)
            rows += [{"workload": f"{family.name}_batch{batch}", "T": t, "peer": name, "ms": value * 1e3,
                      "speedup_vs_tensorflow": seconds["tensorflow"] / value} for name, value in seconds.items()]
            print(f"{family.name} batch {batch:2d} T {t:3d}: "
                  + ", ".join(f"{name} {value * 1e3:.2f} ms" for name, value in seconds.items()))
    return rows, costs


def default_over_quick(rows: list[dict]) -> dict[str, list[float]]:
    """Workload -> the quick model's time over the default's at each T (above 1: the default is faster)."""
    ms = {(r["workload"], r["T"], r["peer"]): r["ms"] for r in rows}
    result: dict[str, list[float]] = {}
    for workload, t, name in ms:
        if name == peer("default"):
            result.setdefault(workload, []).append(ms[(workload, t, peer("quick"))] / ms[(workload, t, name)])
    return result


def main(argv=None):
    parser = cli.parser(__doc__, "bench/results/tuning_budget", "the quick T (both budgets still tune)")
    parser.add_argument("--families", nargs="+", choices=list(bert_base.FAMILIES), default=list(bert_base.FAMILIES))
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--tuning-database-from", type=pathlib.Path,
                        help="the default budget starts from a copy of this folder's tuning.jsonl (the suite's bert_base)")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    rows, costs = [], []
    for key in args.families:
        family_rows, family_costs = run_family(bert_base.FAMILIES[key], args)
        rows += family_rows
        costs += family_costs
    print("\nthe default budget's speed-up over the quick one (quick ms / default ms): geometric mean over T (range)")
    for workload, ratios in default_over_quick(rows).items():
        print(f"  {workload:>28s} {report.geomean(ratios):.3f} ({min(ratios):.3f}-{max(ratios):.3f})")
    print("tuning:")
    for cost in costs:
        print(f"  {cost['family']:>20s} {cost['budget']:>8s}: {cost['tuning_seconds']:.0f} s, "
              f"{cost['kernels_measured']} kernels measured over {cost['workloads']} workloads")
    report.write_csv(rows, args.out / "tuning_budget.csv")
    report.write_csv(costs, args.out / "tuning_budget_cost.csv")
    report.plot_by_t(rows, args.out / "tuning_budget.png",
                     title="BERT-base optimized at the default and the quick tuning budget, one call per inference")
    print(f"wrote {args.out}/tuning_budget.csv, tuning_budget_cost.csv and tuning_budget.png")


if __name__ == "__main__":
    main()
