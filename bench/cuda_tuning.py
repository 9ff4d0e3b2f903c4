"""DietCode on CUDA against cuBLAS: drives the CUDA tuning flow (tuning/cuda/flow.py) on this
benchmark's workloads and reports each GPU run (CSV and plots under docs/results/).

    python -m bench.cuda_tuning build DIR      # every micro-kernel of the GPU space, symbolic,
                                               # plus static builds of a sample, into fatbins
    python3 bench/cuda_kernels.py DIR OUT      # on the GPU machine (no TVM there)
    python -m bench.cuda_tuning report OUT     # CSV + plots under docs/results/
    python -m bench.cuda_tuning build DIR --chosen-from docs/results/cuda_h200.csv --chosen-only
    python3 bench/cuda_kernels.py DIR OUT 7    # the chosen kernels, symbolic and static, in 7 rounds
    python -m bench.cuda_tuning aot OUT --chosen-from docs/results/cuda_h200.csv
    python -m bench.cuda_tuning compare OUT_BEFORE OUT_AFTER --name NAME   # a template change, same kernels
    python -m bench.cuda_tuning bundle OUT BUNDLE   # the trees and their kernels as a CUDA bundle
    python3 bench/cuda_kernels.py BUNDLE OUT2 5     # each T of 1..129: the tree's kernel and cuBLAS
    python -m bench.cuda_tuning bundle-report OUT2
    python -m bench.cuda_tuning build DIR --finalists-of OUT   # the search's finalists, at every T
    python -m bench.cuda_tuning bundle OUT BUNDLE --finalists-run OUT3   # trees refit to that run

The GPU has no TVM, so every kernel of the (finite) space is measured there once at
the benchmark's sequence lengths and the search is replayed over that record
(flow.replay); the report compares the search's pick with the best kernel of the
space and with cuBLAS, all from one GPU run.
"""

import argparse
import csv
import gzip
import json
import pathlib
import shutil
import statistics

from bench import report
from tf_dietcode.tuning import dispatch, search
from tf_dietcode.tuning.cuda import flow, space
from tf_dietcode.tuning.cuda.recorded import TOLERANCE, shape_of
from tf_dietcode.tuning.workload import Workload

RESULTS = pathlib.Path(__file__).resolve().parent.parent / "docs" / "results"

SEQUENCE_LENGTHS = (1, 5, 17, 24, 43, 62, 81, 100, 119, 128)
EVERY_T = range(1, 130)  # a bundle is checked and timed at every T of its range, and one past it
WORKLOADS = {
    "dense_b16_[16T,768]x[2304,768]^T": (Workload("dense", (16, 2048), 2304, 768, bias=True), lambda t: {"m": 16 * t}),
    "dense_b1_[T,768]x[2304,768]^T": (Workload("dense", (1, 128), 2304, 768, bias=True), lambda t: {"m": t}),
    "bmm_nt_[192,T,64]x[192,T,64]^T": (Workload("batch_matmul", (1, 128), (1, 128), 64, b=192, ties=("m", "n")),
                                       lambda t: {"m": t, "n": t}),
    "bmm_nn_[192,T,T]x[192,T,64]": (Workload("batch_matmul", (1, 128), 64, (1, 128), b=192, transpose_b=False,
                                             ties=("m", "k")), lambda t: {"m": t, "k": t}),
}


PLAN = flow.Plan(WORKLOADS, SEQUENCE_LENGTHS, EVERY_T)
LABELS = {workload.describe(): label for label, (workload, _) in WORKLOADS.items()}  # a run's names -> ours


def chosen_kernels(report_csv: pathlib.Path) -> dict[str, set[space.GpuKernel]]:
    """The kernels an earlier report's dispatch chose, by workload label."""
    chosen = {}
    for row in report.read(report_csv):
        if row["peer"] == "tf_dietcode":
            chosen.setdefault(row["workload"], set()).add(space.GpuKernel.from_name(row["kernel"]))
    return chosen


def _medians(run: pathlib.Path) -> dict[tuple[str, str, bool, int], float]:
    """Median seconds over a run's rounds by (workload, kernel, static build, T); cuBLAS'
    rows are the kernels "cublas" and "cublas_again" (a later record: timed after the kernels)."""
    times: dict[tuple, list[float]] = {}
    with open(run / "measurements.csv", newline="") as f:
        for row in csv.DictReader(f):
            key = (row["workload"], row["kernel"], row["static"] == "True", int(row["t"]))
            times.setdefault(key, []).append(float(row["seconds"]))
    return {key: statistics.median(samples) for key, samples in times.items()}


def _cublas_and_static(run: pathlib.Path) -> tuple[dict, list[tuple[str, str, int, float]]]:
    """cuBLAS' seconds by (workload, T) per timing ("cublas", and "cublas_again" where the
    run has it), and (workload, kernel, T, symbolic / static time) per static build."""
    medians, cublas = _medians(run), {}
    for (workload, kernel, _, t), seconds in medians.items():
        if kernel.startswith("cublas"):
            cublas.setdefault(kernel, {})[(workload, t)] = seconds
    return cublas, [(workload, kernel, t, medians[(workload, kernel, False, t)] / seconds)
                    for (workload, kernel, static, t), seconds in medians.items() if static]


def _speedups(run: pathlib.Path) -> dict[tuple[str, str, bool, int], float]:
    """Each kernel build's speed-up over cuBLAS' first timing at its shape, in the same run."""
    medians = _medians(run)
    return {(workload, kernel, static, t): medians[(workload, "cublas", False, t)] / seconds
            for (workload, kernel, static, t), seconds in medians.items() if not kernel.startswith("cublas")}


def compare_runs(before: pathlib.Path, after: pathlib.Path, name: str) -> list[dict]:
    """Two runs of the same kernels built before and after a change to the templates
    (`build --chosen-only` each time): every build's speed-up over cuBLAS in its own run,
    so that the GPU's drift between the runs cancels, after over before; writes
    docs/results/<name>.csv and both raw records."""
    old, new = _speedups(before), _speedups(after)
    rows = [{"workload": LABELS[workload], "kernel": kernel, "static": static, "T": t,
             "after_over_before": new[key] / speedup}
            for key, speedup in old.items() if key in new for workload, kernel, static, t in [key]]
    report.write_csv(rows, RESULTS / f"{name}.csv")
    _keep_record(before, f"{name}_before")
    _keep_record(after, f"{name}_after")
    for label in WORKLOADS:
        for pipelined in (True, False):
            ratios = [r["after_over_before"] for r in rows if r["workload"] == label
                      and (space.GpuKernel.from_name(r["kernel"]).stages > 1) == pipelined]
            if ratios:
                print(f"  {label}, {'pipelined' if pipelined else 'one stage'}: after / before geomean "
                      f"{report.geomean(ratios):.3f} ({min(ratios):.3f}-{max(ratios):.3f}), {len(ratios)} builds")
    return rows


def _keep_record(run: pathlib.Path, name: str) -> None:
    """The run's raw measurements beside the report, compressed: reports can be redone without a GPU."""
    with open(run / "measurements.csv", "rb") as raw, gzip.open(RESULTS / f"{name}_record.csv.gz", "wb") as packed:
        shutil.copyfileobj(raw, packed)


def report_run(run: pathlib.Path, name: str, trials: int, seed: int,
               stages: tuple[int, ...] = space.STAGES) -> list[dict]:
    """Replays the joint search (`trials` kernels measured of each space, its kernels of
    these pipeline depths: (1,) is CUDA templates 2's space) over a GPU run's
    record, builds each workload's dispatch tree, and compares at every T the tree's kernel
    with cuBLAS, with the best kernel of the whole space and with the kernel best at the
    largest T (the Nimble-like baseline), all as ratios over cuBLAS' first timing (its
    second, where the run has one, shows the drift); writes docs/results/<name>.{csv,png},
    <name>_static.csv and the run's raw record."""
    device = json.loads((run / "device.json").read_text())
    target, runner, results = flow.replay(PLAN, run, trials, seed, stages)
    cublas, static = _cublas_and_static(run)
    rows = []
    for label, (workload, sizes) in WORKLOADS.items():
        at = flow.shapes(workload, sizes, SEQUENCE_LENGTHS)
        sample = [shape_of(workload, dims) for dims in at]
        chosen = dispatch.build_dispatch(results[label])
        table = runner.records[workload.key()]

        def seconds_of(kernel, shape):
            return table.get((kernel, shape)) or float("inf")

        recorded = {k for k, _ in table} & set(target.space(workload))  # the space's kernels the run timed
        largest = min(recorded, key=lambda k: seconds_of(k, sample[-1]))
        for dims, shape in zip(at, sample):
            best = min(recorded, key=lambda k: seconds_of(k, shape))
            peers = {peer: (times[(workload.describe(), dims["t"])], "") for peer, times in cublas.items()}
            peers |= {"tf_dietcode": (seconds_of(picked := chosen.kernels[chosen.kernel_index(dims)], shape),
                                     picked.name),
                     "best_of_space": (seconds_of(best, shape), best.name),
                     "largest_T_kernel": (seconds_of(largest, shape), largest.name)}
            for peer, (seconds, kernel) in peers.items():
                rows.append({"workload": label, "T": dims["t"], "peer": peer, "kernel": kernel,
                             "ms": seconds * 1e3, "tflops": workload.flops(dims) / seconds / 1e12,
                             "speedup_vs_cublas": peers["cublas"][0] / seconds,
                             "trials": trials if peer == "tf_dietcode" else "", "space": len(target.space(workload))})
    report.write_csv(rows, RESULTS / f"{name}.csv")
    report.plot_by_t(rows, RESULTS / f"{name}.png", f"GPU micro-kernels vs cuBLAS (fp32), {device['name']}",
                     baseline="cuBLAS", ratio="speedup_vs_cublas")
    report.write_csv([{"workload": w, "kernel": k, "T": t, "symbolic_over_static": r} for w, k, t, r in static],
                     RESULTS / f"{name}_static.csv")
    _keep_record(run, name)
    (RESULTS / f"{name}_device.json").write_text((run / "device.json").read_text())  # not its read-only mode
    _print_summary(rows, static, device)
    return rows


def _print_summary(rows: list[dict], static: list, device: dict) -> None:
    print(f"{device['name']} ({device['sms']} SMs), torch {device['torch']}: speed-up over cuBLAS, "
          "geomean over T (worst)")
    for label in WORKLOADS:
        line = [label]
        for peer in ("tf_dietcode", "best_of_space", "largest_T_kernel", "cublas_again"):
            ratios = [r["speedup_vs_cublas"] for r in rows if r["workload"] == label and r["peer"] == peer]
            if ratios:
                line.append(f"{peer} {report.geomean(ratios):.2f}x ({min(ratios):.2f}x)")
        print("  " + "; ".join(line))
    for workload in dict.fromkeys(w for w, *_ in static):
        ratios = [r for w, _, _, r in static if w == workload]
        print(f"  symbolic / static {workload}: median {statistics.median(ratios):.3f}, max {max(ratios):.3f}, "
              f"{sum(r > 1.05 for r in ratios)} of {len(ratios)} over 1.05")


def report_aot(run: pathlib.Path, chosen_from: pathlib.Path, name: str) -> list[dict]:
    """Symbolic / static time of the kernels a dispatch chose (a run of `build --chosen-only`,
    timed in rounds), at every T, marking the T where the tree runs that kernel; writes
    docs/results/<name>.csv and the run's raw record."""
    chosen = {(row["workload"], row["T"]): row["kernel"] for row in report.read(chosen_from)
              if row["peer"] == "tf_dietcode"}
    _, static = _cublas_and_static(run)
    rows = [{"workload": LABELS[w], "kernel": k, "T": t, "dispatched_here": chosen.get((LABELS[w], t)) == k,
             "symbolic_over_static": ratio} for w, k, t, ratio in static]
    report.write_csv(rows, RESULTS / f"{name}.csv")
    _keep_record(run, name)
    for label in WORKLOADS:
        for where, selected in (("where dispatched", True), ("at every T", False)):
            ratios = [r["symbolic_over_static"] for r in rows
                      if r["workload"] == label and (r["dispatched_here"] or not selected)]
            print(f"  {label} {where}: symbolic / static median {statistics.median(ratios):.3f}, "
                  f"max {max(ratios):.3f}, {sum(r > 1.05 for r in ratios)} of {len(ratios)} over 1.05")
    return rows


def report_bundle(run: pathlib.Path, name: str) -> list[dict]:
    """The bundle's run: at every T the tree's kernel against cuBLAS (medians over rounds);
    writes docs/results/<name>.{csv,png} and the run's raw record."""
    device = json.loads((run / "device.json").read_text())
    times: dict[tuple, list[float]] = {}
    kernels = {}
    with open(run / "measurements.csv", newline="") as f:
        for row in csv.DictReader(f):
            if float(row["error"]) > TOLERANCE:
                raise RuntimeError(f"{row['kernel']} was wrong at T = {row['t']} in {row['workload']}")
            peer = row["kernel"] if row["kernel"].startswith("cublas") else "tf_dietcode"
            key = (LABELS[row["workload"]], int(row["t"]), peer)
            times.setdefault(key, []).append(float(row["seconds"]))
            if peer == "tf_dietcode":
                kernels[key] = row["kernel"]
    rows = []
    for (label, t, peer), samples in sorted(times.items()):
        seconds = statistics.median(samples)
        cublas = statistics.median(times[(label, t, "cublas")])
        rows.append({"workload": label, "T": t, "peer": peer, "kernel": kernels.get((label, t, peer), ""),
                     "ms": seconds * 1e3, "speedup_vs_cublas": cublas / seconds})
    report.write_csv(rows, RESULTS / f"{name}.csv")
    report.plot_by_t(rows, RESULTS / f"{name}.png", f"CUDA bundle's trees vs cuBLAS (fp32) at every T, "
                     f"{device['name']}", baseline="cuBLAS", ratio="speedup_vs_cublas")
    _keep_record(run, name)
    for label in WORKLOADS:
        ratios = [r["speedup_vs_cublas"] for r in rows if r["workload"] == label and r["peer"] == "tf_dietcode"]
        fallback = [r["T"] for r in rows if r["workload"] == label and r["peer"] == "cublas"
                    and not any(o["T"] == r["T"] and o["peer"] == "tf_dietcode" for o in rows)]
        print(f"  {label}: {len(ratios)} T right and timed, geomean {report.geomean(ratios):.2f}x of cuBLAS, "
              f"worst {min(ratios):.2f}x, {sum(r < 1 for r in ratios)} T under 1x; no kernel (outside the "
              f"range) at T = {fallback}")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    building = commands.add_parser("build")
    building.add_argument("directory", type=pathlib.Path)
    building.add_argument("--chosen-from", type=pathlib.Path, help="an earlier report's CSV: its chosen kernels "
                          "are built static too")
    building.add_argument("--chosen-only", action="store_true", help="only those kernels, symbolic and static")
    building.add_argument("--finalists-of", type=pathlib.Path, help="a GPU run of the whole space: the replayed "
                          "search's finalists, to be measured at every T")
    reporting = commands.add_parser("report")
    reporting.add_argument("run", type=pathlib.Path, help="the GPU run's output (measurements.csv, device.json)")
    reporting.add_argument("--name", default="cuda_h200", help="file names under docs/results/")
    reporting.add_argument("--trials", type=int, default=search.SearchOptions.trials)
    reporting.add_argument("--seed", type=int, default=0)
    aot = commands.add_parser("aot", help="symbolic vs static builds of the chosen kernels, timed in rounds")
    aot.add_argument("run", type=pathlib.Path)
    aot.add_argument("--chosen-from", type=pathlib.Path, required=True, help="the report whose kernels were built")
    aot.add_argument("--name", default="cuda_h200_aot")
    comparing = commands.add_parser("compare", help="the same kernels' runs before and after a template change")
    comparing.add_argument("before", type=pathlib.Path)
    comparing.add_argument("after", type=pathlib.Path)
    comparing.add_argument("--name", required=True)
    bundling = commands.add_parser("bundle", help="a CUDA bundle of a run's replayed trees")
    bundling.add_argument("run", type=pathlib.Path)
    bundling.add_argument("directory", type=pathlib.Path)
    bundling.add_argument("--trials", type=int, default=search.SearchOptions.trials)
    bundling.add_argument("--finalists-run", type=pathlib.Path, help="the finalists' run at every T: the trees "
                          "are fit to it")
    for searching in (reporting, bundling):
        searching.add_argument("--stages", type=int, nargs="+", default=list(space.STAGES),
                               help="pipeline depths of the space to search (1 alone: CUDA templates 2's space)")
    bundle_report = commands.add_parser("bundle-report", help="a bundle's run at every T")
    bundle_report.add_argument("run", type=pathlib.Path)
    bundle_report.add_argument("--name", default="cuda_h200_bundle")
    arguments = parser.parse_args()
    if arguments.command == "build":
        chosen = chosen_kernels(arguments.chosen_from) if arguments.chosen_from is not None else None
        manifest = flow.build_set(PLAN, arguments.directory, chosen=chosen, whole_space=not arguments.chosen_only,
                                  finalists_of=arguments.finalists_of)
        print(sum(len(w["kernels"]) for w in manifest["workloads"]), "kernels in", arguments.directory)
    elif arguments.command == "report":
        report_run(arguments.run, arguments.name, arguments.trials, arguments.seed, tuple(arguments.stages))
    elif arguments.command == "aot":
        report_aot(arguments.run, arguments.chosen_from, arguments.name)
    elif arguments.command == "compare":
        compare_runs(arguments.before, arguments.after, arguments.name)
    elif arguments.command == "bundle":
        manifest = flow.write_bundle(PLAN, arguments.run, arguments.directory, arguments.trials, 0,
                                     arguments.finalists_run, tuple(arguments.stages))
        print(sum(len(w["kernels"]) for w in manifest["workloads"]), "kernels in", arguments.directory)
    else:
        report_bundle(arguments.run, arguments.name)


if __name__ == "__main__":
    main()
