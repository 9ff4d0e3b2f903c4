"""Which kernel of a tuned bundle a call ran, for tests that exercise tuned kernels."""

from tf_dietcode import ops
from tf_dietcode.tuning.templates import dense


def weight_operand(report, w, workload_index=0):
    """w[N, K] in the dense workload's weight layout, and the op's packed_n."""
    return dense.weight_operand(w, report.manifest["workloads"][workload_index]["weight_layout"])


def calls(path):
    """Calls so far: per (workload, kernel) and generic."""
    stats = ops.bundle_stats(str(path))
    assert stats["problem"] == ""
    counts = {(w, k): c for w, entry in enumerate(stats["workloads"]) for k, c in enumerate(entry["calls"])}
    return counts, stats["generic_calls"]


def kernel_used(path, run):
    """Runs `run()` and returns the (workload, kernel) it used, or "generic"."""
    before, generic_before = calls(path)
    result = run()
    after, generic_after = calls(path)
    changed = [key for key in after if after[key] != before[key]]
    assert len(changed) + (generic_after - generic_before) == 1, (changed, generic_after - generic_before)
    return result, changed[0] if changed else "generic"


def expected_kernel(report, workload_index, dims):
    dispatch = report.dispatches[workload_index]
    full = {"b": 1, **dims}
    index = dispatch.kernel_index(full)
    return "generic" if index < 0 else (workload_index, index)
