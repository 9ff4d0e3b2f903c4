"""The machine's measured limits, so kernels read as a fraction of them.

    python -m bench.peak [--threads 2] [--out bench/results]

Three figures: an FMA loop (bench/fma_peak.c, built with the host's vector ISA;
the best of a few runs, as a peak is a maximum), TF's own large GEMM (2048^3,
in-graph, median), what a tuned library reaches on this machine, and the
read bandwidth from DRAM (bench/dram_read.c, best of a few runs), the limit of
a layer that reads its weights from DRAM once per call (small T). Beside the
FMA loop, the same loop of the bfloat16 and int8 dot products the reduced
precisions multiply with (fma_peak.c says which instructions), where this CPU
has them: the limit of those precisions at large T.
Writes peak.csv (measure, threads, value, unit).
"""

import argparse
import pathlib
import subprocess
import tempfile

from bench import report

HERE = pathlib.Path(__file__).parent
LARGE = 2048


def build(source: str, directory: pathlib.Path) -> pathlib.Path:
    """bench/<source>.c compiled for this host's vector ISA, as `directory`/<source>."""
    binary = directory / source
    subprocess.run(["gcc", "-O3", "-march=native", "-fopenmp", str(HERE / f"{source}.c"), "-o", str(binary)],
                   check=True)
    return binary


def build_fma_loop(directory: pathlib.Path) -> pathlib.Path:
    return build("fma_peak", directory)


# The dot-product loops of bench/fma_peak.c beyond float32 FMA: (its argument, measure, unit).
DOT_LOOPS = (("bf16", "bf16_dot_loop", "GFLOP/s"), ("int8", "int8_dot_loop", "GOP/s"))
NOT_ON_THIS_CPU = 2  # fma_peak's exit status for an instruction the CPU lacks


def run_measure(binary: pathlib.Path, threads: int, *arguments: str) -> float:
    """One run of a built measure, in its own process: the figure it prints."""
    return float(subprocess.run([str(binary), str(threads), *arguments], check=True, capture_output=True,
                                text=True).stdout)


def fma_loop_gflops(binary: pathlib.Path, threads: int) -> float:
    """One run of the built FMA loop (about 60 ms): GFLOP/s."""
    return run_measure(binary, threads)


def best_of(source: str, threads: int, runs: int, *arguments: str) -> float:
    """The best of `runs` runs of bench/<source>.c, a maximum as peaks are."""
    with tempfile.TemporaryDirectory() as scratch:
        binary = build(source, pathlib.Path(scratch))
        return max(run_measure(binary, threads, *arguments) for _ in range(runs))


def fma_peak_gflops(threads: int, runs: int = 5) -> float:
    return best_of("fma_peak", threads, runs)


def dot_loop_peaks(threads: int, runs: int = 5) -> list[tuple[str, float, str]]:
    """(measure, best of `runs`, unit) of each dot-product loop this CPU has."""
    found = []
    for argument, measure, unit in DOT_LOOPS:
        try:
            found.append((measure, best_of("fma_peak", threads, runs, argument), unit))
        except subprocess.CalledProcessError as error:
            if error.returncode != NOT_ON_THIS_CPU:
                raise
    return found


def dram_read_gbps(threads: int, runs: int = 3) -> float:
    """DRAM read bandwidth (GB/s) on `threads` threads: what a call reading its weights from DRAM
    can reach (bench.precision, bench.op_profile)."""
    return best_of("dram_read", threads, runs)


def large_sgemm_gflops(threads: int) -> float:
    import numpy as np
    import tensorflow as tf

    from bench import timing
    from bench.threads import use_threads

    use_threads(threads)
    a, b = (tf.constant(np.random.default_rng(i).standard_normal((LARGE, LARGE), dtype=np.float32)) for i in (0, 1))
    return 2.0 * LARGE**3 / timing.in_graph_seconds(tf.linalg.matmul, [a, b]) / 1e9


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path("bench/results"))
    args = parser.parse_args(argv)
    rows = [{"measure": "fma_loop", "threads": args.threads, "value": fma_peak_gflops(args.threads),
             "unit": "GFLOP/s"},
            {"measure": f"tensorflow_sgemm_{LARGE}", "threads": args.threads,
             "value": large_sgemm_gflops(args.threads), "unit": "GFLOP/s"},
            {"measure": "dram_read", "threads": args.threads, "value": dram_read_gbps(args.threads),
             "unit": "GB/s"}]
    rows[1:1] = [{"measure": measure, "threads": args.threads, "value": value, "unit": unit}
                 for measure, value, unit in dot_loop_peaks(args.threads)]
    args.out.mkdir(parents=True, exist_ok=True)
    report.write_csv(rows, args.out / "peak.csv")
    for row in rows:
        print(f"{row['measure']:>22s}, {row['threads']} thread(s): {row['value']:.0f} {row['unit']}")


if __name__ == "__main__":
    main()
