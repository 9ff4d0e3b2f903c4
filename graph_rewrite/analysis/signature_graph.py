"""A SavedModel signature as one flat GraphDef, and back to a function.

Keras 3 exports put the whole model inside one StatefulPartitionedCall body,
and control flow keeps branches in functions; inlining every call (Grappler's
function optimizer, as TF's own freezing does) gives one graph in which
patterns are matched like any other. Variables are not frozen: they stay
captured resource handles, kept by the name of the placeholder that stands
for them, so the rewritten function captures the same variables again.
Also here: what of the loaded model the output must keep for its graphs to
run (resources, assets, a TF1 model's initializer), and which calls the
inlining left as functions.
"""

import collections
import contextlib
import dataclasses

import numpy as np
import tensorflow as tf
from tensorflow.python.eager import wrap_function
from tensorflow.python.framework import convert_to_constants
from tensorflow.python.trackable import resource


@dataclasses.dataclass
class SignatureGraph:
    key: str
    input_specs: dict[str, tf.TensorSpec]  # by input name, in the signature's flat order
    input_tensors: dict[str, str]          # input name -> tensor name in graph_def
    output_tensors: dict[str, str]         # output name -> tensor name in graph_def
    captures: dict[str, tf.Tensor]         # placeholder node name -> the tensor it stands for
    graph_def: tf.compat.v1.GraphDef

    def read_captures(self) -> "SignatureGraph":
        """The same graph capturing only what its outputs read: a rewrite leaves the variables of
        the layers it replaced unread, and a function would still capture (and a SavedModel keep)
        them. Reads whose values nothing uses are dropped from the control dependencies that
        inlining gave them (the function's outputs wait on all its stateful ops): a read orders nothing."""
        nodes = {node.name: node for node in self.graph_def.node}

        def followed(tensor: str) -> bool:
            return not tensor.startswith("^") or nodes.get(tensor[1:], None) is None or \
                nodes[tensor[1:]].op != "ReadVariableOp"

        reached, pending = set(), [name.split(":")[0] for name in self.output_tensors.values()]
        while pending:
            name = pending.pop()
            if name not in reached and name in nodes:
                reached.add(name)
                pending += [tensor.lstrip("^").split(":")[0] for tensor in nodes[name].input if followed(tensor)]
        graph_def = tf.compat.v1.GraphDef()
        graph_def.CopyFrom(self.graph_def)
        for node in graph_def.node:
            if node.name in reached:
                kept = [tensor for tensor in node.input if followed(tensor) or tensor[1:] in reached]
                del node.input[:]
                node.input.extend(kept)
        return dataclasses.replace(self, graph_def=graph_def,
                                   captures={name: t for name, t in self.captures.items() if name in reached})

    def function(self) -> tf.types.experimental.ConcreteFunction:
        """graph_def as a function of the signature's inputs (in flat order), returning the outputs dict."""
        return wrap_function.function_from_graph_def(
            self.graph_def, list(self.input_tensors.values()), dict(self.output_tensors), self.captures)


@dataclasses.dataclass(frozen=True)
class CallLeftRunning:
    """A node whose functions the inlining left (a loop, a cond, a function XLA compiles)."""
    node: str
    op: str
    xla: bool                                       # whether XLA compiles it (jit_compile=True)
    ops: dict[str, dict[str, int]]                  # function -> op -> count, for the functions running any


def calls_left_running(graph_def: tf.compat.v1.GraphDef, ops: set[str],
                       replaced: set[tuple[str, str]] = frozenset()) -> list[CallLeftRunning]:
    """The nodes whose functions the inlining left (control flow's bodies, functions XLA
    compiles) that run any of `ops`, at any depth (a loop in a loop), with the functions that run
    them; nodes in `replaced` ((function, node): fused ops replace them) do not count. Reads
    graph_def only (a proto map's [] would add the attrs it looks up)."""
    library = {f.signature.name: f for f in graph_def.library.function}

    def called(node) -> list[str]:
        names = [node.op] if node.op in library else []
        for value in node.attr.values():
            names += [value.func.name] if value.HasField("func") else []
            names += [f.name for f in value.list.func]
        return names

    def visit(name: str, found: dict[str, dict[str, int]], seen: set[str]) -> None:
        if name in seen or name not in library:
            return
        seen.add(name)
        counts = collections.Counter(n.op for n in library[name].node_def
                                     if n.op in ops and (name, n.name) not in replaced)
        if counts:
            found[name] = dict(sorted(counts.items()))
        for n in library[name].node_def:
            for function in called(n):
                visit(function, found, seen)

    calls = []
    for node in graph_def.node:
        found, seen = {}, set()
        for function in called(node):
            visit(function, found, seen)
        if found:
            xla = "_XlaMustCompile" in node.attr and node.attr["_XlaMustCompile"].b
            calls.append(CallLeftRunning(node.name, node.op, xla, found))
    return calls


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
    with _collections_hidden(function.graph):
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


@contextlib.contextmanager
def _collections_hidden(graph: tf.Graph):
    """The graph without its collections for a while. A signature of a TF1 SavedModel keeps its
    model's: their table initializers are not in the signature's pruned graph, and Grappler
    refuses a graph whose initializers it cannot find (TF2 functions have none)."""
    collections = {key: graph.get_collection(key) for key in graph.get_all_collection_keys()}
    for key in collections:
        graph.clear_collection(key)
    try:
        yield
    finally:
        for key, values in collections.items():
            graph.get_collection_ref(key).extend(values)


def resources_of(root) -> dict[int, tf.Variable | tf.saved_model.experimental.TrackableResource]:
    """Every variable and other resource (a lookup table, ...) reachable from a loaded SavedModel,
    by id of its handle: the rewritten signatures capture the same ones, so the output tracks them."""
    found = {}
    for obj in tf.train.TrackableView(root).descendants():
        if isinstance(obj, tf.Variable):
            found[id(obj.handle)] = obj
        elif isinstance(obj, tf.saved_model.experimental.TrackableResource):
            found[id(obj.resource_handle)] = obj
    return found


def assets_of(root) -> list[tf.saved_model.Asset]:
    """Every asset of a loaded SavedModel: files its functions read (a vocabulary, a kernel bundle
    of a model optimized before), which the output must carry. All of them, not only those whose
    paths the signatures capture: a file may be found beside another (a bundle's library beside
    its manifest), and an asset left untracked would be saved as its path where it is now."""
    return [obj for obj in tf.train.TrackableView(root).descendants() if isinstance(obj, tf.saved_model.Asset)]


def tf1_initializer(root) -> resource.CapturableResource | None:
    """A TF1 SavedModel's initialization (its init op: tables read from vocabulary files, ...) as
    TF's loader restores it; saved again, it runs when the optimized model loads."""
    initializer = getattr(root, "initializer", None)
    return initializer if isinstance(initializer, resource.CapturableResource) else None


def captured_values(graph: SignatureGraph, resources: dict) -> dict[str, np.ndarray]:
    """Placeholder -> the value of the variable it captures (resources: resources_of's)."""
    return {name: resources[id(t)].numpy() for name, t in graph.captures.items()
            if isinstance(resources.get(id(t)), tf.Variable)}
