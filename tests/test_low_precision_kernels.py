"""The reduced-precision kernels hold the instructions they are written for, read from the built op
library's disassembly: the AMX tiles (compiled everywhere, run by the op tests only where the CPU has AMX)
and the AVX-512 ones; the AVX2 tiles use no AVX-512 register."""

import re
import shutil
import subprocess

import pytest

from tf_dietcode import op_library

# Kernel family (a name in its functions' symbols) -> instructions each must hold.
FAMILIES = {
    "AmxTile<true": {"ldtilecfg", "tilezero", "tileloadd", "tdpbssd", "tilestored", "tilerelease"},
    "AmxTile<false": {"ldtilecfg", "tilezero", "tileloadd", "tdpbf16ps", "tilestored", "tilerelease"},
    "Avx512VnniInt8": {"vpdpbusd"},
    "Avx512Bf16": {"vdpbf16ps"},
    "Avx2Int8": {"vpsignb", "vpmaddubsw", "vpmaddwd"},
    "Avx2Bf16": {"vpslld", "vfmadd231ps"},
}


@pytest.fixture(scope="module")
def functions() -> dict[str, str]:
    """The op library's functions (demangled names) and their disassembly."""
    if shutil.which("objdump") is None:
        pytest.skip("objdump (binutils) is not installed")
    text = subprocess.run(["objdump", "-d", "--no-show-raw-insn", "-C", str(op_library.LIBRARY_PATH)],
                          check=True, capture_output=True, text=True).stdout
    parts = re.split(r"^[0-9a-f]+ <(.*)>:$", text, flags=re.MULTILINE)
    return dict(zip(parts[1::2], parts[2::2]))


def family_code(functions, family):
    code = "".join(body for name, body in functions.items() if family in name)
    assert code, f"no function of {family} in {op_library.LIBRARY_PATH}"
    return code


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_kernels_hold_their_instructions(functions, family):
    mnemonics = set(re.findall(r"^\s+[0-9a-f]+:\s+(\S+)", family_code(functions, family), flags=re.MULTILINE))
    assert FAMILIES[family] <= mnemonics, FAMILIES[family] - mnemonics


@pytest.mark.parametrize("family", ["Avx2Int8", "Avx2Bf16"])
def test_avx2_kernels_need_no_avx512(functions, family):
    assert "%zmm" not in family_code(functions, family)
