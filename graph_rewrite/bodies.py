"""Control flow's bodies: the functions of While/If/Case nodes, entered like the signature's graph.

The inlining (analysis.signature_graph) leaves loops and conds as nodes whose
functions stay in the graph's library. Here each such function, at any depth
(a cond in a loop, a loop in a loop), becomes a Body: a GraphDef whose
arguments are placeholders, indexed like the top-level graph. A resource
argument is followed out of the loop or cond, call by call, to the variable
the signature captures, so a dense layer in a body has its weight's value.

`rewrite` edits bodies (splices fused ops in, or adds recorders) and writes
each edited function back under a new name, pointing its node at it; the
library keeps everything else. A body's ops can only read its arguments, so
whatever an edit reads from outside (the kernel bundle's path, the packed
weights' variables) is threaded in as extra arguments: extra inputs of an
If/Case, extra loop-carried values of a While that its body passes through
unchanged (and its condition ignores). These are a string and resource
handles, a few bytes per call: weights stay in the output's variables, once,
however many functions read them, instead of as constants in each function.
"""

import collections
import dataclasses
from collections.abc import Callable

import tensorflow as tf
from tensorflow.python.framework import function_def_to_graph, graph_to_function_def, op_def_registry

from tf_dietcode.graph_rewrite.analysis.graph_index import GraphIndex, ancestors, node_name, tensor_name
from tf_dietcode.graph_rewrite.fusions import dense_patterns
from tf_dietcode.graph_rewrite.fusions.contract import LeftAlone


@dataclasses.dataclass(frozen=True)
class CallKind:
    """How a control-flow op calls its functions: which attrs name them, where their arguments
    start among the node's inputs, the attr with the arguments' types."""
    functions: tuple[str, ...]   # attrs naming one function each ("branches": a list of them)
    first_argument: int          # node inputs before the functions' arguments (an If's predicate)
    types: str
    loop: bool = False           # a While: its body's outputs are the next iteration's arguments


CALLS = {
    **dict.fromkeys(("While", "StatelessWhile"), CallKind(("cond", "body"), 0, "T", loop=True)),
    **dict.fromkeys(("If", "StatelessIf"), CallKind(("then_branch", "else_branch"), 1, "Tin")),
    **dict.fromkeys(("Case", "StatelessCase"), CallKind(("branches",), 1, "Tin")),
}
_ROLES = {"cond": "while condition", "body": "while body", "then_branch": "cond true branch",
          "else_branch": "cond false branch", "branches": "case branch"}


@dataclasses.dataclass(frozen=True)
class Call:
    """One function of a control-flow node: the node (in its graph), the attr, the branch's position."""
    node: str
    attr: str
    position: int = -1           # in a list attr (Case's branches), else -1


@dataclasses.dataclass
class Body:
    path: tuple[Call, ...]       # the calls from the signature's graph down to this function
    function: str                # its name in the library
    where: str                   # as the report names it: "while body f", "cond true branch g, in while body f"
    graph_def: tf.compat.v1.GraphDef  # the function's nodes, its arguments as placeholders, the library attached
    arguments: list[str]         # placeholder names, in the function's order
    outputs: list[str]           # the tensors it returns, in order
    output_names: list[str]
    index: GraphIndex
    left_alone: list[LeftAlone]  # products reading a variable that could not be followed out

    @property
    def call(self) -> Call:
        return self.path[-1]


def find(graph_def: tf.compat.v1.GraphDef, index: GraphIndex) -> list[Body]:
    """Every function of every control-flow node of the graph, nested ones after their callers."""
    library = {f.signature.name: f for f in graph_def.library.function}
    bodies = []

    def visit(parent_def, parent_index: GraphIndex, path: tuple[Call, ...], where: str) -> None:
        for node in parent_def.node:
            kind = CALLS.get(node.op)
            if kind is None:
                continue
            for call, function in _functions(node, kind):
                if function not in library:
                    continue
                role = _ROLES[call.attr] + (f" {call.position}" if call.position >= 0 else "")
                body = _body(library[function], node, kind, parent_index, graph_def.library, (*path, call),
                             f"{role} {function}" + (f", in {where}" if where else ""))
                bodies.append(body)
                visit(body.graph_def, body.index, body.path, body.where)

    visit(graph_def, index, (), "")
    return bodies


def _functions(node, kind: CallKind) -> list[tuple[Call, str]]:
    found = []
    for attr in kind.functions:
        value = node.attr[attr] if attr in node.attr else None
        if value is None:
            continue
        if value.HasField("func"):
            found.append((Call(node.name, attr), value.func.name))
        found += [(Call(node.name, attr, i), f.name) for i, f in enumerate(value.list.func)]
    return found


def _body(fdef, node, kind: CallKind, parent: GraphIndex, library, path: tuple[Call, ...], where: str) -> Body:
    arguments = [tensor_name(i) for i in node.input if not i.startswith("^")][kind.first_argument:]
    if kind.loop:  # the loop's shape invariants
        shapes = [tf.TensorShape(s) for s in node.attr["output_shapes"].list.shape] or None
    else:
        shapes = [_static_shape(parent, t) for t in arguments]
    copy = type(fdef)()
    copy.CopyFrom(fdef)  # TF's conversion reads arg_attr with [], which adds entries
    graph_def, flat = function_def_to_graph.function_def_to_graph_def(copy, shapes)
    graph_def.library.CopyFrom(library)
    names = [a.name for a in fdef.signature.input_arg]
    output_names = [a.name for a in fdef.signature.output_arg]
    outputs = [tensor_name(flat[fdef.ret[name]]) for name in output_names]
    captured = {}
    for i, (name, outer) in enumerate(zip(names, arguments)):
        passed_through = not kind.loop or path[-1].attr != "body" or source_node(graph_def, outputs[i]) == name
        value = parent.variable_value(outer) if fdef.signature.input_arg[i].type == tf.resource.as_datatype_enum \
            else None
        if value is not None and passed_through:
            captured[name] = value
    index = GraphIndex(graph_def, captured)
    return Body(path, fdef.signature.name, where, graph_def, names, outputs, output_names, index,
                _unfollowed_variables(index, names, captured, where))


def _static_shape(index: GraphIndex, tensor: str) -> tf.TensorShape | None:
    try:
        return index.graph.get_tensor_by_name(tensor).shape
    except (KeyError, ValueError):
        return None


def source_node(graph_def, tensor: str) -> str:
    """The node a tensor comes from, through Identity nodes."""
    nodes = {n.name: n for n in graph_def.node}
    node = nodes[node_name(tensor)]
    while node.op == "Identity":
        node = nodes[node_name(node.input[0])]
    return node.name


def _unfollowed_variables(index: GraphIndex, arguments: list[str], captured: dict, where: str) -> list[LeftAlone]:
    """Products that read a variable passed in as a resource argument which does not lead to a
    variable the signature captures (a resource the loop carries and changes, say): its value is
    not known at optimize time, so no dense layer is fused there."""
    left = []
    for node in index.nodes.values():
        if node.op not in dense_patterns.CORES:
            continue
        for operand in node.input[:2]:
            reader = index.producer(operand)
            while reader.op == "Identity":
                reader = index.producer(reader.input[0])
            if reader.op == "ReadVariableOp" and index.variable_value(reader.input[0]) is None:
                handle = index.producer(reader.input[0])
                if handle.name in arguments and handle.name not in captured:
                    left.append(LeftAlone("dense", f"{node.name} ({where})",
                                          f"its weight is the variable passed in as {handle.name}, which does not "
                                          "lead to a variable the signature captures: left to TF"))
    return left


# ---- rewriting --------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Threaded:
    """A tensor an edited body reads from the signature's graph, threaded in as an argument."""
    key: str                             # the argument's name in every function it passes through
    dtype: tf.DType
    outer: Callable[[], str]             # the tensor in the signature's graph (called once per key)
    read_only: bool = True               # a resource the functions only read
    shape: tuple[int | None, ...] | None = ()  # its static shape (None: unknown rank); handles are scalars


# A body's way to read a Threaded value: the placeholder standing for it in the body.
Get = Callable[[Threaded], str]


@dataclasses.dataclass
class Edited:
    replaced: dict[str, str] = dataclasses.field(default_factory=dict)  # old tensor -> new, for its outputs
    control_outputs: list[str] = dataclasses.field(default_factory=list)  # nodes that must run
    # A loop body's threaded values that change: key -> the body's tensor for the next iteration
    # (the others pass through unchanged).
    carried: dict[str, str] = dataclasses.field(default_factory=dict)


# An edit of one body: (body, its graph_def to edit, get) -> what it changed; None where it left it alone.
Edit = Callable[[Body, tf.compat.v1.GraphDef, Get], Edited | None]


def rewrite(graph_def: tf.compat.v1.GraphDef, bodies: list[Body], edit: Edit, suffix: str) -> list[Body]:
    """Applies `edit` to every body and writes each function it (or a body nested in it) changed
    back into graph_def's library as `<name>_<suffix>`, the calling node pointed at it and given
    the threaded values. Returns the bodies it changed."""
    outer: dict[str, str] = {}

    def top_get(value: Threaded) -> str:
        if value.key not in outer:
            outer[value.key] = value.outer()
        return outer[value.key]

    changed: list[Body] = []
    library = graph_def.library
    replaced_functions = set()
    _rewrite_calls(graph_def, (), bodies, edit, top_get, suffix, library, changed, replaced_functions)
    _drop_unused(graph_def, replaced_functions)
    return changed


def _rewrite_calls(graph_def, path: tuple[Call, ...], bodies: list[Body], edit: Edit, get: Get, suffix: str,
                   library, changed: list[Body], replaced_functions: set[str]) -> bool:
    """Rewrites the calls of one graph (the signature's, or a body's) whose bodies `edit` changes;
    whether it changed any."""
    by_node: dict[str, list[Body]] = collections.defaultdict(list)
    for body in bodies:
        if body.path[:-1] == path:
            by_node[body.call.node].append(body)
    nodes = {n.name: n for n in graph_def.node}
    any_changed = False
    for name, called in by_node.items():
        edits = [_edited_body(body, bodies, edit, suffix, library, changed, replaced_functions) for body in called]
        if not any(e is not None for e in edits):
            continue
        edits = [e if e is not None else _EditedBody.unchanged(body) for body, e in zip(called, edits)]
        threaded = list({value.key: value for e in edits for value in e.threaded.values()}.values())
        node, kind = nodes[name], CALLS[nodes[name].op]
        for body, e in zip(called, edits):
            name = _unused_name(library, f"{body.function}_{suffix}")
            function = e.function(body, threaded, kind.loop and body.call.attr == "body", name, library)
            library.function.add().CopyFrom(function)
            replaced_functions.add(body.function)
            value = node.attr[body.call.attr]
            (value.list.func[body.call.position] if body.call.position >= 0 else value.func).name = \
                function.signature.name
        _add_arguments(node, kind, threaded, get)
        any_changed = True
    return any_changed


@dataclasses.dataclass
class _EditedBody:
    graph_def: tf.compat.v1.GraphDef
    outputs: list[str]
    threaded: dict[str, Threaded]          # by key, in the order the body asked for them
    control_outputs: list[str]
    carried: dict[str, str] = dataclasses.field(default_factory=dict)  # as Edited.carried

    @staticmethod
    def unchanged(body: Body) -> "_EditedBody":
        graph_def = tf.compat.v1.GraphDef()
        graph_def.CopyFrom(body.graph_def)
        return _EditedBody(graph_def, list(body.outputs), {}, [])

    def function(self, body: Body, threaded: list[Threaded], passes_through: bool, name: str, library):
        """The body as the FunctionDef `name` taking `threaded` as extra arguments (returning them
        too where it is a loop's body); `library` holds the functions it calls."""
        for value in threaded:
            _placeholder(self.graph_def, value)
        self.graph_def.library.CopyFrom(library)
        return _function_def(body, self.graph_def, self.outputs, [v.key for v in threaded], passes_through,
                             self.control_outputs, name, self.carried)


def _edited_body(body: Body, bodies: list[Body], edit: Edit, suffix: str, library, changed: list[Body],
                 replaced_functions: set[str]) -> _EditedBody | None:
    state = _EditedBody.unchanged(body)

    def get(value: Threaded) -> str:
        if value.key not in state.threaded:
            state.threaded[value.key] = value
            _placeholder(state.graph_def, value)
        return f"{value.key}:0"

    result = edit(body, state.graph_def, get)
    if result is not None:
        state.outputs = [result.replaced.get(t, t) for t in state.outputs]
        state.control_outputs = result.control_outputs
        state.carried = result.carried
    nested = _rewrite_calls(state.graph_def, body.path, bodies, edit, get, suffix, library, changed,
                            replaced_functions)
    if result is None and not nested:
        return None
    changed.append(body)
    return state


def _unused_name(library, name: str) -> str:
    taken = {f.signature.name for f in library.function}
    unique, i = name, 0
    while unique in taken:
        i += 1
        unique = f"{name}_{i}"
    return unique


def _placeholder(graph_def, value: Threaded) -> None:
    if not any(n.name == value.key for n in graph_def.node):
        node = graph_def.node.add(name=value.key, op="Placeholder")
        node.attr["dtype"].type = value.dtype.as_datatype_enum
        node.attr["shape"].shape.CopyFrom(tf.TensorShape(value.shape).as_proto())


def _add_arguments(node, kind: CallKind, threaded: list[Threaded], get: Get) -> None:
    """The node given the threaded values as its last inputs (a While: loop-carried values)."""
    controls = [i for i in node.input if i.startswith("^")]
    data = [i for i in node.input if not i.startswith("^")]
    node.input[:] = data + [get(value) for value in threaded] + controls
    node.attr[kind.types].list.type.extend(v.dtype.as_datatype_enum for v in threaded)
    if kind.loop:
        node.attr["output_shapes"].list.shape.extend(tf.TensorShape(v.shape).as_proto() for v in threaded)
    if "_read_only_resource_inputs" in node.attr:  # resources the functions only read (packed weights)
        node.attr["_read_only_resource_inputs"].list.i.extend(
            len(data) + i for i, v in enumerate(threaded) if v.dtype == tf.resource and v.read_only)


def _function_def(body: Body, graph_def, outputs: list[str], extra: list[str], passes_through: bool,
                  control_outputs: list[str], name: str, carried: dict[str, str]):
    """graph_def as the FunctionDef `name`: the body's arguments then `extra`, its outputs (then
    `extra` again for a loop's body, or the tensor `carried` names for one), its control outputs
    and attrs, nodes nothing needs left out."""
    original = next(f for f in graph_def.library.function if f.signature.name == body.function)
    graph = tf.Graph()
    with graph.as_default():
        tf.graph_util.import_graph_def(graph_def, name="")
    inputs = [graph.get_tensor_by_name(f"{a}:0") for a in body.arguments + extra]
    results = [graph.get_tensor_by_name(t) for t in outputs]
    out_names = list(body.output_names)
    if passes_through:
        results += [graph.get_tensor_by_name(carried[key]) if key in carried else value
                    for key, value in zip(extra, inputs[len(body.arguments):])]
        out_names += [f"{key}_out" for key in extra]
    controls = list(original.control_ret.values()) + control_outputs
    kept = needed_nodes(graph_def, [t.name for t in results], controls)
    function = graph_to_function_def.graph_to_function_def(
        graph, [op for op in graph.get_operations() if op.name in kept], inputs, results, out_names)
    function.signature.name = name
    function.attr.MergeFrom(original.attr)
    for i, attrs in original.arg_attr.items():
        function.arg_attr[i].CopyFrom(attrs)
    for i, unique in original.resource_arg_unique_id.items():
        function.resource_arg_unique_id[i] = unique
    function.signature.is_stateful |= original.signature.is_stateful
    for control in original.signature.control_output:
        function.signature.control_output.append(control)
        function.control_ret[control] = original.control_ret[control]
    for control in control_outputs:
        function.signature.control_output.append(control)
        function.control_ret[control] = control
    return function


def needed_nodes(graph_def, outputs: list[str], controls: list[str]) -> set[str]:
    """Nodes the outputs and control outputs need, and every stateful node (which runs regardless)."""
    return ancestors(graph_def, [*outputs, *controls, *(n.name for n in graph_def.node if _stateful(n.op))])


def _stateful(op: str) -> bool:
    """Whether a node runs for its effect. Reads of variables do not: those a function must run
    are its control outputs, and a fused layer's old weight reads go."""
    op_def = op_def_registry.get(op)
    return op_def is not None and op_def.is_stateful and op != "ReadVariableOp"


def _drop_unused(graph_def, functions: set[str]) -> None:
    """Removes the replaced functions nothing calls any more (a copy of each would be saved)."""
    def called(nodes) -> set[str]:
        names = set()
        for node in nodes:
            names.add(node.op)
            for value in node.attr.values():
                names.update([value.func.name] if value.HasField("func") else [])
                names.update(f.name for f in value.list.func)
        return names

    while True:
        used = called(graph_def.node)
        for function in graph_def.library.function:
            used |= called(function.node_def)
        unused = [i for i, f in enumerate(graph_def.library.function)
                  if f.signature.name in functions and f.signature.name not in used]
        if not unused:
            return
        for i in reversed(unused):
            del graph_def.library.function[i]
