"""Tuning cost: one DietCode run for a whole range against per-shape MetaSchedule
(Ansor-like) at the same trials per shape, with the largest-shape (Nimble-like)
baseline beside them.

    python -m bench.tuning_cost [--workload dense_b16] [--quick] [--tuned-kernels bench/results] [--out bench/results]

DietCode's and the largest-shape baseline's runs are bench.tuned_kernels': each
tunes from a fresh database there, and its CSV has their wall times, trial budget
and kernel times (its tvm_seconds, which times MetaSchedule's kernels here), so
they are read, not run a second time. DietCode measures each of its `trials` micro-kernels at every sample
shape, so MetaSchedule gets `trials` trials per shape, timed here. Shapes: T in
{5,24,43,62,81,100,119,128} (T=62 with --quick). Writes tuning_cost.csv: per
method and T the kernel time and the method's tuning wall time, and tuning_cost.png
(wall time per method, MetaSchedule's projected to every T). MetaSchedule
parses only this CPU's tensor intrinsics, in the tuning process and in its
builder workers (baselines.register_cpu_tensor_intrinsics): a TVMScript parsing
cost of TVM's import, not of its search.
"""

import pathlib
import tempfile

import numpy as np

from bench import baselines, cli, report, timing
from bench.threads import use_tvm_threads
from bench.tuned_kernels import CASES
from tf_dietcode.tuning import hardware, templates

SAMPLED_T = (5, 24, 43, 62, 81, 100, 119, 128)
QUICK_SAMPLED_T = (62,)


def tuned_kernels_rows(path: pathlib.Path, workload: str, sampled_t) -> list[dict]:
    """DietCode's and the largest-shape baseline's rows at the sampled T from bench.tuned_kernels' CSV."""
    if not path.exists():
        raise SystemExit(f"no {path}: run `python -m bench.tuned_kernels` first (with --quick for --quick)")
    rows = [r for r in report.read(path) if r["workload"] == workload and r["T"] in sampled_t
            and r["peer"] in ("dietcode", "largest_shape")]
    missing = set(sampled_t) - {r["T"] for r in rows}
    if missing:
        raise SystemExit(f"{path} has no {workload} at T in {sorted(missing)}: run bench.tuned_kernels with "
                         "the same --quick")
    if not all(r["from_empty_databases"] == "True" for r in rows):
        raise SystemExit(f"{path}'s tuning resumed from an earlier run's database, so its tuning times are not "
                         "a run's cost: run bench.tuned_kernels into a fresh --out")
    return rows


def main(argv=None):
    parser = cli.parser(__doc__, "bench/results", "T=62 only (bench.tuned_kernels --quick has no other sample)")
    parser.add_argument("--workload", default="dense_b16", help="prefix of a bench.tuned_kernels case name")
    parser.add_argument("--tuned-kernels", type=pathlib.Path, default=pathlib.Path("bench/results"),
                        help="the --out of a bench.tuned_kernels run (its tuned_kernels.csv)")
    args = parser.parse_args(argv)
    use_tvm_threads()
    sampled_t = QUICK_SAMPLED_T if args.quick else SAMPLED_T
    name, workload, shape_at, _ = next(c for c in CASES if c[0].startswith(args.workload))
    tuned = tuned_kernels_rows(args.tuned_kernels / "tuned_kernels.csv", name, sampled_t)
    trials = int(tuned[0]["trials"])
    rows = [{"workload": name, "method": r["peer"], "T": r["T"], "ms": r["ms"], "gflops": r["gflops"],
             "tuning_seconds": r["tuning_seconds"], "kernel": r["kernel"]} for r in tuned]
    dietcode_seconds = next(r["tuning_seconds"] for r in rows if r["method"] == "dietcode")
    largest_seconds = next(r["tuning_seconds"] for r in rows if r["method"] == "largest_shape")

    hw = hardware.detect()
    template = templates.for_workload(workload)
    rng = np.random.default_rng(0)
    for t in sampled_t:
        dims = workload.dims_at(shape_at(t))
        operands = template.random_operands(workload, dims, rng)
        row = {"workload": name, "method": "metaschedule_per_shape", "T": t}
        with tempfile.TemporaryDirectory() as work_dir:
            try:
                executable, tuning = baselines.per_shape_metaschedule(workload, hw, dims, trials, work_dir)
            except baselines.MetaScheduleFailed as failure:  # a row saying so, not a lost suite run
                print(failure)
                rows.append(row | {"ms": float("nan"), "gflops": float("nan"), "tuning_seconds": failure.seconds,
                                   "kernel": "failed"})
                continue
        [seconds] = timing.tvm_seconds((executable.mod, "main", baselines.plain_arguments(operands, workload, dims)))
        rows.append(row | {"ms": seconds * 1e3, "gflops": workload.flops(dims) / seconds / 1e9,
                           "tuning_seconds": tuning, "kernel": ""})

    args.out.mkdir(parents=True, exist_ok=True)
    report.write_csv(rows, args.out / "tuning_cost.csv")
    ms_total = sum(r["tuning_seconds"] for r in rows if r["method"] == "metaschedule_per_shape")
    projected = ms_total / len(sampled_t) * 128
    report.tuning_seconds_bars({"DietCode\n(T in [1, 128])": dietcode_seconds,
                                "largest shape\n(T = 128, used for all)": largest_seconds,
                                f"MetaSchedule\n({len(sampled_t)} shape(s) timed)": ms_total,
                                "MetaSchedule\n(projected to 128 T)": projected},
                               args.out / "tuning_cost.png", f"Tuning wall time, {name}, {trials} trials per shape")
    print(f"\n{name}, {trials} trials per shape, T in {sampled_t}")
    print(f"tuning wall time: DietCode {dietcode_seconds:.0f} s for all of T in [1,128]; "
          f"MetaSchedule {ms_total:.0f} s for these {len(sampled_t)} shapes "
          f"(DietCode/MetaSchedule = {dietcode_seconds / ms_total:.2f}; projected to all 128 T: "
          f"{projected / 3600:.1f} h); largest-shape {largest_seconds:.0f} s")
    print(f"{'T':>4s} {'DietCode ms':>12s} {'MetaSchedule ms':>16s} {'largest-shape ms':>17s} {'DietCode vs MS':>15s}")
    for t in sampled_t:
        ms_of = {r["method"]: r["ms"] for r in rows if r["T"] == t}
        print(f"{t:4d} {ms_of['dietcode']:12.3f} {ms_of['metaschedule_per_shape']:16.3f} "
              f"{ms_of['largest_shape']:17.3f} {ms_of['metaschedule_per_shape'] / ms_of['dietcode']:14.2f}x")
    print(f"wrote {args.out / 'tuning_cost.csv'} and {args.out / 'tuning_cost.png'}")


if __name__ == "__main__":
    main()
