"""bench.peak's multiply-add loops (bench/fma_peak.c): each instruction's loop runs where the CPU has
the instruction and is refused, not run, where it lacks it (the int8 loop falls back to AVX2's
sequence where there is no VNNI and no AVX-512)."""

import subprocess

import pytest

from bench import peak
from tf_dietcode import cpu_features


def test_dot_loops_run_exactly_where_the_cpu_has_their_instructions():
    flags = cpu_features.cpu_flags()
    found = {measure: (value, unit) for measure, value, unit in peak.dot_loop_peaks(threads=1, runs=1)}
    assert ("bf16_dot_loop" in found) == ("avx512_bf16" in flags)
    assert ("int8_dot_loop" in found) == bool({"avx512_vnni", "avx_vnni"} & flags or "avx512f" not in flags)
    assert all(value > 0 for value, _ in found.values())
    assert found.get("int8_dot_loop", (0, "GOP/s"))[1] == "GOP/s"


def test_fma_loop_runs_and_an_unknown_instruction_is_refused(tmp_path):
    binary = peak.build_fma_loop(tmp_path)
    assert peak.run_measure(binary, 1) > 0
    with pytest.raises(subprocess.CalledProcessError) as refused:
        peak.run_measure(binary, 1, "fp64")
    assert refused.value.returncode == peak.NOT_ON_THIS_CPU
