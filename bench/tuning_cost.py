"""Tuning cost: one DietCode run for a whole range against per-shape MetaSchedule
(Ansor-like) at the same trials per shape, with the largest-shape (Nimble-like)
baseline beside them.

    python -m bench.tuning_cost [--workload dense_b16] [--trials 64] [--quick] [--out bench/results]

DietCode measures each of its `trials` micro-kernels at every sample shape, so
MetaSchedule gets `trials` trials per shape. Shapes: T in {5,24,43,62,81,100,
119,128} (T=62 and the quick budget with --quick). Writes tuning_cost.csv: per
method and T the kernel time (TVM time_evaluator) and the method's tuning wall
time. MetaSchedule's one-time start-up (parsing its tensor intrinsics) is paid
before its clock starts: it is per process, not per shape.
"""

import dataclasses
import os
import tempfile
import time

os.environ.setdefault("TVM_NUM_THREADS", "2")
os.environ.setdefault("TVM_BIND_THREADS", "0")

import numpy as np  # noqa: E402
import tvm  # noqa: E402

# Before TensorFlow (bench.tuned_kernels imports it): MetaSchedule's tensor intrinsics are TVMScript
# parsed at import, with inspect.stack() per function, which walks every loaded module: measured 26 s
# alone, 73 s once TensorFlow's modules are loaded (and 115 s under a profiler).
import tvm.s_tir.tensor_intrin  # noqa: E402,F401

from bench import cli, report  # noqa: E402
from bench.tuned_kernels import CASES  # noqa: E402
from tf_dietcode.tuning import baselines, hardware, measure, search, templates  # noqa: E402
from tf_dietcode.tuning.database import Database  # noqa: E402
from tf_dietcode.tuning.dispatch import build_dispatch  # noqa: E402
from tf_dietcode.tuning.runner import LocalRunner  # noqa: E402

SAMPLED_T = (5, 24, 43, 62, 81, 100, 119, 128)
QUICK_SAMPLED_T = (62,)


def seconds_per_call(module, arguments):
    timer = module.time_evaluator("main", tvm.cpu(), number=1, repeat=7, min_repeat_ms=30)
    return float(np.median(timer(*arguments).results))


def main(argv=None):
    parser = cli.parser(__doc__, "bench/results", "the quick budget and T=62 only")
    parser.add_argument("--workload", default="dense_b16", help="prefix of a bench.tuned_kernels case name")
    parser.add_argument("--trials", type=int, default=None, help="64, or the quick budget's with --quick")
    args = parser.parse_args(argv)
    sampled_t = QUICK_SAMPLED_T if args.quick else SAMPLED_T
    budget = cli.search_options(args.quick)
    options = dataclasses.replace(budget, trials=args.trials or budget.trials)
    name, workload, shape_at, _ = next(c for c in CASES if c[0].startswith(args.workload))
    hw = hardware.detect()
    template = templates.for_workload(workload)
    rng = np.random.default_rng(0)
    dims_at = {t: workload.dims_at(shape_at(t)) for t in sampled_t}
    operands = {t: template.random_operands(workload, dims, rng) for t, dims in dims_at.items()}
    rows = []

    def record(method, t, seconds, tuning_seconds, kernel):
        rows.append({"workload": name, "method": method, "T": t, "ms": seconds * 1e3,
                     "gflops": workload.flops(dims_at[t]) / seconds / 1e9, "tuning_seconds": tuning_seconds,
                     "kernel": kernel})

    started = time.perf_counter()  # DietCode: one search for the whole range, fresh database
    result = search.search(workload, hw, LocalRunner(hw), options, Database())
    dispatch = build_dispatch(result)
    dietcode_seconds = time.perf_counter() - started
    executables = {}
    for t, dims in dims_at.items():
        kernel = dispatch.kernels[dispatch.kernel_index(dims)]
        executables.setdefault(kernel, measure.compile_kernel(workload, kernel, hw))
        record("dietcode", t, seconds_per_call(executables[kernel].mod,
                                               template.kernel_arguments(operands[t], workload, kernel)),
               dietcode_seconds, kernel.name)

    started = time.perf_counter()
    _, largest = baselines.largest_shape(workload, hw, LocalRunner(hw), options, Database())
    largest_seconds = time.perf_counter() - started
    kernel = largest.kernels[0]
    executable = measure.compile_kernel(workload, kernel, hw)
    for t in sampled_t:
        record("largest_shape", t, seconds_per_call(executable.mod, template.kernel_arguments(
            operands[t], workload, kernel)), largest_seconds, kernel.name)

    for t, dims in dims_at.items():
        with tempfile.TemporaryDirectory() as work_dir:
            try:
                executable, tuning = baselines.per_shape_metaschedule(workload, hw, dims, options.trials, work_dir)
            except baselines.MetaScheduleFailed as failure:  # a row saying so, not a lost suite run
                print(failure)
                record("metaschedule_per_shape", t, float("nan"), failure.seconds, "failed")
                continue
        record("metaschedule_per_shape", t, seconds_per_call(executable.mod,
                                                             baselines.plain_arguments(operands[t], workload, dims)),
               tuning, "")

    args.out.mkdir(parents=True, exist_ok=True)
    report.write_csv(rows, args.out / "tuning_cost.csv")
    ms_total = sum(r["tuning_seconds"] for r in rows if r["method"] == "metaschedule_per_shape")
    print(f"\n{name}, {options.trials} trials per shape, T in {sampled_t}")
    print(f"tuning wall time: DietCode {dietcode_seconds:.0f} s for all of T in [1,128]; "
          f"MetaSchedule {ms_total:.0f} s for these {len(sampled_t)} shapes "
          f"(DietCode/MetaSchedule = {dietcode_seconds / ms_total:.2f}; projected to all 128 T: "
          f"{ms_total / len(sampled_t) * 128 / 3600:.1f} h); largest-shape {largest_seconds:.0f} s")
    print(f"{'T':>4s} {'DietCode ms':>12s} {'MetaSchedule ms':>16s} {'largest-shape ms':>17s} {'DietCode vs MS':>15s}")
    for t in sampled_t:
        ms_of = {r["method"]: r["ms"] for r in rows if r["T"] == t}
        print(f"{t:4d} {ms_of['dietcode']:12.3f} {ms_of['metaschedule_per_shape']:16.3f} "
              f"{ms_of['largest_shape']:17.3f} {ms_of['metaschedule_per_shape'] / ms_of['dietcode']:14.2f}x")
    print(f"wrote {args.out / 'tuning_cost.csv'}")


if __name__ == "__main__":
    main()
