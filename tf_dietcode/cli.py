"""The `tf-dietcode` command line (also `python -m tf_dietcode`).

    tf-dietcode --version
    tf-dietcode tune --m 1:128 --n 2304 --k 768 --bias --activation gelu --out BUNDLE_DIR
    tf-dietcode tune --spec workloads.json --out BUNDLE_DIR [--quick] [--trials 64] [--db tuning.jsonl]
    tf-dietcode optimize --dir IN --output_dir OUT [--tag_set serve] [--signature_def KEY ...]
                         [--shape_range input_ids=1,1:128 ...] [--example inputs.npz ...]
                         [--precision {float32,bfloat16,int8}] [--max_error X]
                         [--quick] [--trials N] [--db F] [--overwrite] [--no_validate] [--report_json F]

`tune` searches micro-kernels for each workload's whole range, writes a checked
kernel bundle and prints which micro-kernel serves which M. `optimize` runs
tf_dietcode.optimize() on a SavedModel and prints its summary; a shape range
gives each dim of one input as a size or LO:HI, comma separated (an integer
scalar input's values as LO:HI or one VALUE: `--shape_range max_len=1:64`). Examples
(representative inputs, each an .npz of one array per input, by name; text as
str arrays) stand for optimize()'s input_fn. Without --db, both read and extend
the user's tuning database ($TF_DIETCODE_CACHE, else ~/.cache/tf_dietcode).
"""

import argparse
import dataclasses
import json
import logging
import pathlib
import sys
import time


def _range(text: str) -> tuple[int, int]:
    """'LO:HI' or 'SIZE' -> (lo, hi); ValueError on anything else."""
    lo, _, hi = text.partition(":")
    return int(lo), int(hi or lo)


def _parsed(flag: str, text: str, parse, form: str):
    """parse(text), or a ValueError naming the flag, what it got and the form it wants."""
    try:
        return parse(text)
    except (ValueError, TypeError, KeyError) as error:
        raise ValueError(f"{flag} {text!r}: expected {form} ({error})") from None


def _workloads(args):
    from tf_dietcode.tuning.workload import Workload

    if args.spec:
        form = "a JSON list of workloads, each an object of tuning.Workload's fields"
        return _parsed("--spec", args.spec, lambda path: [Workload(**fields) for fields in
                                                          json.loads(pathlib.Path(path).read_text())], form)
    if None in (args.m, args.n, args.k):
        raise ValueError("give --spec FILE, or --m LO:HI with --n and --k")
    return [Workload("dense", _parsed("--m", args.m, _range, "LO:HI, e.g. --m 1:128"), args.n, args.k,
                     bias=args.bias, activation=args.activation, cold_weight=args.cold_weight)]


def _database(args):
    """--db's database, else the user's."""
    from tf_dietcode import user_cache
    from tf_dietcode.tuning.database import Database

    return Database(args.db) if args.db else user_cache.tuning_database()


def _tune(args) -> int:
    from tf_dietcode.tuning.tune import tune

    workloads = _workloads(args)
    started = time.perf_counter()
    report = tune(workloads, args.out, options=_budget(args), database=_database(args))
    print(f"tuned {len(workloads)} workload(s) in {time.perf_counter() - started:.0f} s; bundle: {args.out}")
    for dispatch in report.dispatches:
        _print_dispatch(dispatch)
    return 0


def _shape_ranges(texts: list[str]) -> dict:
    """['input_ids=1,1:128'] -> {'input_ids': [1, (1, 128)]} (a scalar's ['max_len=1:64'] -> [(1, 64)]:
    shape_ranges reads one item for a scalar as the range of its values)."""
    form = "NAME=DIM,DIM,... (a size or LO:HI each), e.g. --shape_range input_ids=1,1:128"

    def dims(text: str) -> tuple[str, list]:
        name, sep, dims = text.partition("=")
        if not sep or not name or not dims:
            raise ValueError("no NAME=")
        return name, [_range(d) if ":" in d else int(d) for d in dims.split(",")]

    return dict(_parsed("--shape_range", text, dims, form) for text in texts)


def _input_fn(paths: list[str]):
    """--example files as optimize()'s input_fn, or None."""
    if not paths:
        return None
    import numpy as np

    examples = []
    for path in paths:
        try:
            with np.load(path, allow_pickle=False) as arrays:
                examples.append(dict(arrays))
        except (ValueError, TypeError) as error:  # a pickle, an .npy (no context manager), not numpy's
            raise ValueError(f"--example {path}: not an .npz of plain arrays, one per input by name (text "
                             f"as str arrays) ({error})") from None
    return lambda: iter(examples)


def _budget(args):
    from tf_dietcode.tuning import search

    budget = search.QUICK if args.quick else search.SearchOptions()
    return dataclasses.replace(budget, trials=args.trials or budget.trials, seed=args.seed)


def _optimize(args) -> int:
    import tf_dietcode

    report = tf_dietcode.optimize(args.dir, args.output_dir, tags=args.tag_set.split(","),
                                  signature_keys=args.signature_def, shape_ranges=_shape_ranges(args.shape_range),
                                  input_fn=_input_fn(args.example), tuning=_budget(args), database=_database(args),
                                  horizontal_fusion=args.horizontal_fusion,
                                  layer_norm_fusion=not args.no_layer_norm_fusion, overwrite=args.overwrite,
                                  validate=args.validate, precision=args.precision, max_error=args.max_error)
    print(report.summary())
    if args.report_json:
        pathlib.Path(args.report_json).write_text(report.to_json())
    if not report.fused:
        print("tf-dietcode optimize: no pattern could be fused; the output runs like the input", file=sys.stderr)
        return 1
    return 0


def _print_dispatch(dispatch) -> None:
    """Which micro-kernel serves which sizes of the (first) shape variable."""
    workload = dispatch.workload
    print(f"\n{workload.describe()}")
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


def _version() -> str:
    """The package's version and what its op library was built for (read without importing TensorFlow)."""
    from tf_dietcode import __version__, op_library

    built = op_library.build_info()
    if built is None:
        return f"tf-dietcode {__version__} (op library not built)"
    return (f"tf-dietcode {__version__} (op library built for TensorFlow {built['tensorflow']}, TVM {built['tvm']}, "
            f"CPU features {' '.join(built['cpu_features']) or 'none'})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tf-dietcode", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=_version())
    commands = parser.add_subparsers(dest="command", required=True)
    tune = commands.add_parser("tune", help="tune workloads for their shape ranges and write a kernel bundle")
    tune.add_argument("--spec", help="JSON file: a list of workloads (fields of tuning.Workload)")
    tune.add_argument("--m", help="dense rows range LO:HI (the dynamic dim)")
    tune.add_argument("--n", type=int, help="dense output features")
    tune.add_argument("--k", type=int, help="dense input features")
    tune.add_argument("--bias", action="store_true")
    tune.add_argument("--activation", default="none")
    tune.add_argument("--cold_weight", action="store_true",
                      help="time kernels with the weight flushed from the caches, as a model whose weights "
                           "outgrow the last-level cache reads it")
    tune.add_argument("--out", required=True, type=pathlib.Path, help="bundle directory to write")
    optimize = commands.add_parser("optimize", help="optimize a SavedModel (tf_dietcode.optimize)")
    optimize.add_argument("--dir", required=True, help="input SavedModel directory (never modified)")
    optimize.add_argument("--output_dir", required=True, help="output SavedModel directory")
    optimize.add_argument("--tag_set", default="serve", help="comma-separated tags of the MetaGraph to load")
    optimize.add_argument("--signature_def", action="append", help="signature to optimize (default: all)")
    optimize.add_argument("--shape_range", action="append", default=[],
                          help="NAME=DIM,DIM,...: an input's dims, each a size or LO:HI; for an integer "
                               "scalar input (a loop's max_len) the range of its values, NAME=LO:HI or NAME=VALUE")
    optimize.add_argument("--example", action="append", default=[],
                          help="an .npz of one representative input per signature input, by name (as input_fn "
                               "of optimize(): their shapes set the ranges, and layers whose dims follow the "
                               "inputs' values, such as words split from text, are sized on them)")
    optimize.add_argument("--overwrite", action="store_true", help="replace an existing output directory")
    optimize.add_argument("--horizontal_fusion", action="store_true",
                          help="merge dense layers that read the same input (Q/K/V) into one GEMM")
    optimize.add_argument("--no_horizontal_fusion", dest="horizontal_fusion", action="store_false",
                          help="keep them separate GEMMs (the default)")
    optimize.add_argument("--no_layer_norm_fusion", action="store_true",
                          help="keep layer norms as TF's ops instead of one DietcodeLayerNorm each")
    optimize.add_argument("--precision", default="float32",
                          help="what dense layers compute in: float32 (tuned kernels, the default), bfloat16 or "
                               "int8 (weights converted once, kernels the op chooses)")
    optimize.add_argument("--max_error", type=float,
                          help="bound on each output's largest row error relative to its largest row norm "
                               "(default: the precision's); in bfloat16 or int8, layers go back to float32 until "
                               "it holds")
    optimize.add_argument("--no_validate", dest="validate", action="store_false",
                          help="write the model without running it against the original first (no bound is "
                               "enforced)")
    optimize.add_argument("--report_json", help="also write the report as JSON (Report.to_json) to this file")
    for command in (tune, optimize):
        command.add_argument("--quick", action="store_true", help="small search budget (demos, tests)")
        command.add_argument("--trials", type=int, help="micro-kernels to measure per workload")
        command.add_argument("--seed", type=int, default=0)
        command.add_argument("--db", help="tuning database (JSON lines), reused and extended (default: the "
                                          "user's, in $TF_DIETCODE_CACHE or ~/.cache/tf_dietcode)")
    args = parser.parse_args(argv)
    _log_to_stderr()
    try:
        return _tune(args) if args.command == "tune" else _optimize(args)
    except (ValueError, TypeError, OSError, RuntimeError) as error:  # OSError: FileExistsError too
        print(f"tf-dietcode {args.command}: {error}", file=sys.stderr)
        return 2


def _log_to_stderr() -> None:
    """tf_dietcode's log messages (what is not progress: steps, the output check) on stderr, once."""
    logger = logging.getLogger("tf_dietcode")
    if not logger.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("tf-dietcode: %(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)


if __name__ == "__main__":
    sys.exit(main())
