"""Benchmark rows (dicts with workload, T, peer, speedup_vs_tensorflow, ...) to CSV and plots."""

import csv
import math
import pathlib
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def write_csv(rows: list[dict], path: pathlib.Path) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def read(path: pathlib.Path) -> list[dict]:
    """Rows written by write_csv, numbers as numbers (T as int)."""
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    for row in rows:
        for key, value in row.items():
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


def speedup_by_t(rows, path: pathlib.Path, title: str) -> None:
    """One panel per workload: each peer's speed-up over TF against T."""
    workloads = sorted({r["workload"] for r in rows})
    columns = min(3, len(workloads))
    figure, axes = plt.subplots(-(-len(workloads) // columns), columns, squeeze=False,
                                figsize=(5 * columns, 3.2 * -(-len(workloads) // columns)))
    for axis, workload in zip(axes.flat, workloads):
        for peer in sorted({r["peer"] for r in rows if r["workload"] == workload}):
            points = sorted((r["T"], r["speedup_vs_tensorflow"]) for r in rows
                            if r["workload"] == workload and r["peer"] == peer)
            axis.plot(*zip(*points), marker="o", label=peer)
        axis.axhline(1.0, color="grey", linewidth=0.8)
        axis.set_title(workload, fontsize=9)
        axis.set_xlabel("T")
        axis.set_ylabel("speed-up vs TF")
        axis.legend(fontsize=7)
    for axis in list(axes.flat)[len(workloads):]:
        axis.remove()
    figure.suptitle(title)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
