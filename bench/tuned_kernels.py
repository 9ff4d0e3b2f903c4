"""DietCode-tuned micro-kernels against TF, and symbolic vs static AOT.

    python -m bench.tuned_kernels [--quick] [--workloads PREFIX ...] [--out bench/results]

Tunes each workload once for T in [1, 128] (tuning database <out>/tuning.jsonl,
resumed: the CSV says whether the tuning times started from empty databases),
then at each T times TF's op in-graph (MatMul+BiasAdd, BatchMatMulV2), the
bundle's dispatched kernel (TVM's time_evaluator: no Python in the loop),
the same micro-kernel compiled for that static shape and the largest-shape
baseline's kernel, each loaded from a library (the last two from <out>/static
and <out>/largest_shape_w*.so), all four in interleaved rounds (bench.timing.round_samples),
with a run of the FMA loop (bench.peak) in each round too.
Times are medians over the rounds; symbolic over static is the median of the
rounds' ratios (bench.timing.paired_ratio). Each peer's speed is given as a fraction of the
FMA peak measured once before tuning (the best of 5 runs, `fraction_of_fma_peak`)
and, paired, of the FMA loop run in the same rounds (`fraction_of_fma_loop_in_rounds`):
a shared machine's speed drifts by several percent over the half hour between the two,
which the first carries and the second cancels. Writes tuned_kernels.csv and
tuned_kernels.png; prints tuning time and speed-ups.
The Nimble-like baseline (tune the largest shape only, use its best kernel for
every T) runs beside it with the same budget. --workloads keeps the workloads
whose names start with one of the prefixes (e.g. bmm_nt), to measure again
after a change to one template.
"""

import json
import os
import pathlib
import time
from collections.abc import Callable

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import tvm  # noqa: E402

from bench import baselines, cli, peak, report, timing, workloads  # noqa: E402
from bench.threads import use_threads, use_tvm_threads  # noqa: E402
from tf_dietcode.tuning import bundle, hardware, measure, search, templates  # noqa: E402
from tf_dietcode.tuning.database import Database  # noqa: E402
from tf_dietcode.tuning.dispatch import build_dispatch  # noqa: E402
from tf_dietcode.tuning.runner import LocalRunner  # noqa: E402
from tf_dietcode.tuning.workload import Workload  # noqa: E402


def _dense_case(batch: int, n: int, k: int):
    """Dense [batch*T, k] x [n, k]^T + bias, tuned for T in [1, 128]."""
    return (workloads.dense_name(batch, n, k), Workload("dense", (batch, 128 * batch), n, k, bias=True),
            lambda t: (batch * t,), _tf_dense)


def _tf_dense(operands: dict) -> tuple:
    """TF's peer of a dense kernel, the weight stored [K, N] (bench.workloads.tf_dense says why)."""
    return workloads.tf_dense, [tf.constant(operands["x"]), tf.constant(np.ascontiguousarray(operands["w"].T)),
                                tf.constant(operands["bias"])]


def _tf_batch_matmul(adjoint_b: bool):
    """TF's peer of a batch-matmul kernel: BatchMatMulV2 on the kernel's own operands."""
    return lambda operands: ((lambda x, y, alpha: tf.linalg.matmul(x, y, adjoint_b=adjoint_b)),
                             [tf.constant(v) for v in operands.values()])


# (name, workload, shape variables at sequence length T, TF's peer: operands -> (computation, its inputs))
CASES = [
    _dense_case(16, 2304, 768),
    _dense_case(1, 2304, 768),
    # BERT-base's other dense layers at batch 16: attention output, FFN in and out.
    _dense_case(16, 768, 768),
    _dense_case(16, 3072, 768),
    _dense_case(16, 768, 3072),
    (workloads.BMM_NT, Workload("batch_matmul", (1, 128), (1, 128), 64, b=192, ties=("m", "n")),
     lambda t: (t,), _tf_batch_matmul(adjoint_b=True)),
    (workloads.BMM_NN,
     Workload("batch_matmul", (1, 128), 64, (1, 128), b=192, transpose_b=False, ties=("m", "k")),
     lambda t: (t,), _tf_batch_matmul(adjoint_b=False)),
]


# The quick run: DietCode's four workloads (the BERT dense shapes only in the full run).
QUICK_CASES = [case for case in CASES if case[0] in (workloads.dense_name(16, 2304, 768),
                                                      workloads.dense_name(1, 2304, 768),
                                                      workloads.BMM_NT, workloads.BMM_NN)]


def read_bundle_manifest(directory: pathlib.Path) -> dict:
    """The manifest of the bundle this benchmark writes (other benchmarks time it)."""
    path = directory / bundle.MANIFEST
    if not path.exists():
        raise SystemExit(f"no bundle at {directory}: run `python -m bench.tuned_kernels` first")
    return json.loads(path.read_text())


def exported(executable, path: pathlib.Path):
    """The compiled kernel written to a shared library and loaded from it, as the bundle's kernels are.
    Timed JIT-compiled instead, NN's 1.5 us kernels at T = 1 ran 1.5-2% faster than the same code
    loaded from a library (symbolic and static builds alike; 2-core Zen 3), which would count against
    the symbolic kernel's AOT ratio."""
    executable.export_library(str(path))
    return tvm.runtime.load_module(str(path))


def tf_timer(tf_peer, operands: dict) -> Callable[[], float]:
    """One sample of TF's peer on the operands, timed in-graph over at least timing.ROUND_SECONDS.

    Timed in the kernels' rounds: a shared machine has slow patches of seconds (TF read 60 ms for
    dense batch 16 at T = 119 in one run, 30 ms in the runs around it), which landed on one
    side of a ratio alone while TF was timed apart from the kernels (before them, while TVM's
    pool threads spun after every kernel for ~170 ms: bench.threads.use_tvm_threads)."""
    return timing.in_graph_timer(*tf_peer(operands))


def peak_speedups(rows: list[dict], workload: str) -> list[float]:
    """Per T, the speed-up over TF of a kernel running at the measured FMA peak: no kernel
    can beat it, so a bar above its geometric mean cannot be met on this machine."""
    return [1 / r["fraction_of_fma_peak"] for r in rows if r["peer"] == "tensorflow" and r["workload"] == workload]


def main(argv=None):
    parser = cli.parser(__doc__, "bench/results", "a few T and the quick search budget")
    parser.add_argument("--workloads", nargs="+", metavar="PREFIX", help="only workloads named so (default: all)")
    args = parser.parse_args(argv)
    use_threads()
    use_tvm_threads()
    args.out.mkdir(parents=True, exist_ok=True)
    sequence_lengths = cli.sequence_lengths(args.quick)
    options = cli.search_options(args.quick)
    hw = hardware.detect()
    rng = np.random.default_rng(0)
    peak_gflops = peak.fma_peak_gflops(hw.cores)
    fma_loop = peak.build_fma_loop(args.out)
    cases = [case for case in (QUICK_CASES if args.quick else CASES)
             if not args.workloads or case[0].startswith(tuple(args.workloads))]
    if not cases:
        parser.error(f"no workload starts with {' or '.join(args.workloads)}")

    tuning_seconds, results, dispatches = {}, [], []
    database_paths = (args.out / "tuning.jsonl", args.out / "tuning_largest_shape.jsonl")
    from_empty_databases = not any(path.exists() for path in database_paths)  # else the tuning times resumed
    database = Database(database_paths[0])
    for name, workload, _, _ in cases:  # one by one, to time each workload's search and dispatch
        started = time.perf_counter()
        results.append(search.search(workload, hw, LocalRunner(hw), options, database))
        dispatches.append(build_dispatch(results[-1]))
        tuning_seconds[name] = time.perf_counter() - started
    bundle.build_bundle(dispatches, hw, args.out / "bundle", [r.sample_shapes for r in results], options.seed)
    largest_database = Database(database_paths[1])
    largest = {}
    for w_index, (name, workload, _, _) in enumerate(cases):
        started = time.perf_counter()
        _, dispatch = baselines.largest_shape(workload, hw, LocalRunner(hw), options, largest_database)
        executable = measure.compile_kernel(workload, dispatch.kernels[0], hw)
        seconds = time.perf_counter() - started
        largest[name] = (dispatch.kernels[0], exported(executable, args.out / f"largest_shape_w{w_index}.so"), seconds)
    module = tvm.runtime.load_module(str(args.out / "bundle" / bundle.LIBRARY))

    jobs = []
    for w_index, (name, workload, shape_at, tf_peer) in enumerate(cases):
        template = templates.for_workload(workload)
        for t in sequence_lengths:
            dims = workload.dims_at(shape_at(t))
            operands = template.random_operands(workload, dims, rng)
            if "alpha" in operands:
                operands["alpha"] = 1.0  # plain products: TF's peer is its BatchMatMul alone
            jobs.append((w_index, name, workload, template, t, dims, tf_peer, operands))
    def static_build(job):  # the dispatched kernel compiled for the job's shape
        w_index, _, workload, _, t, dims, _, _ = job
        return exported(measure.compile_kernel(
            workload, dispatches[w_index].kernels[dispatches[w_index].kernel_index(dims)], hw, dims),
            args.out / "static" / f"w{w_index}_T{t}.so")

    (args.out / "static").mkdir(exist_ok=True)
    static_builds = measure.in_threads(static_build, jobs, hw.cores, strict=True)  # all before any timing
    timed = []
    for (w_index, name, workload, template, t, dims, tf_peer, operands), static_module in zip(jobs, static_builds):
        dispatch = dispatches[w_index]
        index = dispatch.kernel_index(dims)
        kernel = dispatch.kernels[index]
        arguments = template.kernel_arguments(operands, workload, kernel)
        largest_kernel, largest_module, _ = largest[name]
        samples = timing.round_samples(
            tf_timer(tf_peer, operands),
            timing.tvm_timer(module, bundle.kernel_symbol(w_index, index), arguments),
            timing.tvm_timer(static_module, "main", arguments),
            timing.tvm_timer(largest_module, "main", template.kernel_arguments(operands, workload, largest_kernel)),
            lambda: 1 / peak.fma_loop_gflops(fma_loop, hw.cores))  # seconds per GFLOP at the loop's rate
        fractions = [workload.flops(dims) / 1e9 * timing.paired_ratio(samples[4], peer) for peer in samples[:4]]
        timed.append((kernel, largest_kernel, np.median(samples[:4], axis=1),
                      timing.paired_ratio(samples[1], samples[2]), fractions))

    rows = []
    for (_, name, workload, _, t, dims, _, _), (kernel, largest_kernel, (tf_time, symbolic, static, largest_time),
                                               symbolic_over_static, fractions) in zip(jobs, timed, strict=True):
        for peer, seconds, used, in_rounds in (("tensorflow", tf_time, kernel, fractions[0]),
                                               ("dietcode", symbolic, kernel, fractions[1]),
                                               ("dietcode_static", static, kernel, fractions[2]),
                                               ("largest_shape", largest_time, largest_kernel, fractions[3])):
            rows.append({"workload": name, "T": t, "peer": peer, "kernel": used.name, "ms": seconds * 1e3,
                         "gflops": workload.flops(dims) / seconds / 1e9,
                         "fraction_of_fma_peak": workload.flops(dims) / seconds / 1e9 / peak_gflops,
                         "fraction_of_fma_loop_in_rounds": in_rounds,
                         "speedup_vs_tensorflow": tf_time / seconds, "symbolic_over_static": symbolic_over_static,
                         "tuning_seconds": largest[name][2] if peer == "largest_shape" else tuning_seconds[name],
                         "trials": options.trials, "from_empty_databases": from_empty_databases})

    csv_path = args.out / "tuned_kernels.csv"
    report.write_csv(rows, csv_path)
    report.plot_by_t(rows, args.out / "tuned_kernels.png",
                     title=f"Tuned micro-kernels vs TF {tf.__version__} ({hw.mcpu}, {hw.cores} threads)")

    print(f"\n{'workload':34s} {'T':>4s} {'kernel':>20s} {'TF ms':>8s} {'tuned ms':>9s} {'speed-up':>9s} "
          f"{'sym/static':>10s}")
    for row in rows:
        if row["peer"] == "dietcode":
            print(f"{row['workload']:34s} {row['T']:4d} {row['kernel']:>20s} "
                  f"{row['ms'] * row['speedup_vs_tensorflow']:8.3f} {row['ms']:9.3f} "
                  f"{row['speedup_vs_tensorflow']:8.2f}x {row['symbolic_over_static']:10.3f}")
    print()
    for name, *_ in cases:
        mine = [r for r in rows if r["peer"] == "dietcode" and r["workload"] == name]
        speedups = [r["speedup_vs_tensorflow"] for r in mine]
        print(f"{name:34s} speed-up over TF: geomean {report.geomean(speedups):.2f}x, "
              f"worst {min(speedups):.2f}x; symbolic/static worst {max(r['symbolic_over_static'] for r in mine):.3f}; "
              f"tuning {tuning_seconds[name]:.0f} s ({options.trials} micro-kernels)")
        theirs = [r["speedup_vs_tensorflow"] for r in rows if r["peer"] == "largest_shape" and r["workload"] == name]
        print(f"{'':34s} largest-shape baseline: geomean {report.geomean(theirs):.2f}x, "
              f"worst {min(theirs):.2f}x; tuning {largest[name][2]:.0f} s")
        print(f"{'':34s} a kernel at the FMA peak at every T: geomean {report.geomean(peak_speedups(rows, name)):.2f}x")
    large = [r for r in rows if r["peer"] == "dietcode" and r["workload"].startswith("dense_b16") and r["T"] >= 62]
    if large:
        peak_share, in_rounds = ([r[key] for r in large] for key in ("fraction_of_fma_peak",
                                                                      "fraction_of_fma_loop_in_rounds"))
        print(f"measured FMA peak {peak_gflops:.0f} GFLOP/s ({hw.cores} threads); dense batch 16 at T >= 62 "
              f"reaches {min(peak_share):.0%}-{max(peak_share):.0%} of it, "
              f"{min(in_rounds):.0%}-{max(in_rounds):.0%} of the FMA loop run in its rounds")
    print(f"wrote {csv_path}")


if __name__ == "__main__":
    main()
