"""Symbolic-shape kernels against their static builds, paired several times per cell.

    python -m bench.studies.aot_pairs [--quick] [--tuned-kernels bench/results] [--out bench/results]

Reads tuned_kernels.csv in --tuned-kernels (bench.tuned_kernels: the micro-kernel its tree ran
at each T) and, for each (workload, T), compiles that micro-kernel with symbolic
dims and for the static shape, and times the pair RUNS times (QUICK_RUNS with
--quick) as the tuner times candidates (measure.measure_modules: interleaved
repeats), each run on fresh operands, which both builds share (their ratio is the code's, not
where each build's arrays lie). The reading per cell is the median ratio.
Why: one pass of bench.tuned_kernels' 21 rounds moved a cell by 3-5% between runs
of the same kernels on a 2-vCPU Xeon, about what a 5% bar on AOT builds needs to
tell apart. Writes aot_pairs.csv (median, lowest and highest ratio per cell) and
aot_pairs.png; prints each workload's worst median.
"""

import pathlib

import matplotlib.pyplot as plt
import numpy as np
import tvm

from bench import cli, report
from bench.threads import use_tvm_threads
from bench.tuned_kernels import CASES
from tf_dietcode.tuning import hardware, measure
from tf_dietcode.tuning.micro_kernel import space

RUNS, QUICK_RUNS = 5, 3
REPEATS = 9  # per run: measure_modules' median of interleaved repeats


def paired_ratios(workload, kernel, shape: tuple[int, ...], symbolic, hw, runs: int) -> list[float]:
    """Symbolic over static seconds of one micro-kernel at one shape, once per run."""
    static = measure.compile_kernel(workload, kernel, hw, workload.dims_at(shape)).mod
    ratios = []
    for run in range(runs):
        records = measure.measure_modules([(kernel, symbolic), (kernel, static)], tvm.cpu(), workload, [shape],
                                          np.random.default_rng(run), repeats=REPEATS)
        failed = [record.error for record in records if record.seconds is None]
        if failed:
            raise RuntimeError(f"{kernel.name} at {shape}: {failed[0]}")
        ratios.append(records[0].seconds / records[1].seconds)
    return ratios


def plot(rows: list[dict], path: pathlib.Path, title: str) -> None:
    """Median symbolic / static per T, one line per workload, lowest to highest run as error bars."""
    figure, axis = plt.subplots(figsize=(8, 4.5), layout="constrained")
    for workload in sorted({row["workload"] for row in rows}):
        mine = sorted((row["T"], row["median"], row["lowest"], row["highest"]) for row in rows
                      if row["workload"] == workload)
        ts, medians, lowest, highest = map(np.array, zip(*mine))
        axis.errorbar(ts, medians, yerr=[medians - lowest, highest - medians], marker="o", capsize=3, label=workload)
    axis.axhline(1.05, color="red", linewidth=0.8, linestyle="--", label="5% bar (1.05)")
    axis.axhline(1.0, color="grey", linewidth=0.8)
    axis.set_xlabel("T")
    axis.set_ylabel("symbolic / static (median of runs)")
    axis.legend(fontsize=7)
    report.save(figure, path, title)


def main(argv=None):
    parser = cli.parser(__doc__, "bench/results", f"{QUICK_RUNS} runs per cell instead of {RUNS}")
    parser.add_argument("--tuned-kernels", type=pathlib.Path, default=pathlib.Path("bench/results"),
                        help="bench.tuned_kernels' --out, on this machine")
    args = parser.parse_args(argv)
    use_tvm_threads()  # before TVM's pool starts, at the first parallel kernel
    source = args.tuned_kernels / "tuned_kernels.csv"
    if not source.exists():
        raise SystemExit(f"no {source}: run `python -m bench.tuned_kernels --out {args.tuned_kernels}` first")
    cases = {name: (workload, shape_at) for name, workload, shape_at, _ in CASES}
    cells = [row for row in report.read(source) if row["peer"] == "dietcode" and row["workload"] in cases]
    hw = hardware.detect()
    runs = QUICK_RUNS if args.quick else RUNS
    kernels, symbolic, rows = {}, {}, []
    for cell in cells:
        workload, shape_at = cases[cell["workload"]]
        if cell["workload"] not in kernels:
            kernels[cell["workload"]] = {kernel.name: kernel for kernel in space(hw, workload)}
        kernel = kernels[cell["workload"]].get(cell["kernel"])
        if kernel is None:
            raise SystemExit(f"{cell['kernel']} is not in this machine's space for {cell['workload']}: "
                             f"{source} was written on another machine")
        if (cell["workload"], kernel) not in symbolic:
            symbolic[cell["workload"], kernel] = measure.compile_kernel(workload, kernel, hw).mod
        ratios = paired_ratios(workload, kernel, shape_at(cell["T"]), symbolic[cell["workload"], kernel], hw, runs)
        rows.append({"workload": cell["workload"], "T": cell["T"], "kernel": kernel.name, "runs": runs,
                     "median": float(np.median(ratios)), "lowest": min(ratios), "highest": max(ratios)})
        print(f"{cell['workload']:34s} {cell['T']:4d} {kernel.name:>24s} symbolic/static {rows[-1]['median']:.3f} "
              f"({rows[-1]['lowest']:.3f}-{rows[-1]['highest']:.3f})", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    report.write_csv(rows, args.out / "aot_pairs.csv")
    plot(rows, args.out / "aot_pairs.png", f"Symbolic over static, {runs} paired runs per cell ({hw.mcpu})")
    for workload in sorted({row["workload"] for row in rows}):
        worst = max((row for row in rows if row["workload"] == workload), key=lambda row: row["median"])
        print(f"{workload:34s} worst median {worst['median']:.3f} at T = {worst['T']}")
    print(f"wrote {args.out / 'aot_pairs.csv'}")


if __name__ == "__main__":
    main()
