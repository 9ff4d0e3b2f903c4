"""Loop-invariant products computed once before the loop instead of at every iteration.

TensorFlow's Transformer tutorial decodes by re-running the decoder on the
prefix inside the loop, and its cross-attention projects the encoder's output
(the same every step) to keys and values at every step: in a Transformer-base
decoder at source length 64 that is a fifth of each step's FLOPs. A value of a
loop body is invariant when it follows only from the loop-carried values the
body passes through unchanged, constants, and reads of variables nothing in the
body writes. Each invariant tensor that a varying node reads, and whose
computation holds a product, is computed in the graph that runs the loop (a
copy of its nodes there, the body's arguments bound to the loop's inputs) and
threaded into the body as a loop-carried value (graph_rewrite.bodies), so the
fusion kinds then find and size those products as any other of the signature.
Loops directly in the signature's graph only (a loop in a loop keeps its body).
"""

import dataclasses

import numpy as np
import tensorflow as tf
from tensorflow.python.framework import op_def_registry

from tf_dietcode.coverage import PRODUCTS
from tf_dietcode.graph_rewrite import bodies as body_graphs
from tf_dietcode.graph_rewrite.analysis.graph_index import GraphIndex, node_name, tensor_name
from tf_dietcode.graph_rewrite.analysis.signature_graph import SignatureGraph

LOOPS = {op for op, kind in body_graphs.CALLS.items() if kind.loop}


def hoist(graph: SignatureGraph, captured_values: dict[str, np.ndarray]) -> tuple[SignatureGraph, list[str]]:
    """The signature with its loops' invariant products computed before them, and a note per loop;
    captured_values: placeholder -> the value of the variable it captures (for static shapes)."""
    if not any(n.op in LOOPS for n in graph.graph_def.node):
        return graph, []  # no loop: no import of the graph
    graph_def = tf.compat.v1.GraphDef()
    graph_def.CopyFrom(graph.graph_def)
    top = [body for body in body_graphs.find(graph_def, GraphIndex(graph_def, captured_values))
           if len(body.path) == 1]
    loops = {n.name: n for n in graph_def.node}
    notes = []

    def edit(body, body_def, get) -> body_graphs.Edited | None:
        if body.call.attr != "body":  # a loop's cond takes the threaded values unchanged
            return None
        hoisted = _hoistable(body, body_def)
        if not hoisted:
            return None
        loop = loops[body.call.node]
        copies = [_copy_out(graph_def, body, loop, tensor) for tensor in hoisted]
        outer = GraphIndex(graph_def, captured_values)  # the copies' static shapes (the body's may know less)
        for i, (tensor, copy) in enumerate(zip(hoisted, copies)):
            shape = outer.shape(copy)
            value = body_graphs.Threaded(f"dietcode_invariant_{len(notes)}_{i}", _dtype(body, tensor),
                                         lambda c=copy: c, shape=None if shape is None else tuple(shape))
            _read_from(body_def, tensor, get(value))
        products = sorted({n for t in hoisted for n in _cone(body, t) if _op(body, n) in PRODUCTS})
        notes.append(f"{body.where}: {', '.join(products)} do not change across iterations: computed once "
                     "before the loop")
        return body_graphs.Edited()

    body_graphs.rewrite(graph_def, top, edit, "hoisted")
    return (dataclasses.replace(graph, graph_def=graph_def), notes) if notes else (graph, [])


def _hoistable(body, body_def) -> list[str]:
    """Invariant tensors read by varying nodes whose computation holds a product."""
    invariant = _invariant_nodes(body, body_def)
    frontier = []
    for node in body_def.node:
        if node.name in invariant:
            continue
        for source in node.input:
            tensor = tensor_name(source)
            if source.startswith("^") or node_name(source) not in invariant or tensor in frontier:
                continue
            if any(_op(body, n) in PRODUCTS for n in _cone(body, tensor)):
                frontier.append(tensor)
    return frontier


def _invariant_nodes(body, body_def) -> set[str]:
    """Nodes whose values are the same at every iteration (arguments passed through included)."""
    nodes = body.index.nodes
    passed = {name for name, output in zip(body.arguments, body.outputs)
              if body_graphs.source_node(body_def, output) == name}
    writes = any(_stateful(n) and n.op != "ReadVariableOp" for n in body_def.node)
    invariant = set(passed)
    changed = True
    while changed:
        changed = False
        for node in body_def.node:
            if node.name in invariant or node.op == "Placeholder" or _calls_function(node):
                continue
            if _stateful(node) and not (node.op == "ReadVariableOp" and not writes):
                continue
            if all(node_name(i) in invariant for i in node.input if node_name(i) in nodes):
                invariant.add(node.name)
                changed = True
    return invariant


def _cone(body, tensor: str) -> set[str]:
    """The nodes of the body that compute `tensor` (its arguments excluded), as the body was found."""
    nodes = body.index.nodes
    cone, pending = set(), [node_name(tensor)]
    while pending:
        name = pending.pop()
        if name in cone or name not in nodes or name in body.arguments:
            continue
        cone.add(name)
        pending += [node_name(i) for i in nodes[name].input]
    return cone


def _copy_out(graph_def, body, loop, tensor: str) -> str:
    """The nodes computing `tensor` copied into graph_def next to the loop, the body's arguments
    bound to the loop's inputs; returns the copy of `tensor`."""
    arguments = dict(zip(body.arguments, [i for i in loop.input if not i.startswith("^")]))
    prefix = f"{loop.name}/hoisted"
    taken = {n.name for n in graph_def.node}

    def bound(source: str) -> str:
        control, name = source.startswith("^"), node_name(source)
        if name in arguments:
            return f"^{node_name(arguments[name])}" if control else arguments[name]
        return f"^{prefix}/{name}" if control else f"{prefix}/{source}"

    for name in sorted(_cone(body, tensor)):
        if f"{prefix}/{name}" in taken:
            continue
        node = graph_def.node.add()
        node.CopyFrom(body.index.nodes[name])
        node.name = f"{prefix}/{name}"
        node.input[:] = [bound(i) for i in node.input]
        node.ClearField("device")
        if "_class" in node.attr:  # colocation with body nodes
            del node.attr["_class"]
        taken.add(node.name)
    return bound(tensor)


def _read_from(body_def, tensor: str, placeholder: str) -> None:
    """Every reader of `tensor` in the body reads the threaded placeholder instead."""
    for node in body_def.node:
        node.input[:] = [placeholder if not i.startswith("^") and tensor_name(i) == tensor else i for i in node.input]


def _op(body, name: str) -> str:
    node = body.index.nodes.get(name)
    return node.op if node is not None else ""


def _dtype(body, tensor: str) -> tf.DType:
    return body.index.graph.get_tensor_by_name(tensor).dtype


def _stateful(node) -> bool:
    op_def = op_def_registry.get(node.op)
    return op_def is None or op_def.is_stateful


def _calls_function(node) -> bool:
    return any(value.HasField("func") or value.list.func for value in node.attr.values())
