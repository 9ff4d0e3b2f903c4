"""A beam search's cache carried unreordered through the loop, reordered as the next step appends.

A beam search with a key/value cache appends each step's keys and values to
every layer's cache (`concat`), and once the step's beams are chosen reorders
every cache by the beams' parents (`gather` of rows) for the next step: two
copies of each cache per step, 12 caches of up to 4 MB each in a Transformer-base
decoder at batch 8, beam 4 (a fifth of its decode time). Where a loop body's
output is `gather(concat([cache, new], axis), rows)` of its own loop variable
`cache`, read nowhere else, and nothing reads that output after the loop, the
body returns the concat's output unreordered and threads `rows` to the next
iteration as a new loop variable (graph_rewrite.bodies: Edited.carried); the
next step's concat becomes DietcodeReorderAppend(cache, previous rows, new), one
copy. The first iteration reorders by the identity (every row in order). Runs
on the rewritten signature (after the fused ops are spliced in); loops directly
in the signature's graph only.
"""

import collections
import functools

import numpy as np
import tensorflow as tf

from tf_dietcode import ops
from tf_dietcode.graph_rewrite import bodies as body_graphs
from tf_dietcode.graph_rewrite import splice
from tf_dietcode.graph_rewrite.analysis.graph_index import GraphIndex, node_name, tensor_name

LOOPS = {op for op, kind in body_graphs.CALLS.items() if kind.loop}


def defer(graph_def: tf.compat.v1.GraphDef, captured_values: dict[str, np.ndarray]) -> list[str]:
    """Rewrites graph_def's loops as above, in place; returns a note per loop it changed.
    captured_values: placeholder -> the value of the variable it captures (for static values)."""
    if not any(n.op in LOOPS for n in graph_def.node) or not _has_candidate(graph_def):
        return []  # no import of the graph (the accuracy gate rewrites repeatedly)
    with tf.Graph().as_default():  # the rewritten functions, which the eager context lacks, for nested calls
        library = tf.compat.v1.GraphDef()
        library.library.CopyFrom(graph_def.library)
        tf.graph_util.import_graph_def(library, name="")
        return _defer(graph_def, captured_values)


def _defer(graph_def: tf.compat.v1.GraphDef, captured_values: dict[str, np.ndarray]) -> list[str]:
    index = GraphIndex(graph_def, captured_values)
    top = [body for body in body_graphs.find(graph_def, index) if len(body.path) == 1]
    notes = []

    def edit(body, body_def, get) -> body_graphs.Edited | None:
        if body.call.attr != "body" or index.nodes[body.call.node].op not in LOOPS:
            return None
        loop = index.nodes[body.call.node]
        caches = [c for c in _caches(body) if not index.consumers.get(f"{loop.name}:{c.argument}")]
        if not caches:
            return None
        edited = body_graphs.Edited()
        nodes = {n.name: n for n in body_def.node}
        initial = [i for i in loop.input if not i.startswith("^")]
        for cache in caches:  # rows per cache: each starts from the identity of its own initial rows
            key = f"dietcode_parent_rows_{len(notes)}_{cache.argument}"  # unique over the graph's loops
            placeholder = get(body_graphs.Threaded(
                key, tf.int32, lambda f=initial[cache.argument], k=key: _identity_rows(graph_def, f, k), shape=(None,)))
            edited.carried[key] = cache.rows
            _reorder_append(nodes[cache.concat], placeholder, cache.axis)
            if cache.returned is not None:  # the Identity keeps its control inputs
                nodes[cache.returned].input[0] = f"{cache.concat}:0"
            else:
                edited.replaced[body.outputs[cache.argument]] = f"{cache.concat}:0"
        notes.append(f"{body.where}: {len(caches)} caches carried unreordered, reordered as the next step "
                     "appends to them (one copy a step instead of two)")
        return edited

    body_graphs.rewrite(graph_def, top, edit, "reordered")
    return notes


class _Cache(collections.namedtuple("_Cache", "argument concat rows axis returned")):
    """Loop variable `argument`, whose next value is gather(concat([it, new], axis), rows); `returned`:
    the Identity that returns it (TF's function bodies return every output through one), or None."""


def _caches(body) -> list[_Cache]:
    index, found = body.index, []
    for i, (argument, output) in enumerate(zip(body.arguments, body.outputs)):
        if index.consumers.get(output):
            continue
        producer = index.producer(output)
        returned = producer if producer.op == "Identity" else None
        gathered = tensor_name(returned.input[0]) if returned is not None else output
        gather = index.producer(gathered)
        if (gather.op != "GatherV2" or gathered != f"{gather.name}:0"
                or index.consumers.get(gathered) != ([returned.name] if returned is not None else [])):
            continue
        params, rows, axis = (tensor_name(t) for t in gather.input[:3])
        if (index.scalar(axis) != 0 or gather.attr["batch_dims"].i != 0
                or gather.attr["Tindices"].type != tf.int32.as_datatype_enum):
            continue
        concat = index.producer(params)
        data = [tensor_name(t) for t in concat.input if not t.startswith("^")]
        if (concat.op != "ConcatV2" or params != f"{concat.name}:0" or len(data) != 3
                or concat.attr["T"].type != tf.float32.as_datatype_enum or data[0] != f"{argument}:0"
                or index.consumers.get(data[0]) != [concat.name]):
            continue
        shape, axis_value = index.shape(params), index.scalar(data[2])
        if shape is None or axis_value is None:
            continue
        axis_value = int(axis_value) % len(shape)
        if axis_value >= 1:
            found.append(_Cache(i, concat.name, rows, axis_value, returned.name if returned is not None else None))
    return found


def _reorder_append(concat, rows: str, axis: int) -> None:
    """The ConcatV2 node, in place, as DietcodeReorderAppend(cache, rows, new): its readers unchanged."""
    cache, new = [t for t in concat.input if not t.startswith("^")][:2]
    controls = [t for t in concat.input if t.startswith("^")]
    template = _op_template()
    concat.op = template.op
    concat.input[:] = [cache, rows, new] + controls
    concat.attr.clear()
    concat.attr.MergeFrom(template.attr)
    concat.attr["axis"].i = axis


@functools.cache
def _op_template():
    """A DietcodeReorderAppend NodeDef as the op library writes it (attr defaults and all)."""
    graph_def = splice.scratch_graph(lambda: ops.reorder_append(
        tf.compat.v1.placeholder(tf.float32, [None, None]), tf.compat.v1.placeholder(tf.int32, [None]),
        tf.compat.v1.placeholder(tf.float32, [None, None]), axis=1, name="template"))
    return next(n for n in graph_def.node if n.name == "template")


@functools.cache
def _identity_rows_graph() -> tf.compat.v1.GraphDef:
    """range(rows of the placeholder cache), as node out."""
    return splice.scratch_graph(lambda: tf.range(tf.shape(tf.compat.v1.placeholder(tf.float32, name="cache"))[0],
                                                 name="out"))


def _identity_rows(graph_def, cache: str, name: str) -> str:
    """range(rows of `cache`) in graph_def: the first iteration's reorder, every row in place."""
    splice.splice(graph_def, _identity_rows_graph(), {"cache": cache}, name, {}, {})
    return f"{name}/out:0"


def _has_candidate(graph_def) -> bool:
    """Whether a function of the library gathers from a concat's output (what could be a cache's step)."""
    for function in graph_def.library.function:
        concats = {n.name for n in function.node_def if n.op == "ConcatV2"}
        if any(n.op == "GatherV2" and node_name(n.input[0]) in concats for n in function.node_def):
            return True
    return False
