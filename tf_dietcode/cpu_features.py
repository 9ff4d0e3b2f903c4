"""The CPU's SIMD features, to match compiled code with the machine that runs it.

The op library is compiled with -march=native, and tuned kernel bundles for
one CPU; running either on a CPU without those instructions would die with
SIGILL. Recording the features at build time lets the loader refuse instead.
The one reader of /proc/cpuinfo in Python (setup.py, the loader, the tuner's
hardware limits, the benchmark report); the op library reads it in C++
(kernel_bundle.cc) to check a bundle where no Python runs. Plain Python with
no imports from tf_dietcode, so setup.py can load it alone.
"""

import pathlib

CPUINFO = pathlib.Path("/proc/cpuinfo")

# Instruction-set flags (as /proc/cpuinfo spells them) that compilers emit code for.
SIMD_FLAGS = frozenset({
    "sse4_1", "sse4_2", "avx", "avx2", "fma", "f16c", "bmi1", "bmi2",
    "avx512f", "avx512dq", "avx512cd", "avx512bw", "avx512vl", "avx512_vnni",
    "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16", "amx_int8",
})


def cpuinfo_fields(cpuinfo: pathlib.Path = CPUINFO) -> dict[str, str]:
    """The first processor's fields ("model name", "flags", ...); empty where /proc/cpuinfo is absent."""
    if not cpuinfo.exists():
        return {}
    fields: dict[str, str] = {}
    for line in cpuinfo.read_text().splitlines():
        key, colon, value = line.partition(":")
        if colon:
            fields.setdefault(key.strip(), value.strip())
    return fields


def cpu_flags(cpuinfo: pathlib.Path = CPUINFO) -> set[str]:
    """Every feature flag of this CPU, as /proc/cpuinfo spells them."""
    return set(cpuinfo_fields(cpuinfo).get("flags", "").split())


def simd_features(cpuinfo: pathlib.Path = CPUINFO) -> list[str]:
    """The SIMD flags of this CPU, sorted; empty where /proc/cpuinfo is absent."""
    return sorted(SIMD_FLAGS & cpu_flags(cpuinfo))


def missing_features(required: list[str], available: list[str]) -> list[str]:
    """Features compiled code needs that this CPU lacks."""
    return sorted(set(required) - set(available))
