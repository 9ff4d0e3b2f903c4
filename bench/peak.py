"""The machine's measured float32 peaks (GFLOP/s), so kernels read as a fraction of them; and its
DRAM read bandwidth (bench/dram_read.c), which bounds calls that stream their weights from DRAM
(bench.precision).

    python -m bench.peak [--threads 2] [--out bench/results]

Two figures: an FMA loop (bench/fma_peak.c, built with the host's vector ISA;
the best of a few runs, as a peak is a maximum) and TF's own large GEMM
(2048^3, in-graph, median), what a tuned library reaches on this machine.
Writes peak.csv.
"""

import argparse
import pathlib
import subprocess
import tempfile

from bench import report

SOURCE = pathlib.Path(__file__).with_name("fma_peak.c")
DRAM_SOURCE = pathlib.Path(__file__).with_name("dram_read.c")
LARGE = 2048


def build_native(source: pathlib.Path, directory: pathlib.Path) -> pathlib.Path:
    """A C loop compiled for this host's vector ISA with OpenMP, as `directory`/<its name>."""
    binary = directory / source.stem
    subprocess.run(["gcc", "-O3", "-march=native", "-fopenmp", str(source), "-o", str(binary)], check=True)
    return binary


def build_fma_loop(directory: pathlib.Path) -> pathlib.Path:
    """The FMA loop compiled for this host's vector ISA, as `directory`/fma_peak."""
    return build_native(SOURCE, directory)


def fma_loop_gflops(binary: pathlib.Path, threads: int) -> float:
    """One run of the built FMA loop (about 60 ms), in its own process: GFLOP/s."""
    return float(subprocess.run([str(binary), str(threads)], check=True, capture_output=True, text=True).stdout)


def fma_peak_gflops(threads: int, runs: int = 5) -> float:
    with tempfile.TemporaryDirectory() as scratch:
        binary = build_fma_loop(pathlib.Path(scratch))
        return max(fma_loop_gflops(binary, threads) for _ in range(runs))


def large_sgemm_gflops(threads: int) -> float:
    import numpy as np
    import tensorflow as tf

    from bench import timing
    from bench.threads import use_threads

    use_threads(threads)
    a, b = (tf.constant(np.random.default_rng(i).standard_normal((LARGE, LARGE), dtype=np.float32)) for i in (0, 1))
    return 2.0 * LARGE**3 / timing.in_graph_seconds(tf.linalg.matmul, [a, b]) / 1e9


def dram_read_gbps(threads: int, runs: int = 3) -> float:
    """The best of a few runs of bench/dram_read.c (each the best of its passes over 512 MiB): GB/s
    that a call reading its weights from DRAM can reach."""
    with tempfile.TemporaryDirectory() as scratch:
        binary = build_native(DRAM_SOURCE, pathlib.Path(scratch))
        return max(float(subprocess.run([str(binary), str(threads)], check=True, capture_output=True,
                                        text=True).stdout) for _ in range(runs))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path("bench/results"))
    args = parser.parse_args(argv)
    rows = [{"measure": "fma_loop", "threads": args.threads, "gflops": fma_peak_gflops(args.threads)},
            {"measure": f"tensorflow_sgemm_{LARGE}", "threads": args.threads,
             "gflops": large_sgemm_gflops(args.threads)}]
    args.out.mkdir(parents=True, exist_ok=True)
    report.write_csv(rows, args.out / "peak.csv")
    for row in rows:
        print(f"{row['measure']:>22s}, {row['threads']} thread(s): {row['gflops']:.0f} GFLOP/s")


if __name__ == "__main__":
    main()
