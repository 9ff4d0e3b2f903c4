"""ops/op_contract.json is the one definition of what the op library and Python agree
on: the op library compiles in its activations and bundle format, Python reads the
same file as package data, and every Python table keyed by activation covers it."""

import json
import pathlib
import subprocess
import sys

import numpy as np
from tensorflow.python.framework import op_def_registry
from tvm import te

from tf_dietcode import keras as diet_keras
from tf_dietcode import op_contract, op_library, ops, reference
from tf_dietcode.graph_rewrite.fusions import activation_patterns, dense_patterns
from tf_dietcode.tuning.templates import activation, dense
from tf_dietcode.tuning.workload import Workload

REPO = pathlib.Path(__file__).resolve().parents[1]
CONTRACT = json.loads((REPO / "ops" / "op_contract.json").read_text())


def test_python_reads_the_contract_in_ops():
    assert op_contract.ACTIVATIONS == tuple(CONTRACT["activations"]) and op_contract.ACTIVATIONS[0] == "none"
    assert op_contract.BUNDLE_FORMAT == CONTRACT["bundle_format"]
    layout = CONTRACT["low_precision_layout"]
    assert (op_contract.LOW_PRECISION_BLOCK_COLUMNS, op_contract.LOW_PRECISION_GROUP_BYTES) == \
        (layout["block_columns"], layout["group_bytes"])


def test_the_contract_ships_as_package_data(tmp_path):
    """A normal install copies it into the package (the editable one reads it through the link)."""
    subprocess.run([sys.executable, "setup.py", "-q", "build_py", "--build-lib", str(tmp_path)], cwd=REPO,
                   check=True, capture_output=True)
    shipped = tmp_path / "tf_dietcode" / "op_contract.json"
    assert not shipped.is_symlink() and json.loads(shipped.read_text()) == CONTRACT


def test_the_op_library_registers_the_contract_activations():
    op_library.load_op_library()
    op_def = op_def_registry.get("DietcodeFusedMatMul")
    attr = next(a for a in op_def.attr if a.name == "activation")
    assert tuple(s.decode() for s in attr.allowed_values.list.s) == op_contract.ACTIVATIONS
    assert attr.default_value.s.decode() == "none"


def test_the_op_library_reads_the_contract_bundle_format(tmp_path):
    """A manifest of the contract's format passes the format check (and fails the next); one after it does not."""
    problems = []
    for format_ in (op_contract.BUNDLE_FORMAT, op_contract.BUNDLE_FORMAT + 1):
        (tmp_path / str(format_)).mkdir()
        (tmp_path / str(format_) / "manifest.json").write_text(json.dumps({"format": format_}))
        problems.append(ops.bundle_stats(str(tmp_path / str(format_)))["problem"])
    assert problems == ["manifest lacks 'target'", f"manifest format {op_contract.BUNDLE_FORMAT + 1}, "
                                                   f"this library reads format {op_contract.BUNDLE_FORMAT}"]


def test_every_implementation_covers_the_contract_activations(rng):
    """TF's reference and the tuner's numpy check agree on each activation (to 1e-6: their float64
    GELUs differ in the ninth digit), and the TE epilogue knows it."""
    assert tuple(reference.ACTIVATIONS) == op_contract.ACTIVATIONS
    x, w, bias = rng.standard_normal((3, 5)), rng.standard_normal((4, 5)), rng.standard_normal(4)
    placeholder = te.placeholder((4,), "float32")
    for name in op_contract.ACTIVATIONS:
        activation.apply(name, placeholder[0])  # raises for an activation it does not know
        expected = reference.fused_matmul(x, w, bias, transpose_b=True, activation=name).numpy()
        actual = dense.reference_output({"x": x, "w": w, "bias": bias},
                                        Workload("dense", 3, 4, 5, bias=True, activation=name))
        np.testing.assert_allclose(actual, expected, rtol=1e-6, atol=1e-6)


def test_recognised_activations_are_the_contract_ones():
    """What the graph rewriter and DietDense fuse, the op computes."""
    recognised = {*dense_patterns.SIMPLE_ACTIVATIONS.values(), *(name for name, _ in activation_patterns.PATTERNS),
                  *diet_keras._FUSED_ACTIVATIONS.values()}
    assert recognised <= set(op_contract.ACTIVATIONS)
