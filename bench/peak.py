"""The machine's measured float32 FMA peak (GFLOP/s), so kernels read as a fraction of it.

    python -m bench.peak [--threads 2]

Compiles bench/fma_peak.c with the host's vector ISA and reports the best of a
few runs (a peak, so the maximum, not the median).
"""

import argparse
import pathlib
import subprocess
import tempfile

SOURCE = pathlib.Path(__file__).with_name("fma_peak.c")


def fma_peak_gflops(threads: int, runs: int = 5) -> float:
    with tempfile.TemporaryDirectory() as scratch:
        binary = pathlib.Path(scratch) / "fma_peak"
        subprocess.run(["gcc", "-O3", "-march=native", "-fopenmp", str(SOURCE), "-o", str(binary)], check=True)
        return max(float(subprocess.run([str(binary), str(threads)], check=True, capture_output=True,
                                        text=True).stdout) for _ in range(runs))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    print(f"FMA peak, {args.threads} thread(s): {fma_peak_gflops(args.threads):.0f} GFLOP/s")


if __name__ == "__main__":
    main()
