"""The `tf-dietcode` command line (also `python -m tf_dietcode`).

    tf-dietcode tune --m 1:128 --n 2304 --k 768 --bias --activation gelu --out BUNDLE_DIR
    tf-dietcode tune --spec workloads.json --out BUNDLE_DIR [--quick] [--trials 64] [--db tuning.jsonl]

`tune` searches micro-kernels for each workload's whole range, writes a checked
kernel bundle and prints which micro-kernel serves which M.
"""

import argparse
import dataclasses
import json
import pathlib
import sys
import time


def _range(text: str) -> tuple[int, int]:
    lo, _, hi = text.partition(":")
    return int(lo), int(hi or lo)


def _workloads(args):
    from tf_dietcode.tuning.workload import Workload

    if args.spec:
        return [Workload(**fields) for fields in json.loads(pathlib.Path(args.spec).read_text())]
    if None in (args.m, args.n, args.k):
        raise ValueError("give --spec FILE, or --m LO:HI with --n and --k")
    return [Workload("dense", _range(args.m), args.n, args.k, bias=args.bias, activation=args.activation)]


def _tune(args) -> int:
    from tf_dietcode.tuning import search
    from tf_dietcode.tuning.database import Database
    from tf_dietcode.tuning.tune import tune

    workloads = _workloads(args)
    budget = search.QUICK if args.quick else search.SearchOptions()
    options = dataclasses.replace(budget, trials=args.trials or budget.trials, seed=args.seed)
    started = time.perf_counter()
    report = tune(workloads, args.out, options=options, database=Database(args.db) if args.db else None)
    print(f"tuned {len(workloads)} workload(s) in {time.perf_counter() - started:.0f} s; bundle: {args.out}")
    for dispatch in report.dispatches:
        _print_dispatch(dispatch)
    return 0


def _describe(workload) -> str:
    from tf_dietcode.tuning.workload import DIMS

    sizes = ", ".join(f"{d.upper()}={r.lo}" if r.static else f"{d.upper()}={r.lo}..{r.hi}"
                      for d in DIMS for r in [getattr(workload, d)])
    extras = f", ties {'='.join(workload.ties)}" if workload.ties else ""
    if workload.kind == "dense":
        extras += f", bias={workload.bias}, activation={workload.activation}"
    else:
        extras += ", NT" if workload.transpose_b else ", NN"
    return f"{workload.kind} {sizes}{extras}"


def _print_dispatch(dispatch) -> None:
    """Which micro-kernel serves which sizes of the (first) shape variable."""
    workload = dispatch.workload
    print(f"\n{_describe(workload)}")
    variables = workload.variables()
    if len(variables) != 1:
        shapes = workload.all_shapes()
        for index, kernel in enumerate(dispatch.kernels):
            share = sum(dispatch.kernel_index(workload.dims_at(s)) == index for s in shapes) / len(shapes)
            print(f"  {kernel.name:24s} serves {share:6.1%} of the shapes")
        return
    (names, size), = variables
    label = "=".join(n.upper() for n in names)
    runs: list[list[int]] = []
    for value in range(size.lo, size.hi + 1):
        index = dispatch.kernel_index(workload.dims_at((value,)))
        if runs and runs[-1][2] == index:
            runs[-1][1] = value
        else:
            runs.append([value, value, index])
    for first, last, index in runs:
        gflops = dispatch.predicted_gflops.get((first,), float("nan"))
        print(f"  {label} {first:>5}..{last:<5} -> {dispatch.kernels[index].name:24s} "
              f"(predicted {gflops:.0f} GFLOP/s at {label}={first})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tf-dietcode", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    tune = commands.add_parser("tune", help="tune workloads for their shape ranges and write a kernel bundle")
    tune.add_argument("--spec", help="JSON file: a list of workloads (fields of tuning.Workload)")
    tune.add_argument("--m", help="dense rows range LO:HI (the dynamic dim)")
    tune.add_argument("--n", type=int, help="dense output features")
    tune.add_argument("--k", type=int, help="dense input features")
    tune.add_argument("--bias", action="store_true")
    tune.add_argument("--activation", default="none")
    tune.add_argument("--out", required=True, type=pathlib.Path, help="bundle directory to write")
    tune.add_argument("--quick", action="store_true", help="small search budget (demos, tests)")
    tune.add_argument("--trials", type=int, help="micro-kernels to measure per workload")
    tune.add_argument("--seed", type=int, default=0)
    tune.add_argument("--db", help="tuning database (JSON lines), reused and extended")
    args = parser.parse_args(argv)
    try:
        return _tune(args)
    except (ValueError, TypeError, OSError, RuntimeError) as error:
        print(f"tf-dietcode {args.command}: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
