"""DietCode on CUDA: build the measurement set here, measure it on a GPU, report here.

    python -m bench.cuda_tuning build DIR      # every micro-kernel of the GPU space, symbolic,
                                               # plus static builds of a sample, into one fatbin
    python3 bench/cuda_kernels.py DIR OUT      # on the GPU machine (no TVM there)
    python -m bench.cuda_tuning report OUT     # CSV + plot under docs/results/

The GPU is lent to few sessions and has no TVM, so the search cannot measure
candidates there as it goes. Instead every kernel of the (finite) space is
measured once at the benchmark's sequence lengths; the report then replays the
joint search against those measurements (a candidate's "measurement" is the
recorded one), so the search's pick can be compared with the best kernel of
the space and with cuBLAS, all from one GPU run.
"""

import argparse
import pathlib
import random

from tf_dietcode.tuning.cuda import build, limits, space
from tf_dietcode.tuning.workload import Workload

SEQUENCE_LENGTHS = (1, 5, 17, 24, 43, 62, 81, 100, 119, 128)
STATIC_SAMPLE = 8  # kernels per workload also built for each static shape (symbolic vs static)
WORKLOADS = {
    "dense_b16_[16T,768]x[2304,768]^T": (Workload("dense", (16, 2048), 2304, 768, bias=True), lambda t: {"m": 16 * t}),
    "dense_b1_[T,768]x[2304,768]^T": (Workload("dense", (1, 128), 2304, 768, bias=True), lambda t: {"m": t}),
    "bmm_nt_[192,T,64]x[192,T,64]^T": (Workload("batch_matmul", (1, 128), (1, 128), 64, b=192, ties=("m", "n")),
                                       lambda t: {"m": t, "n": t}),
    "bmm_nn_[192,T,T]x[192,T,64]": (Workload("batch_matmul", (1, 128), 64, (1, 128), b=192, transpose_b=False,
                                             ties=("m", "k")), lambda t: {"m": t, "k": t}),
}


def shapes(workload: Workload, sizes) -> list[dict]:
    """The dims at each sequence length, labelled with it."""
    return [{"t": t, **{d: getattr(workload, d).lo for d in "bmnk"}, **sizes(t)} for t in SEQUENCE_LENGTHS]


def build_set(directory: pathlib.Path, seed: int = 0) -> dict:
    gpu = limits.common(build.ARCHS)
    entries, shape_lists = [], {}
    for workload, sizes in WORKLOADS.values():
        kernels = space.space(gpu, workload)
        at = shapes(workload, sizes)
        statics = random.Random(seed).sample(kernels, STATIC_SAMPLE)
        entries.append((workload, [(k, None) for k in kernels] +
                        [(k, {d: s[d] for d in "bmnk"}) for k in statics for s in at]))
        shape_lists[workload.key()] = at
    return build.build(entries, shape_lists, directory, archs=("sm_90",), ptx=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("build").add_argument("directory", type=pathlib.Path)
    arguments = parser.parse_args()
    if arguments.command == "build":
        manifest = build_set(arguments.directory)
        print(sum(len(w["kernels"]) for w in manifest["workloads"]), "kernels in", arguments.directory)


if __name__ == "__main__":
    main()
