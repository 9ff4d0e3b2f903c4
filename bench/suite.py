"""The whole benchmark suite in one command, and docs/BENCHMARKS.md from what it wrote.

    python -m bench.suite [--quick] [--out bench/results/suite] [--docs docs] [--parts PART ...]

Runs each part in its own process, one after another (never two timings at
once on this 2-core machine), from a fresh output directory (so tuning times
are not shortened by an earlier run's database):
peak, kernel_peers, tuned_kernels, tuning_cost (which reads tuned_kernels'
DietCode and largest-shape runs), bert_base (both BERT-base families: bert_base.csv and
bert_base_exported.csv), precision (which starts from a copy of bert_base's tuning database: its
float32 BERT-base is the same tuning; rerun alone, it keeps what it tuned itself). --quick gives each part its
quick mode (a few T, the quick tuning budget); the full run took 2 h 31 min on a 2-vCPU AMD EPYC
Zen 4 (an hour of it bert_base, 44 min precision; the precision part rerun alone, 18 min).
Then copies every CSV and plot into <docs>/results/suite/ and writes
<docs>/BENCHMARKS.md from those CSVs alone.

--parts reruns only the named parts into the existing --out, reading the earlier parts' outputs
there (a change that touches one part's figures need not wait 2.5 hours), and records the
commit each part ran from in suite_runs.csv.
"""

import argparse
import pathlib
import shutil
import subprocess
import sys
import time

from bench import benchmarks_md, report

# (part, whether it has a quick mode, {flag: the earlier part whose output it reads})
PARTS = [("peak", False, {}), ("kernel_peers", True, {}), ("tuned_kernels", True, {}),
         ("tuning_cost", True, {"--tuned-kernels": "tuned_kernels"}), ("bert_base", True, {}),
         ("precision", True, {"--tuning-database-from": "bert_base"})]


def command(part: str, has_quick: bool, inputs: dict[str, str], quick: bool, out: pathlib.Path) -> list[str]:
    return [sys.executable, "-m", f"bench.{part}", *(["--quick"] if quick and has_quick else []),
            *(a for flag, earlier in inputs.items() for a in (flag, str(out / earlier))), "--out", str(out / part)]


def as_typed(line: list[str]) -> str:
    """The command as a user at the working directory types it: paths under it relative, so that
    suite_runs.csv (and BENCHMARKS.md from it) never name one machine's folders."""
    def shown(argument: str) -> str:
        path = pathlib.Path(argument)
        return str(path.relative_to(pathlib.Path.cwd())) if path.is_absolute() and \
            path.is_relative_to(pathlib.Path.cwd()) else argument
    return "python " + " ".join(shown(argument) for argument in line[1:])


def source_commit() -> str:
    """The commit the suite runs from ("+ changes" where the tree differs from it), for the report."""
    def git(*arguments: str) -> str:
        return subprocess.run(["git", *arguments], capture_output=True, text=True, check=True).stdout.strip()

    try:
        return git("rev-parse", "--short", "HEAD") + (" + changes" if git("status", "--porcelain", "-uno") else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown (not a git checkout)"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="every part's quick mode (18-35 minutes)")
    parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path("bench/results/suite"))
    parser.add_argument("--docs", type=pathlib.Path, default=pathlib.Path("docs"))
    parser.add_argument("--parts", nargs="+", choices=[part for part, _, _ in PARTS],
                        help="rerun only these parts into the existing --out (default: every part, afresh)")
    args = parser.parse_args(argv)
    if args.parts:
        runs = [run for run in report.read(args.out / "suite_runs.csv") if run["part"] not in args.parts]
        missing = [str(args.out / earlier) for part, _, inputs in PARTS if part in args.parts
                   for earlier in inputs.values() if not (args.out / earlier).is_dir()]
        if missing:
            parser.error(f"--parts reads the earlier parts' outputs, missing: {', '.join(missing)}")
    else:
        shutil.rmtree(args.out, ignore_errors=True)
        args.out.mkdir(parents=True)
        runs = []
    commit = source_commit()
    for part, has_quick, inputs in PARTS:
        if args.parts and part not in args.parts:
            continue
        line = command(part, has_quick, inputs, args.quick, args.out)
        print(f"\n=== {' '.join(line[1:])}", flush=True)
        started = time.perf_counter()
        subprocess.run(line, check=True)
        runs.append({"part": part, "command": as_typed(line),
                     "seconds": time.perf_counter() - started, "commit": commit})
    order = [part for part, _, _ in PARTS]
    report.write_csv(sorted(runs, key=lambda run: order.index(run["part"])), args.out / "suite_runs.csv")

    published = args.docs / "results" / "suite"
    shutil.rmtree(published, ignore_errors=True)
    published.mkdir(parents=True)
    for path in [*args.out.glob("*/*.csv"), *args.out.glob("*/*.png"), args.out / "suite_runs.csv"]:
        shutil.copy2(path, published / path.name)
    markdown = args.docs / "BENCHMARKS.md"
    markdown.write_text(benchmarks_md.render(published, markdown.parent, quick=args.quick))
    print(f"\nwrote {markdown} and {published}/")


if __name__ == "__main__":
    main()
