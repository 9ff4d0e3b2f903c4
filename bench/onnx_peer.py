"""ONNX Runtime as a peer: TF computations converted with tf2onnx, run on its CPU provider.

Conversion happens in a child process (tf2onnx rewrites TF's graph state, which
would disturb the TF peers timed in this one):

    python -m bench.onnx_peer OUT_DIR        # writes OUT_DIR/<workload>.onnx for bench.workloads

Sessions run with ONNX Runtime's default options, as its users run it. A kernel's
run binds its inputs once (io binding), so a timed call is ORT's own work plus its
per-call cost, which `call_overhead_seconds` measures with an Identity model so
callers can take it out, as the in-graph TF timing takes out Python's.
"""

import functools
import os
import pathlib
import re
import subprocess
import sys

import numpy as np

from bench import timing

def model_path(out_dir: pathlib.Path, workload_name: str) -> pathlib.Path:
    return out_dir / (re.sub(r"[^\w.-]+", "_", workload_name) + ".onnx")


def export_all(out_dir: pathlib.Path) -> None:
    """Every bench.workloads workload's TF form as <name>.onnx (fully dynamic dims), in a child process."""
    out_dir.mkdir(parents=True, exist_ok=True)
    _convert(["bench.onnx_peer", str(out_dir)])


def convert_saved_model(saved_model: pathlib.Path, path: pathlib.Path) -> None:
    """A SavedModel's serving signature as the ONNX model `path`, by tf2onnx in a child process."""
    _convert(["tf2onnx.convert", "--saved-model", str(saved_model), "--output", str(path), "--opset", "17"])
    _erfc_as_erf(path)


def _erfc_as_erf(path: pathlib.Path) -> None:
    """tf2onnx 1.17 writes TF's Erfc as an ONNX Erfc, an op ONNX does not have (ONNX Runtime refuses the
    model); Keras' exact GELU is 0.5 * x * erfc(-x / sqrt(2)). Each becomes 1 - Erf, in place."""
    import onnx
    from onnx import helper, numpy_helper

    model = onnx.load(str(path))
    if not any(node.op_type == "Erfc" and node.domain in ("", "ai.onnx") for node in model.graph.node):
        return
    one = "erfc_as_erf/one"
    model.graph.initializer.append(numpy_helper.from_array(np.array(1.0, np.float32), one))
    nodes = []
    for node in model.graph.node:
        if node.op_type == "Erfc" and node.domain in ("", "ai.onnx"):
            erf = f"{node.output[0]}/erf"
            nodes += [helper.make_node("Erf", list(node.input), [erf], name=f"{node.name}/Erf"),
                      helper.make_node("Sub", [one, erf], list(node.output), name=f"{node.name}/Sub")]
        else:
            nodes.append(node)
    model.graph.ClearField("node")
    model.graph.node.extend(nodes)
    onnx.checker.check_model(model)
    onnx.save(model, str(path))


def _convert(module_and_arguments: list[str]) -> None:
    """Runs a tf2onnx conversion as `python -m ...`, in a child process: tf2onnx rewrites TF's graph state.

    Its log is kept back unless it fails (a negative status is the signal that
    killed it: -9 is what the out-of-memory killer sends)."""
    child = subprocess.run([sys.executable, "-m", *module_and_arguments], capture_output=True, text=True,
                           env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    if child.returncode != 0:
        raise RuntimeError(f"python -m {' '.join(module_and_arguments)} exited with status {child.returncode}:\n"
                           f"{child.stderr[-3000:]}")


def session(model: pathlib.Path | bytes):
    """An ORT session on a model file (or its bytes) with ORT's default options, on its CPU provider
    (its threads: one per physical core, spinning after a run)."""
    import onnxruntime

    return onnxruntime.InferenceSession(model if isinstance(model, bytes) else str(model),
                                        providers=["CPUExecutionProvider"])


def bound_call(model, arrays: list[np.ndarray]):
    """A call of `model` on `arrays`, inputs bound once; returns the first output as numpy."""
    import onnxruntime

    binding = model.io_binding()
    for spec, array in zip(model.get_inputs(), arrays):
        binding.bind_ortvalue_input(spec.name, onnxruntime.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(array)))
    for spec in model.get_outputs():
        binding.bind_output(spec.name, "cpu")

    def call():
        model.run_with_iobinding(binding)
        return binding.get_outputs()[0].numpy()

    return call


def call_overhead_seconds(array: np.ndarray) -> float:
    """ORT's cost of one bound call doing nothing (an Identity model on `array`)."""
    return timing.repeated_call_seconds(bound_call(_identity_session(array.ndim), [array]))


@functools.cache
def _identity_session(rank: int):
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "identity",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None] * rank)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None] * rank)])
    return session(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString())


def _export(out_dir: pathlib.Path) -> None:
    import tensorflow as tf
    import tf2onnx

    from bench.workloads import WORKLOADS

    for workload in WORKLOADS:
        shapes = workload.shapes(1)
        signature = [tf.TensorSpec([None] * len(shape), tf.float32) for shape in shapes]
        tf2onnx.convert.from_function(tf.function(workload.tensorflow), input_signature=signature, opset=17,
                                      output_path=str(model_path(out_dir, workload.name)))


if __name__ == "__main__":
    _export(pathlib.Path(sys.argv[1]))
