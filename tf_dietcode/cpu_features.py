"""The CPU's SIMD features, to match compiled code with the machine that runs it.

The op library is compiled with -march=native, and tuned kernel bundles for
one CPU; running either on a CPU without those instructions would die with
SIGILL. Recording the features at build time lets the loader refuse instead.
Plain Python with no imports from tf_dietcode, so setup.py can load it alone.
"""

import pathlib

# Instruction-set flags (as /proc/cpuinfo spells them) that compilers emit code for.
SIMD_FLAGS = frozenset({
    "sse4_1", "sse4_2", "avx", "avx2", "fma", "f16c", "bmi1", "bmi2",
    "avx512f", "avx512dq", "avx512cd", "avx512bw", "avx512vl", "avx512_vnni",
    "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16", "amx_int8",
})


def simd_features(cpuinfo: pathlib.Path = pathlib.Path("/proc/cpuinfo")) -> list[str]:
    """The SIMD flags of this CPU, sorted; empty where /proc/cpuinfo is absent."""
    if not cpuinfo.exists():
        return []
    for line in cpuinfo.read_text().splitlines():
        if line.startswith("flags"):
            return sorted(SIMD_FLAGS & set(line.split(":", 1)[1].split()))
    return []


def missing_features(required: list[str], available: list[str]) -> list[str]:
    """Features compiled code needs that this CPU lacks."""
    return sorted(set(required) - set(available))
