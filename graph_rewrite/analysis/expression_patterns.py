"""Computations TF emits as several ops, recognised by expression shape.

A pattern is a tree: (op, operand, ...), a float for a scalar constant of
that value, or a Capture, which matches any tensor and names it; a name
captured twice must be the same tensor both times, so a tree can say that
two branches read one value (a layer norm's input, its mean). Mul and AddV2
match in either operand order.
"""

import dataclasses

import numpy as np

from tf_dietcode.graph_rewrite.analysis.graph_index import GraphIndex, tensor_name

COMMUTATIVE = {"Mul", "AddV2"}
SAME_OP = {"AddV2": {"AddV2", "Add"}}


@dataclasses.dataclass(frozen=True)
class Capture:
    name: str


def matches(index: GraphIndex, tensor: str, pattern, captured: dict[str, str], nodes: set) -> bool:
    """Whether `tensor` is computed as `pattern`. On a match, `captured` gains the captures
    (name -> tensor) and `nodes` the names of the nodes inside the tree; on none, both are
    left as they were."""
    if isinstance(pattern, Capture):
        return captured.setdefault(pattern.name, tensor) == tensor
    if isinstance(pattern, float):
        value = index.value(tensor)
        return value is not None and np.size(value) == 1 and np.isclose(float(value), pattern, rtol=1e-6)
    node = index.producer(tensor)
    op, *operands = pattern
    if node.op not in SAME_OP.get(op, {op}):
        return False
    inputs = [tensor_name(i) for i in node.input if not i.startswith("^")]
    if len(inputs) != len(operands):
        return False
    for order in [inputs, inputs[::-1]] if op in COMMUTATIVE else [inputs]:
        trial, found = dict(captured), set()
        if all(matches(index, t, p, trial, found) for t, p in zip(order, operands)):
            captured.update(trial)
            nodes |= found | {node.name}
            return True
    return False


def read_only_inside(index: GraphIndex, nodes: set, root: str, also: tuple[str, ...] = ()) -> bool:
    """Whether every node of a matched tree but its root (and the tensors in `also`) is read
    only by the tree: replacing the tree then leaves no reader without its input."""
    tensors = [*also, *(f"{n}:{i}" for n in nodes - {root} for i in range(_outputs(index, n)))]
    return all(reader in nodes or _unread_identity(index, reader) for t in tensors
               for reader in index.consumers.get(t, []))


def _unread_identity(index: GraphIndex, name: str) -> bool:
    """An Identity nothing reads: tf.custom_gradient leaves one beside its IdentityN. It keeps
    no work alive that the fused op would otherwise save twice (were it a signature's output,
    the tree would just stay computed for it)."""
    return index.nodes[name].op == "Identity" and not index.consumers.get(f"{name}:0")


def _outputs(index: GraphIndex, node: str) -> int:
    return len(index.graph.get_operation_by_name(node).outputs)
