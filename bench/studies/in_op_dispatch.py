"""The fused ops running a bundle's tuned kernels, against the same kernels
called directly: the cost of going through TF, dispatch included.

    python -m bench.studies.in_op_dispatch [--bundle bench/results/bundle] [--threads 2] [--quick]

Uses the bundle `python -m bench.tuned_kernels` writes (its workloads in the
cases of bench.tuned_kernels.CASES it holds). At each T, times the op in-graph
(bench.timing) and the kernel the bundle's tree picks for that shape
through TVM's time_evaluator (no Python, no TF), both on --threads threads, in
ROUNDS pairs of one ~50 ms sample each: the ratios and overheads are medians of
each pair's.
The in-graph loop has a cost of its own (the loop step and an identity per
input), measured with one IdentityN of the inputs in place of the op; the
op's overhead is op - kernel - that loop cost.

The kernels called directly take their workspace from the ops' arena too
(the ops point the loaded library at it), but run their parallel loops on
TVM's pool, whose threads spin, where the ops use TF's pool, whose threads
sleep between ops: with one thread the overhead is dispatch and call alone,
with two it includes waking a pool thread. Writes
in_op_dispatch_threads<N>.csv.
"""

import ctypes
import os
import pathlib
from collections.abc import Callable

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import tvm  # noqa: E402

from bench import cli, report, timing  # noqa: E402
from bench.threads import use_threads, use_tvm_threads  # noqa: E402
from bench.tuned_kernels import CASES, read_bundle_manifest  # noqa: E402
from tf_dietcode import ops  # noqa: E402
from tf_dietcode.tuning import bundle, templates  # noqa: E402
from tf_dietcode.tuning.micro_kernel import MicroKernel  # noqa: E402
from tf_dietcode.tuning.templates import dense  # noqa: E402
from tf_dietcode.tuning.workload import DIMS, Workload  # noqa: E402

ROUNDS = 21  # pairs of an op and a kernel sample, so the machine's drift (tens of % within seconds) hits both
SAMPLE_SECONDS = 0.05


def op_call(workload: Workload, entry: dict, path: str, operands: dict[str, np.ndarray]):
    """The fused op computing the workload with the bundle, and its inputs."""
    if workload.kind == "dense":
        weight, packed_n = dense.weight_operand(operands["w"], entry["weight_layout"])
        inputs = [tf.constant(operands["x"]), tf.constant(weight), tf.constant(operands["bias"])]
        return (lambda x, w, b: ops.fused_matmul(x, w, b, activation=workload.activation, packed_n=packed_n,
                                                 bundle=path)), inputs
    inputs = [tf.constant(operands["x"]), tf.constant(operands["y"])]
    return (lambda x, y: ops.fused_batch_matmul_transpose(x, y, [0, 1, 2, 3], adj_y=workload.transpose_b,
                                                          alpha=operands["alpha"], bundle=path)), inputs


def paired_medians(op_sample: Callable[[], float], kernel_sample: Callable[[], float],
                   loop_seconds: float) -> tuple[float, float, float, float]:
    """ROUNDS pairs of one op sample and one kernel sample (~50 ms each, bench.timing.alternating_pairs):
    the medians of the pairs' (op - loop) / kernel and op - loop - kernel, and of the op's and kernel's
    samples."""
    op_seconds, kernel_seconds = timing.alternating_pairs(op_sample, kernel_sample, ROUNDS)
    return tuple(float(np.median(x)) for x in ((op_seconds - loop_seconds) / kernel_seconds,
                                                op_seconds - loop_seconds - kernel_seconds, op_seconds, kernel_seconds))


def main(argv=None):
    parser = cli.parser(__doc__, "bench/results", "a few T")
    parser.add_argument("--bundle", type=pathlib.Path, default=pathlib.Path("bench/results/bundle"))
    parser.add_argument("--threads", type=int, default=2, help="TF intra-op threads and TVM's pool size")
    args = parser.parse_args(argv)
    manifest = read_bundle_manifest(args.bundle)
    use_threads(args.threads)
    use_tvm_threads(args.threads)
    library = ctypes.CDLL(str(args.bundle / bundle.LIBRARY))
    module = tvm.runtime.load_module(str(args.bundle / bundle.LIBRARY))
    rng = np.random.default_rng(0)
    path = str(args.bundle)

    jobs = []
    cases = {workload.key(): (name, shape_at) for name, workload, shape_at, _ in CASES}
    for entry in manifest["workloads"]:
        workload = Workload.from_key(entry["key"])
        name, shape_at = cases[entry["key"]]
        dispatch = getattr(library, entry["dispatch"])
        dispatch.restype, dispatch.argtypes = ctypes.c_int64, [ctypes.c_int64] * len(DIMS)
        for t in cli.sequence_lengths(args.quick):
            dims = workload.dims_at(shape_at(t))
            kernel_entry = entry["kernels"][dispatch(*(dims[d] for d in DIMS))]
            jobs.append((name, t, workload, entry, kernel_entry,
                         templates.for_workload(workload).random_operands(workload, dims, rng)))
    rows = []
    for name, t, workload, entry, kernel_entry, operands in jobs:
        compute, inputs = op_call(workload, entry, path, operands)
        op_timer = timing.in_graph_timer(compute, inputs, SAMPLE_SECONDS)
        loop_seconds = timing.in_graph_seconds(lambda *xs: tf.identity_n(xs)[0], inputs, repeats=9)
        kernel = MicroKernel(**kernel_entry["params"])
        kernel_timer = timing.tvm_timer(module, kernel_entry["symbol"],
                                 templates.for_workload(workload).kernel_arguments(operands, workload, kernel),
                                 SAMPLE_SECONDS)
        ratio, overhead, op_seconds, kernel_seconds = paired_medians(op_timer, kernel_timer, loop_seconds)
        rows.append({"workload": name, "T": t, "threads": args.threads, "kernel": kernel_entry["name"],
                     "op_us": op_seconds * 1e6, "loop_us": loop_seconds * 1e6,
                     "kernel_us": kernel_seconds * 1e6, "overhead_us": overhead * 1e6,
                     "op_over_kernel": ratio, "rounds": ROUNDS})
        print(f"{name:34s} T={t:4d} {kernel_entry['name']:>20s} op {rows[-1]['op_us']:9.1f} us  "
              f"loop {loop_seconds * 1e6:5.1f} us  kernel {rows[-1]['kernel_us']:9.1f} us  "
              f"overhead {overhead * 1e6:7.1f} us  (op - loop) / kernel {ratio:.3f}", flush=True)
    stats = ops.bundle_stats(path)
    if stats["generic_calls"]:
        raise SystemExit(f"{stats['generic_calls']} op calls ran the generic kernel: the bundle did not cover them")
    args.out.mkdir(parents=True, exist_ok=True)
    csv = args.out / f"in_op_dispatch_threads{args.threads}.csv"
    report.write_csv(rows, csv)
    print(f"wrote {csv}")


if __name__ == "__main__":
    main()
