"""The weights a rewritten model only reads, packed into one variable per dtype (an arena).

A signature called from Python pays for every variable it captures: TF's function call handles
each captured input on its own, about 2.5 us apiece on the 2-core machine measured. BERT-base
captured 195 variables (339 in int8: packed weight, scale and column sums per layer); packed, its
call at batch 1, T = 1 took 1.0 ms less in bfloat16 (7.7 to 6.7 ms; decisions.md, "Weights in one
variable per dtype"). Packed, a call captures a handful of arenas; each is read
once and split (SplitV on dim 0) into its arrays, which Reshape gives their shapes. Every array
starts at a multiple of 64 bytes and spans whole 64-byte lines, so TF's SplitV hands out views of
the arena's buffer: nothing is copied (a misaligned split copies the whole arena every call).

Only variables that every rewritten signature merely reads (ReadVariableOp, nothing else: no
assignment, no gather on the handle, no loop carrying it) and whose size is whole 64-byte lines are
packed; the rest stay variables of their own.
"""

import collections
import dataclasses
from collections.abc import Callable, Iterable

import numpy as np
import tensorflow as tf

from tf_dietcode.graph_rewrite import splice
from tf_dietcode.graph_rewrite.analysis.graph_index import node_name
from tf_dietcode.graph_rewrite.analysis.signature_graph import SignatureGraph

ALIGNMENT_BYTES = 64  # TF's largest Eigen alignment: a split there shares its input's buffer


@dataclasses.dataclass(frozen=True)
class _Segment:
    dtype: tf.DType
    index: int          # its output of the arena's SplitV
    shape: tuple[int, ...]


class Arena:
    """The packed variables' arenas, one per dtype (their values in the order given), and where each
    variable lands."""

    def __init__(self, variables: Iterable[tf.Variable]):
        self._segments: dict[int, _Segment] = {}                 # id(variable) -> its segment
        self._parts: dict[tf.DType, list[tf.Variable]] = collections.defaultdict(list)
        for variable in variables:
            if id(variable) not in self._segments:
                parts = self._parts[variable.dtype]
                self._segments[id(variable)] = _Segment(variable.dtype, len(parts), tuple(variable.shape))
                parts.append(variable)
        self.variables = {dtype: self._joined(dtype) for dtype in self._parts}

    def sizes(self, dtype: tf.DType) -> list[int]:
        return [int(np.prod(part.shape)) for part in self._parts[dtype]]

    def _joined(self, dtype: tf.DType) -> tf.Variable:
        """dtype's arena: its variables' values one after another, flat, gathered in one buffer (not
        a copy per variable and another joined: BERT-base's float32 weights are 340 MB)."""
        sizes = self.sizes(dtype)
        values = np.empty(sum(sizes), dtype.as_numpy_dtype)
        for part, start, size in zip(self._parts[dtype], np.cumsum([0] + sizes), sizes):
            values[start:start + size] = np.ravel(part.numpy())
        return tf.Variable(values, trainable=False, name=f"dietcode_weights_{dtype.name}")

    def holds(self, variable: tf.Variable) -> bool:
        return id(variable) in self._segments

    def segment(self, variable: tf.Variable) -> _Segment:
        return self._segments[id(variable)]


def packable(graphs: Iterable[SignatureGraph],
             variable_of: Callable[[tf.Tensor], tf.Variable | None]) -> list[tf.Variable]:
    """The variables to pack: captured by the graphs, read by nothing but ReadVariableOp (through
    Identity, as Keras' exports pass them) in any of them, whole 64-byte lines; `variable_of` maps a
    captured tensor to its variable (None: not one)."""
    found: dict[int, tf.Variable] = {}
    refused: set[int] = set()
    for graph in graphs:
        readers = _readers(graph.graph_def)
        for name, tensor in graph.captures.items():
            variable = variable_of(tensor)
            if variable is None:
                continue
            reads = _reads(readers, name, variable.dtype)
            if reads is not None and _aligned(variable):
                found.setdefault(id(variable), variable)
            else:
                refused.add(id(variable))
    return [variable for key, variable in found.items() if key not in refused]


def pack(graph: SignatureGraph, arena: Arena,
         variable_of: Callable[[tf.Tensor], tf.Variable | None]) -> SignatureGraph:
    """The graph reading its packed variables from the arenas: each ReadVariableOp of one becomes a
    Reshape (same name) of its segment of its arena's split; the variables' placeholders (and the
    Identity nodes passing them on) go."""
    packed = {name: variable for name, tensor in graph.captures.items()
              if (variable := variable_of(tensor)) is not None and arena.holds(variable)}
    if not packed:
        return graph
    graph_def = tf.compat.v1.GraphDef()
    graph_def.CopyFrom(graph.graph_def)
    captures = dict(graph.captures)
    nodes = {node.name: node for node in graph_def.node}
    readers = _readers(graph_def)
    splits, dropped = {}, set(packed)
    for name, variable in packed.items():
        segment = arena.segment(variable)
        if segment.dtype not in splits:
            splits[segment.dtype] = _add_split(graph_def, segment.dtype, arena.sizes(segment.dtype))
            captures[f"dietcode/weights_{segment.dtype.name}"] = arena.variables[segment.dtype].handle
        passing, reads = _reads(readers, name, variable.dtype)
        dropped.update(passing)
        for read in reads:
            _as_reshape(graph_def, nodes[read], f"{splits[segment.dtype]}:{segment.index}", segment)
    kept = [node for node in graph_def.node if node.name not in dropped]
    del graph_def.node[:]
    graph_def.node.extend(kept)
    return dataclasses.replace(graph, graph_def=graph_def,
                               captures={name: t for name, t in captures.items() if name not in packed})


def _readers(graph_def: tf.compat.v1.GraphDef) -> dict[str, list]:
    readers = collections.defaultdict(list)
    for node in graph_def.node:
        for tensor in node.input:
            readers[node_name(tensor)].append(node)
    return readers


def _reads(readers: dict[str, list], handle: str, dtype: tf.DType) -> tuple[list[str], list[str]] | None:
    """The Identity nodes passing the resource `handle` on and the ReadVariableOp nodes reading it, or
    None where anything else takes it (or nothing reads it)."""
    passing, reads, pending = [], [], [handle]
    while pending:
        name = pending.pop()
        for node in readers.get(name, []):
            if len(node.input) != 1 or node.input[0].startswith("^"):
                return None
            if node.op == "Identity":
                passing.append(node.name)
                pending.append(node.name)
            elif node.op == "ReadVariableOp" and node.attr["dtype"].type == dtype.as_datatype_enum:
                reads.append(node.name)
            else:
                return None
    return (passing, reads) if reads else None


def _aligned(variable: tf.Variable) -> bool:
    nbytes = int(np.prod(variable.shape)) * variable.dtype.size
    return nbytes > 0 and nbytes % ALIGNMENT_BYTES == 0


def _add_split(graph_def: tf.compat.v1.GraphDef, dtype: tf.DType, sizes: list[int]) -> str:
    """Placeholder dietcode/weights_<dtype> (the arena's handle), its read and its split; returns the
    split's name."""
    prefix = f"dietcode/weights_{dtype.name}"
    splice.add_placeholder(graph_def, prefix, tf.resource)
    read = graph_def.node.add(name=f"{prefix}/read", op="ReadVariableOp", input=[prefix])
    read.attr["dtype"].type = dtype.as_datatype_enum
    splice.add_constant(graph_def, f"{prefix}/sizes", np.array(sizes, np.int64))
    splice.add_constant(graph_def, f"{prefix}/axis", np.array(0, np.int32))
    split = graph_def.node.add(name=f"{prefix}/split", op="SplitV",
                               input=[f"{prefix}/read", f"{prefix}/sizes", f"{prefix}/axis"])
    split.attr["T"].type = dtype.as_datatype_enum
    split.attr["Tlen"].type = tf.int64.as_datatype_enum
    split.attr["num_split"].i = len(sizes)
    return split.name


def _as_reshape(graph_def: tf.compat.v1.GraphDef, node, segment_tensor: str, segment: _Segment) -> None:
    shape = f"{node.name}/shape"
    splice.add_constant(graph_def, shape, np.array(segment.shape, np.int64))
    node.op = "Reshape"
    del node.input[:]
    node.input.extend([segment_tensor, shape])
    node.attr.clear()
    node.attr["T"].type = segment.dtype.as_datatype_enum
    node.attr["Tshape"].type = tf.int64.as_datatype_enum

