"""Benchmark rows (dicts with workload, T, peer, speedup_vs_tensorflow, ...) to CSV and plots."""

import csv
import math
import pathlib
from collections import defaultdict


def _pyplot():
    """matplotlib's pyplot, headless; imported when a plot is drawn, so that the rows' helpers run where
    only the test requirements are installed (matplotlib is the [bench] extra's)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def write_csv(rows: list[dict], path: pathlib.Path) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def read(path: pathlib.Path) -> list[dict]:
    """Rows written by write_csv, numbers as numbers (T as int; a commit stays text, digits or not)."""
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    for row in rows:
        for key, value in row.items():
            if key == "commit":
                continue
            try:
                row[key] = float(value) if key != "T" else int(value)
            except ValueError:
                pass
    return rows


def geomean(values) -> float:
    values = list(values)
    return math.exp(sum(map(math.log, values)) / len(values))


def speedups(rows, peer: str) -> dict[str, list[tuple[int, float]]]:
    """workload -> [(T, speed-up over TF)] for one peer."""
    result = defaultdict(list)
    for row in rows:
        if row["peer"] == peer:
            result[row["workload"]].append((row["T"], row["speedup_vs_tensorflow"]))
    return result


def plot_by_t(rows, path: pathlib.Path, title: str, baseline: str = "TF",
              ratio: str = "speedup_vs_tensorflow") -> None:
    """Two panels per workload: each peer's latency (ms, log scale) and its speed-up over
    the baseline (TF, or cuBLAS for CUDA kernels; row key `ratio`), against T."""
    workloads = sorted({r["workload"] for r in rows})
    columns = min(3, len(workloads))
    grid_rows = -(-len(workloads) // columns)
    figure, axes = _pyplot().subplots(2 * grid_rows, columns, squeeze=False, figsize=(5 * columns, 5.6 * grid_rows),
                                layout="constrained")  # room for the suptitle, which tight_layout overlaps

    def panels(index: int):  # a workload's latency panel and, below it, its speed-up panel
        return axes[2 * (index // columns), index % columns], axes[2 * (index // columns) + 1, index % columns]

    for index, workload in enumerate(workloads):
        latency, speedup = panels(index)
        for peer in sorted({r["peer"] for r in rows if r["workload"] == workload}):
            points = sorted((r["T"], r["ms"], r[ratio]) for r in rows
                            if r["workload"] == workload and r["peer"] == peer)
            ts, ms, ratios = zip(*points)
            latency.plot(ts, ms, marker="o", label=peer)
            speedup.plot(ts, ratios, marker="o", label=peer)
        latency.set_yscale("log")
        latency.set_title(workload, fontsize=9)
        latency.set_ylabel("ms per call")
        latency.legend(fontsize=7)
        speedup.axhline(1.0, color="grey", linewidth=0.8)
        speedup.set_xlabel("T")
        speedup.set_ylabel(f"speed-up vs {baseline}")
    for index in range(len(workloads), grid_rows * columns):
        for axis in panels(index):
            axis.remove()
    save(figure, path, title)


def save(figure, path: pathlib.Path, title: str | None = None) -> None:
    """Every benchmark's PNG: titled, 110 dpi, the figure closed (a long run draws many)."""
    if title is not None:
        figure.suptitle(title)
    figure.savefig(path, dpi=110)
    _pyplot().close(figure)


def tuning_seconds_bars(seconds: dict[str, float], path: pathlib.Path, title: str) -> None:
    """One bar per tuning method (log scale, labelled), for a cost that spans seconds to hours."""
    figure, axis = _pyplot().subplots(figsize=(7, 3.6))
    bars = axis.bar(list(seconds), list(seconds.values()), color=[f"C{i}" for i in range(len(seconds))])
    axis.bar_label(bars, labels=[_duration(v) for v in seconds.values()], fontsize=8)
    axis.set_yscale("log")
    axis.set_ylabel("tuning wall time (s)")
    axis.tick_params(axis="x", labelsize=7)
    axis.set_title(title, fontsize=9)
    figure.tight_layout()
    save(figure, path)


def _duration(seconds: float) -> str:
    return f"{seconds / 3600:.1f} h" if seconds >= 3600 else f"{seconds / 60:.1f} min" if seconds >= 120 \
        else f"{seconds:.0f} s"
