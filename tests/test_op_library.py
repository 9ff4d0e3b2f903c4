"""Loading the op library: once, with a clear message when the build does not fit."""

import json

import pytest
import tensorflow as tf

from tf_dietcode import cpu_features, op_library


def test_loads_once_and_registers_the_ops():
    assert op_library.load_op_library() is op_library.load_op_library()
    module = op_library.load_op_library()
    for wrapper in ("dietcode_fused_mat_mul", "dietcode_fused_batch_mat_mul_add",
                    "dietcode_fused_batch_mat_mul_transpose"):
        assert callable(getattr(module, wrapper))


def test_build_for_another_tensorflow_is_refused_by_name(tmp_path):
    info = tmp_path / "build_info.json"
    info.write_text(json.dumps({"tensorflow": "2.22.1", "cpu_features": []}))
    with pytest.raises(ImportError, match=r"built for TensorFlow 2\.22, found 2\.21\.\d+; install the TensorFlow it "
                                          r"was built for: `pip install 'tensorflow==2\.22\.\*'`"):
        op_library.check_build(info, tf_version="2.21.0")
    op_library.check_build(info, tf_version="2.22.0")


def test_build_for_a_cpu_with_more_instructions_is_refused_by_name(tmp_path):
    info = tmp_path / "build_info.json"
    info.write_text(json.dumps({"tensorflow": tf.__version__, "cpu_features": ["avx2", "avx512f", "fma"]}))
    with pytest.raises(ImportError, match="built for a CPU with avx512f, which this CPU lacks"):
        op_library.check_build(info, cpu=["avx", "avx2", "fma"])
    op_library.check_build(info, cpu=["avx2", "avx512bw", "avx512f", "fma"])


def test_missing_build_says_how_to_build(tmp_path):
    with pytest.raises(ImportError, match="not built .*pip install --no-build-isolation"):
        op_library.check_build(tmp_path / "build_info.json")


def test_installed_build_matches_this_tensorflow():
    op_library.check_build()
    assert json.loads(op_library.BUILD_INFO_PATH.read_text())["tensorflow"] == tf.__version__


def test_simd_features_read_from_cpuinfo(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu sse4_2 avx avx2 fma avx512f mmx\n")
    assert cpu_features.simd_features(cpuinfo) == ["avx", "avx2", "avx512f", "fma", "sse4_2"]
    assert cpu_features.simd_features(tmp_path / "absent") == []


def test_compiled_features_are_read_from_the_compilers_macros():
    macros = "#define __AVX2__ 1\n#define __FMA__ 1\n#define __AVX512F__ 1\n#define __x86_64__ 1\n"
    assert cpu_features.compiled_features(macros) == ["avx2", "avx512f", "fma"]


def test_cpuinfo_fields_are_the_first_processors(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nmodel name\t: CPU A\nflags\t\t: fpu avx\n\n"
                       "processor\t: 1\nmodel name\t: CPU B\nflags\t\t: fpu\n")
    assert cpu_features.cpuinfo_fields(cpuinfo)["model name"] == "CPU A"
    assert cpu_features.cpu_flags(cpuinfo) == {"fpu", "avx"}
    assert cpu_features.cpuinfo_fields(tmp_path / "absent") == {} and cpu_features.cpu_flags(tmp_path / "absent") == set()
