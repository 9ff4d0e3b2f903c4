"""Row slices moved ahead of the row-wise fused ops that produce them, so those ops
compute only the rows that are kept.

A decoder written as TensorFlow's tutorials write it re-runs on the whole prefix
each step and keeps the last position's logits (`logits[:, -1, :]`): the logits
layer, and the layers before it back to the last attention, compute every row
to keep one. The fused dense and layer-norm ops are row-wise (each output row
reads the same row of its row inputs only), so a StridedSlice of their output
that keeps the feature axis whole equals the op on the same slice of its row
inputs. Applied until no slice moves, the chain runs on the kept rows. Runs
after the fused ops are spliced in (graph_rewrite.splice); readers of the
slice read the moved op's output through an Identity of the slice's name, so
function outputs naming the slice stay valid.
"""

from collections.abc import Callable

import numpy as np
import tensorflow as tf

from tf_dietcode.graph_rewrite import bodies
from tf_dietcode.graph_rewrite.analysis.graph_index import GraphIndex, tensor_name

# op -> (node -> the indices of its inputs aligned row by row with its output, with the number of
# trailing axes of each that the op contracts or normalizes; None where these attrs are not row-wise).
RowInputs = Callable[[tf.compat.v1.NodeDef], dict[int, int] | None]


def _dense_rows(node) -> dict[int, int] | None:
    """Dense ops: row input `a`, whose last num_k_dims axes are contracted; not with a transposed
    `a`, layers side by side (group-major output) or a product split over several axes."""
    if node.attr["transpose_a"].b or node.attr["groups"].i > 1 or len(node.attr["n_dims"].list.i) > 1:
        return None
    return {0: max(node.attr["num_k_dims"].i, 1)}


def _layer_norm_rows(node) -> dict[int, int]:
    """x and the residual it is added to (inputs 0 and 3), normalized over their last axis."""
    return {0: 1, **({3: 1} if node.attr["num_residual"].i else {})}


# The bfloat16 and int8 dense ops are row-wise too, but an encoder block whose attention output
# projection ran in bfloat16 failed to load once the slice had moved ahead of it: left out until
# that is understood.
ROW_WISE: dict[str, RowInputs] = {
    "DietcodeFusedMatMul": _dense_rows,
    "DietcodeLayerNorm": _layer_norm_rows,
}
_SPEC_ATTRS = ("begin_mask", "end_mask", "ellipsis_mask", "new_axis_mask", "shrink_axis_mask")


def sink(graph_def: tf.compat.v1.GraphDef, captured_values: dict[str, np.ndarray], keep: set[str]) -> list[str]:
    """Moves every row slice of a row-wise op's output ahead of the op, repeatedly; `keep`: tensors
    read from outside graph_def (function outputs), whose producers must stay as they are.
    Returns the ops that now compute only the kept rows."""
    moved: list[str] = []
    while _has_candidate(graph_def):  # else no import of the graph (the gate rewrites BERT-size graphs often)
        index = GraphIndex(graph_def, captured_values)
        live = bodies.needed_nodes(graph_def, list(keep), [])  # spliced-out nodes still read what they read
        step = _next_move(graph_def, index, {tensor_name(t) for t in keep}, live)
        if step is None:
            break
        moved.append(_move(graph_def, index, *step))
    return moved


def _has_candidate(graph_def) -> bool:
    """Whether a StridedSlice reads the output of a row-wise op (what could move)."""
    ops = {n.name: n.op for n in graph_def.node}
    return any(n.op == "StridedSlice" and ops.get(n.input[0].split(":")[0]) in ROW_WISE for n in graph_def.node)


def _next_move(graph_def, index: GraphIndex, keep: set[str], live: set[str]):
    """(slice nodes, producer, its row inputs) of the first live slice that can move, or None."""
    for node in graph_def.node:
        if node.op != "StridedSlice" or node.name not in live:
            continue
        source = tensor_name(node.input[0])
        producer = index.producer(source)
        rule = ROW_WISE.get(producer.op)
        rows = rule(producer) if rule else None
        if rows is None or source in keep or source != f"{producer.name}:0" or \
                live & set(index.consumers.get(f"^{producer.name}", [])):
            continue
        readers = [index.nodes[r] for r in index.consumers[source] if r in live]
        if not all(r.op == "StridedSlice" and tensor_name(r.input[0]) == source and _same_spec(index, r, node)
                   for r in readers):
            continue
        rank = _ranks_align(index, source, producer, rows)
        if rank is not None and _keeps_features(index, node, rank):
            return readers, producer, rows
    return None


def _spec(index: GraphIndex, node) -> tuple | None:
    """A slice's begin, end, strides and masks, or None where they are not fixed."""
    values = [index.value(t) for t in node.input[1:4]]
    if any(v is None for v in values):
        return None
    return tuple(tuple(np.asarray(v).tolist()) for v in values) + tuple(node.attr[a].i for a in _SPEC_ATTRS)


def _same_spec(index: GraphIndex, a, b) -> bool:
    return _spec(index, a) is not None and _spec(index, a) == _spec(index, b)


def _keeps_features(index: GraphIndex, node, rank: int) -> bool:
    """The slice of an output of `rank` axes leaves the last (feature) axis whole and adds none;
    no ellipsis (where it reaches depends on the rank)."""
    begin, end, strides, begin_mask, end_mask, ellipsis, new_axis, shrink = _spec(index, node) or (None,) * 8
    if begin is None or ellipsis or new_axis or not 0 < len(strides) <= rank:
        return False
    last = 1 << (rank - 1)
    return len(strides) < rank or (bool(begin_mask & last) and bool(end_mask & last) and not shrink & last
                                   and strides[-1] == 1)


def _ranks_align(index: GraphIndex, source: str, producer, rows: dict[int, int]) -> int | None:
    """The output's rank, where every row input has the output's leading axes (ranks known), so one
    slice spec fits them all; else None."""
    out = index.shape(source)
    if out is None:
        return None
    for i, contracted in rows.items():
        shape = index.shape(producer.input[i])
        if shape is None or len(shape) - contracted != len(out) - 1:
            return None
    return len(out)


def _move(graph_def, index: GraphIndex, readers: list, producer, rows: dict[int, int]) -> str:
    """Adds the slice of each row input and the op on them; the readers become Identities of it
    (the op they read is left to the pruning of unread nodes)."""
    first, taken = readers[0], {n.name for n in graph_def.node}
    moved = graph_def.node.add()
    moved.CopyFrom(producer)
    moved.name = _unused(taken, f"{producer.name}/rows")
    for i in rows:
        sliced = graph_def.node.add()
        sliced.CopyFrom(first)
        sliced.name = _unused(taken, f"{moved.name}/input_{i}")
        sliced.input[0] = producer.input[i]
        sliced.ClearField("device")
        moved.input[i] = f"{sliced.name}:0"
    for reader in readers:
        controls = [i for i in reader.input if i.startswith("^")]
        reader.op = "Identity"
        reader.input[:] = [f"{moved.name}:0", *controls]
        dtype = reader.attr["T"].type
        reader.ClearField("attr")
        reader.attr["T"].type = dtype
    return producer.name


def _unused(taken: set[str], name: str) -> str:
    unique, i = name, 0
    while unique in taken:
        i += 1
        unique = f"{name}_{i}"
    taken.add(unique)
    return unique


def note(where: str, moved: list[str]) -> str:
    """The report's line on the ops `sink` moved in `where`."""
    names = ", ".join(name.removesuffix("/out_0") for name in moved)
    return f"{where}: {names} compute only the rows that a slice of their output keeps (the slice runs ahead of them)"
