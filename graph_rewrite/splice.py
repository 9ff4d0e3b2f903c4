"""Splices the ops that replace matched patterns into a GraphDef, alike for every kind.

Each replacement (graph_rewrite.fusions) is written with TF's Python API in a scratch graph (so every
node is built and typed by TF itself), then spliced in: its placeholders are
bound to tensors of the graph it goes into, its other nodes renamed under a
unique prefix, and every reader of the pattern's i-th output reads the
replacement's node "out_<i>" instead. Nodes nothing reads any more are
pruned when the graph becomes a function again.
"""

from collections.abc import Callable

import tensorflow as tf

from tf_dietcode.graph_rewrite.analysis.graph_index import node_name, tensor_name

BUNDLE_PLACEHOLDER = "dietcode/bundle"


def scratch_graph(build: Callable[[], object]) -> tf.compat.v1.GraphDef:
    """What `build` writes with TF's Python API, as a GraphDef to splice."""
    graph = tf.Graph()
    with graph.as_default():
        build()
    return graph.as_graph_def()


def add_placeholder(graph_def: tf.compat.v1.GraphDef, name: str, dtype: tf.DType) -> None:
    node = graph_def.node.add(name=name, op="Placeholder")
    node.attr["dtype"].type = dtype.as_datatype_enum


def add_constant(graph_def: tf.compat.v1.GraphDef, name: str, value) -> None:
    """A Const node holding `value` (a string, an array), of the dtype TF gives it."""
    tensor = tf.make_tensor_proto(value)
    node = graph_def.node.add(name=name, op="Const")
    node.attr["dtype"].type = tensor.dtype
    node.attr["value"].tensor.CopyFrom(tensor)


def splice(graph_def: tf.compat.v1.GraphDef, replacement: tf.compat.v1.GraphDef, bound: dict[str, str | None],
           prefix: str, outputs: dict[str, str], replaced: dict[str, str]) -> dict[str, str]:
    """Adds `replacement` (its placeholders bound to tensors by name) and rewires the readers of
    each old output to the replacement's node `outputs[old output]`.

    `replaced` maps the outputs of patterns spliced before to their replacements
    (a bound tensor may be one) and gains this pattern's entries, which are returned.
    """
    bound = {name: replaced.get(tensor, tensor) for name, tensor in bound.items()}

    def rename(source: str) -> str:
        control = source.startswith("^")
        name = node_name(source)
        if name in bound:
            return ("^" + node_name(bound[name])) if control else bound[name]
        return ("^" if control else "") + f"{prefix}/{source.lstrip('^')}"

    for node in replacement.node:
        if node.name in bound:
            continue
        new = graph_def.node.add()
        new.CopyFrom(node)
        new.name = f"{prefix}/{node.name}"
        new.input[:] = [rename(i) for i in node.input]
    new_outputs = {tensor_name(old): f"{prefix}/{node}:0" for old, node in outputs.items()}
    for node in graph_def.node:
        if not node.name.startswith(prefix + "/"):
            node.input[:] = [new_outputs.get(tensor_name(i), i) for i in node.input]
    replaced.update(new_outputs)
    return new_outputs


def splice_matches(graph_def: tf.compat.v1.GraphDef, kinds: list, found: dict,
                   binding_for: Callable) -> tuple[list, dict]:
    """Every match of every kind (in `kinds`' order, each one's matches in theirs; found: kind
    name -> fusions.contract.Found) replaced by its kind's op, bound through `binding_for(match)`.
    Returns (kind, match, its replacement's outputs, its Dietcode ops) per match, and the map
    of replaced tensors (old -> new; follow it with `resolve`)."""
    replaced: dict[str, str] = {}
    spliced = []
    for kind in kinds:
        for i, match in enumerate(found[kind.name].matches):
            replacement = kind.replacement(match, binding_for(match))
            spliced.append((kind, match, replacement.outputs,
                            [n.op for n in replacement.graph_def.node if n.op.startswith("Dietcode")]))
            splice(graph_def, replacement.graph_def, replacement.bound, f"dietcode/{kind.name}_{i}",
                   {tensor: f"out_{j}" for j, tensor in enumerate(replacement.outputs)}, replaced)
    return spliced, replaced


def resolve(replaced: dict[str, str], tensor: str) -> str:
    """What reads `tensor` now that matches were spliced in (a replacement's output may be replaced in turn)."""
    seen = set()
    while tensor_name(tensor) in replaced and tensor not in seen:
        seen.add(tensor)
        tensor = replaced[tensor_name(tensor)]
    return tensor
