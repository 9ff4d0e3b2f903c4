"""A SavedModel signature as one flat GraphDef, and back to a function.

Keras 3 exports put the whole model inside one StatefulPartitionedCall body,
and control flow keeps branches in functions; inlining every call (Grappler's
function optimizer, as TF's own freezing does) gives one graph in which
patterns are matched like any other. Variables are not frozen: they stay
captured resource handles, kept by the name of the placeholder that stands
for them, so the rewritten function captures the same variables again.
"""

import dataclasses

import tensorflow as tf
from tensorflow.python.eager import wrap_function
from tensorflow.python.framework import convert_to_constants


@dataclasses.dataclass
class SignatureGraph:
    key: str
    input_specs: dict[str, tf.TensorSpec]  # by input name, in the signature's flat order
    input_tensors: dict[str, str]          # input name -> tensor name in graph_def
    output_tensors: dict[str, str]         # output name -> tensor name in graph_def
    captures: dict[str, tf.Tensor]         # placeholder node name -> the tensor it stands for
    graph_def: tf.compat.v1.GraphDef

    def function(self) -> tf.types.experimental.ConcreteFunction:
        """graph_def as a function of the signature's inputs (in flat order), returning the outputs dict."""
        return wrap_function.function_from_graph_def(
            self.graph_def, list(self.input_tensors.values()), dict(self.output_tensors), self.captures)


def _tensor_name(tensor: tf.Tensor) -> str:
    return tensor.name if ":" in tensor.name else f"{tensor.name}:0"


def from_signature(key: str, function) -> SignatureGraph:
    """Inlines a loaded signature function into one GraphDef."""
    _, specs = function.structured_input_signature
    captured = {id(internal) for _, internal in function.graph.captures}
    user_inputs = [t for t in function.inputs if id(t) not in captured]
    names = sorted(specs)  # a signature's inputs are flattened in sorted key order
    output_names = sorted(function.structured_outputs)  # signatures return a dict
    if len(output_names) != len(function.outputs):
        raise ValueError(f"signature {key!r} returns composite tensors, which optimize() does not rewrite")
    graph_def = convert_to_constants._run_inline_graph_optimization(  # noqa: SLF001 (TF's own freezing uses it)
        function, lower_control_flow=False, aggressive_inlining=True)
    return SignatureGraph(
        key=key,
        input_specs={name: specs[name] for name in names},
        input_tensors={name: _tensor_name(t) for name, t in zip(names, user_inputs)},
        output_tensors={name: _tensor_name(t) for name, t in zip(output_names, function.outputs)},
        captures={internal.op.name: external for external, internal in function.graph.captures},
        graph_def=graph_def,
    )


def variables_of(root) -> dict[int, tf.Variable]:
    """Every variable reachable from a loaded SavedModel, by id of its handle."""
    return {id(v.handle): v for v in tf.train.TrackableView(root).descendants() if isinstance(v, tf.Variable)}
