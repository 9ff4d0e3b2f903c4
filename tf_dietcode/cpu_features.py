"""The CPU's SIMD features, to match compiled code with the machine that runs it.

The op library is compiled for a baseline instruction set (x86-64-v3), and
tuned kernel bundles for one CPU; running either on a CPU without those
instructions would die with SIGILL. Recording the features at build time (for
the library: those its compiler flags enable) lets the loader refuse instead.
The one reader of /proc/cpuinfo in Python (setup.py, the loader, the tuner's
hardware limits, the benchmark report); the op library reads it in C++
(kernel_bundle.cc) to check a bundle where no Python runs. Plain Python with
no imports from tf_dietcode, so setup.py can load it alone.
"""

import pathlib

CPUINFO = pathlib.Path("/proc/cpuinfo")

# Instruction-set flags (as /proc/cpuinfo spells them) that compilers emit code for, by the
# macro g++ and clang predefine when their target has it (`-march=...`).
COMPILER_MACROS = {
    "__SSE4_1__": "sse4_1", "__SSE4_2__": "sse4_2", "__AVX__": "avx", "__AVX2__": "avx2", "__FMA__": "fma",
    "__F16C__": "f16c", "__BMI__": "bmi1", "__BMI2__": "bmi2",
    "__AVX512F__": "avx512f", "__AVX512DQ__": "avx512dq", "__AVX512CD__": "avx512cd", "__AVX512BW__": "avx512bw",
    "__AVX512VL__": "avx512vl", "__AVX512VNNI__": "avx512_vnni", "__AVX512BF16__": "avx512_bf16",
    "__AVX512FP16__": "avx512_fp16", "__AMX_TILE__": "amx_tile", "__AMX_BF16__": "amx_bf16", "__AMX_INT8__": "amx_int8",
}
SIMD_FLAGS = frozenset(COMPILER_MACROS.values())


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


def compiled_features(predefined_macros: str) -> list[str]:
    """The SIMD flags that code compiled with these predefined macros (the output of
    `g++ FLAGS -dM -E -x c++ /dev/null`) may use, sorted: what a CPU needs to run it."""
    defined = {line.split()[1] for line in predefined_macros.splitlines() if line.startswith("#define ")}
    return sorted(flag for macro, flag in COMPILER_MACROS.items() if macro in defined)
