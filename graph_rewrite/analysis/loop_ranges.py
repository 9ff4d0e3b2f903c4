"""Shapes inside loops' and conds' bodies, derived from the graph without running it.

A While loop's body sees its arguments change per iteration. What each one is
in iteration `n` (a symbol, 0 .. trips - 1) is claimed, then proved by
induction: the body's symbolic shapes are computed from the claims, and its
outputs must be the claims for iteration n + 1 (a claim that fails is dropped,
its dim left unknown, until the rest holds):
- a counter (the body returns it plus a constant step; its start known outside
  the loop): start + step * n;
- an argument the body returns unchanged: as outside the loop, its dims in the
  symbols of the signature's inputs;
- a dim that grows by a constant per iteration (a TensorArray written at the
  counter + 1 and stacked, a cache concatenated with a one-position piece):
  its size before the loop + growth * n.
The number of iterations is bounded by the loop condition's comparisons of a
counter with a bound that does not change across iterations (`i < max_len`,
while_v2's maximum_iterations test, autograph's `for i in tf.range(n)`, also
behind autograph's `break` test): the bound's range comes from a constant, a
scalar input given a range of values (shape_ranges), or what the condition
computes from such (`i < tf.shape(x)[0]`). Without a bound only the unchanged
arguments and dims are claimed. A cond's branches start from the arguments
their caller passes; a loop inside a body returns its arguments in the dims
its body provably keeps. The rest is left to running the model
(tf_dietcode.control_flow).
"""

import dataclasses

import sympy

from tf_dietcode.graph_rewrite.analysis.graph_index import GraphIndex
from tf_dietcode.graph_rewrite.analysis.symbolic_shapes import Given, Shape, SymbolicShapes
from tf_dietcode.graph_rewrite.bodies import CALLS, Body, Call

PASSING = {"Identity", "Cast"}  # ops a counter or a bound is read through
# a comparison as `counter (<, <=) bound`: (op -> strict, whether its operands are swapped)
COMPARISONS = {"Less": (True, False), "LessEqual": (False, False), "Greater": (True, True),
               "GreaterEqual": (False, True)}
SAME_TRUTH = frozenset({"Identity", "Squeeze"})  # a condition read through these (while_v2 squeezes it)
MAX_PROOF_ROUNDS = 6  # each round drops the claims that failed; the rest is proved again


@dataclasses.dataclass
class DerivedBody:
    """A body's shapes, its arguments as its loop or cond proves them, and how the report names
    what was proved."""
    shapes: SymbolicShapes
    how: str


@dataclasses.dataclass(frozen=True)
class TripBound:
    """At most `trips` iterations, from the condition's comparison `text`."""
    trips: int
    text: str


def derive(bodies: list[Body], outer: SymbolicShapes) -> dict[str, DerivedBody]:
    """Per body's `where`: its shapes as derived from its caller (the signature's graph, shaped by
    `outer`, or a derived body). `bodies` in graph_rewrite.bodies.find's order: callers first."""
    by_path = {body.path: body for body in bodies}
    derived: dict[tuple[Call, ...], DerivedBody] = {}
    for body in bodies:
        caller = outer if len(body.path) == 1 else getattr(derived.get(body.path[:-1]), "shapes", None)
        if caller is None:
            continue
        node = caller.index.nodes[body.call.node]
        kind = CALLS[node.op]
        arguments = [i for i in node.input if not i.startswith("^")][kind.first_argument:]
        if not kind.loop:
            given = dataclasses.replace(_passed(body, arguments, caller),
                                        loop_outputs=_loop_outputs(by_path, body.path))
            derived[body.path] = DerivedBody(SymbolicShapes(body.index, {}, {}, given),
                                             f"its arguments as {node.name} passes them")
        elif body.call.attr == "body":
            cond = by_path.get((*body.path[:-1], Call(body.call.node, "cond")))
            result = _loop(body, cond, by_path, arguments, caller) if cond is not None else None
            if result is not None:
                derived[body.path] = result
    return {by_path[path].where: result for path, result in derived.items()}


def _passed(body: Body, arguments: list[str], caller: SymbolicShapes, skip=()) -> Given:
    """The body's arguments (those not in `skip`) as the caller's tensors `arguments`."""
    shapes = {f"{a}:0": caller.shape(t) for a, t in zip(body.arguments, arguments) if a not in skip}
    values = {f"{a}:0": caller.value(t) for a, t in zip(body.arguments, arguments) if a not in skip}
    return Given(shapes, values, _bounds(caller, [*shapes.values(), *values.values()]))


def _bounds(shapes: SymbolicShapes, dims_lists) -> dict[sympy.Symbol, tuple[int, int]]:
    """The bounds of the symbols in some dims (tuples of them, or None)."""
    symbols = {s for dims in dims_lists if dims for d in dims if d is not None for s in d.free_symbols}
    return {s: shapes.bounds[s] for s in symbols if s in shapes.bounds}


@dataclasses.dataclass
class _Loop:
    """A While's body and condition, and what its caller knows of the loop's inputs."""
    body: Body
    cond: Body
    inputs: list[str]             # the While's inputs in the caller's graph, one per argument
    caller: SymbolicShapes

    def __post_init__(self):
        self.outer = dict(zip(self.body.arguments, self.inputs))
        self.unchanged = {a for a, out in zip(self.body.arguments, self.body.outputs)
                          if _through(self.body.index, out).name == a}

    def known(self, tensor: str) -> sympy.Expr | None:
        """A scalar of the body as the caller computes it: a constant, or an argument the loop
        passes unchanged (a captured tensor: autograph's range step)."""
        node = _through(self.body.index, tensor, PASSING)
        if node.name in self.outer:
            value = self.caller.value(self.outer[node.name]) if node.name in self.unchanged else None
            return value[0] if value and len(value) == 1 else None
        value = self.body.index.value(tensor)
        return sympy.Integer(int(value.item())) if value is not None and value.size == 1 else None

    def counters(self) -> dict[str, tuple[sympy.Expr, int]]:
        """argument -> (start, step) of each argument the body returns plus a constant."""
        found = {}
        for a, out in zip(self.body.arguments, self.body.outputs):
            node, start = _through(self.body.index, out), self.caller.value(self.outer[a])
            if node.op not in ("Add", "AddV2") or not start or len(start) != 1 or start[0] is None:
                continue
            operands = [i for i in node.input if not i.startswith("^")]
            for this, other in (operands, operands[::-1]):
                step = self.known(other)
                if _through(self.body.index, this).name == a and step is not None and step.is_Integer and step != 0:
                    found[a] = (start[0], int(step))
                    break
        return found


def _loop(body: Body, cond: Body, by_path: dict, arguments: list[str], caller: SymbolicShapes) -> DerivedBody | None:
    loop = _Loop(body, cond, arguments, caller)
    counters = loop.counters()
    passed = _passed(body, arguments, caller, skip=set(body.arguments) - loop.unchanged)
    bound = _trip_bound(loop, counters, by_path)
    if bound is not None and bound.trips <= 0:
        return None  # the body never runs
    iteration = sympy.Symbol(f"n{len(body.path)}", integer=True, nonnegative=True) if bound else None
    given = Given(dict(passed.shapes), dict(passed.values), dict(passed.bounds), _loop_outputs(by_path, body.path))
    if iteration is not None:
        given.bounds[iteration] = (0, bound.trips - 1)
        for a, (start, step) in counters.items():
            given.shapes[f"{a}:0"], given.values[f"{a}:0"] = (), (start + step * iteration,)
    before = {a: caller.shape(outer) for a, outer in zip(body.arguments, arguments)
              if a not in loop.unchanged and (a not in counters or iteration is None)}
    given.bounds.update(_bounds(caller, before.values()))
    shapes, claims = _proved(body, given, before, iteration)
    grown = [f"{a} dim {axis} = {dim}" for a, dims in claims.items() if dims
             for axis, dim in enumerate(dims) if dim is not None and iteration in dim.free_symbols]
    how = f"{iteration} the iteration, 0..{bound.trips - 1} ({bound.text})" if bound else \
        "the arguments the loop passes unchanged"
    return DerivedBody(shapes, how + "".join(f"; {text}" for text in grown))


def signature_loops(bodies: list[Body]) -> Given:
    """What the signature's graph is given for its symbolic shapes: its loops' results, in the
    dims their bodies provably keep (products reading them are then sized by the graph too)."""
    return Given({}, {}, {}, _loop_outputs({body.path: body for body in bodies}, ()))


def _loop_outputs(by_path: dict, path: tuple[Call, ...]):
    """Given.loop_outputs for the While nodes in the graph at `path` (a body's, or () for the
    signature's): each output shaped as the loop's argument, in the dims the loop's body provably
    leaves unchanged (an argument it returns as is, a dim it keeps), from the shapes of the loop's
    inputs."""
    def outputs(shapes: SymbolicShapes, node, inputs: list[Shape], values: list) -> list[Shape] | None:
        body = by_path.get((*path, Call(node.name, "body")))
        if body is None or len(inputs) != len(body.arguments):
            return None
        unchanged = {a for a, out in zip(body.arguments, body.outputs) if _through(body.index, out).name == a}
        given = Given({f"{a}:0": shape for a, shape in zip(body.arguments, inputs) if a in unchanged},
                      {f"{a}:0": value for a, value in zip(body.arguments, values) if a in unchanged},
                      _bounds(shapes, [*inputs, *values]), _loop_outputs(by_path, body.path))
        _, claims = _proved(body, given, {a: shape for a, shape in zip(body.arguments, inputs) if a not in unchanged},
                            None)
        return [shape if a in unchanged else claims[a] for a, shape in zip(body.arguments, inputs)]
    return outputs


def _proved(body: Body, given: Given, before: dict[str, Shape],
            iteration: sympy.Symbol | None) -> tuple[SymbolicShapes, dict[str, Shape]]:
    """The body's shapes with the changing arguments' dims (`before`: as they enter the loop)
    claimed and proved by induction over `iteration`, and the claims that held."""
    first = SymbolicShapes(body.index, {}, {}, _with(given, {a: (dims, None) for a, dims in before.items()}))
    outputs = dict(zip(body.arguments, body.outputs))
    claims = {a: _claim(dims, first.shape(outputs[a]), iteration, first) for a, dims in before.items()}
    for _ in range(MAX_PROOF_ROUNDS):
        shapes = SymbolicShapes(body.index, {}, {}, _with(given, {a: (dims, None) for a, dims in claims.items()}))
        proved = {a: _holds(dims, shapes.shape(outputs[a]), iteration, shapes) for a, dims in claims.items()}
        if proved == claims:
            break
        claims = proved
    else:  # no claim about the changing arguments held through every round: none is made
        claims = dict.fromkeys(claims)
        shapes = SymbolicShapes(body.index, {}, {}, _with(given, {a: (None, None) for a in claims}))
    return shapes, claims


def _with(given: Given, claims: dict[str, tuple[Shape, None]]) -> Given:
    return dataclasses.replace(given, shapes={**given.shapes, **{f"{a}:0": dims for a, (dims, _) in claims.items()}},
                               values={**given.values, **{f"{a}:0": value for a, (_, value) in claims.items()}})


def _claim(before: Shape, after: Shape, iteration: sympy.Symbol | None, shapes: SymbolicShapes) -> Shape:
    """Per dim what it is in iteration n, from its size before the loop and after the first
    body run from there: unchanged, grown by the constant it grew, or else by one per iteration
    (a list written at a counter's next position: the max of its length and that position)."""
    if before is None or after is None or len(before) != len(after):
        return None
    claimed = []
    for was, now in zip(before, after):
        if was is None or now is None:
            claimed.append(None)
            continue
        growth = shapes.canonical(now - was)
        if growth == 0:
            claimed.append(was)
        elif iteration is None:
            claimed.append(None)
        else:
            claimed.append(was + (growth if growth.is_Integer else 1) * iteration)
    return tuple(claimed)


def _holds(claim: Shape, after: Shape, iteration: sympy.Symbol | None, shapes: SymbolicShapes) -> Shape:
    """The claim with the dims dropped that the body's output does not carry to iteration n + 1."""
    if claim is None or after is None or len(claim) != len(after):
        return None
    following = claim if iteration is None else tuple(None if d is None else d.xreplace({iteration: iteration + 1})
                                                      for d in claim)
    return tuple(d if d is not None and a is not None and sympy.simplify(shapes.canonical(a - f)) == 0 else None
                 for d, f, a in zip(claim, following, after))


def _through(index: GraphIndex, tensor: str, ops=frozenset({"Identity"})):
    node = index.producer(tensor)
    while node.op in ops:
        node = index.producer(node.input[0])
    return node


def _trip_bound(loop: _Loop, counters: dict[str, tuple[sympy.Expr, int]], by_path: dict) -> TripBound | None:
    """The fewest iterations any comparison of a counter with a bound in the condition allows
    (its conjuncts only: each must hold for the body to run)."""
    cond, caller = loop.cond, loop.caller
    names = dict(zip(cond.arguments, loop.body.arguments))  # the condition's argument -> the body's
    # the condition's values, from the arguments the loop passes unchanged (a bound it reads, or
    # computes from them: `i < tf.shape(x)[0]`)
    changing = {c for c, b in names.items() if b not in loop.unchanged}
    reads = SymbolicShapes(cond.index, {}, {}, _passed(cond, loop.inputs, caller, skip=changing))
    bounds = []
    for node in _conjuncts(cond, cond.outputs[0], by_path):
        strict, swapped = COMPARISONS.get(node.op, (None, None))
        if strict is None:
            continue
        left, right = [i for i in node.input if not i.startswith("^")][::-1 if swapped else 1]
        counter = names.get(_through(cond.index, left, PASSING).name)
        if counter not in counters or counters[counter][1] <= 0:
            continue
        (start, step), limit = counters[counter], (reads.value(right) or (None,))[0]
        limit_range, start_range = caller.range_of(limit), caller.range_of(start)
        if limit_range is None or start_range is None:
            continue
        span = limit_range[1] - start_range[0]
        trips = max(-(-span // step) if strict else span // step + 1, 0)
        within = f" in {limit_range[0]}..{limit_range[1]}" if limit_range[0] != limit_range[1] else ""
        bounds.append(TripBound(trips, f"at most {trips} iterations: {node.op}(counter from {start} by {step}, "
                                       f"{limit}{within})"))
    return min(bounds, key=lambda b: b.trips, default=None)


def _conjuncts(cond: Body, tensor: str, by_path: dict) -> list:
    """The nodes whose outputs must all be true where `tensor` is: through LogicalAnd, and through
    an If whose false branch returns False (autograph's `cond(main_test, extra_test, lambda: False)`
    for a loop with `break`)."""
    node = _through(cond.index, tensor, SAME_TRUTH)
    if node.op == "LogicalAnd":
        return [n for i in node.input if not i.startswith("^") for n in _conjuncts(cond, i, by_path)]
    if node.op in ("If", "StatelessIf"):
        otherwise = by_path.get((*cond.path, Call(node.name, "else_branch")))
        returned = None if otherwise is None else otherwise.index.value(otherwise.outputs[0])
        if returned is not None and returned.size == 1 and not bool(returned):
            return _conjuncts(cond, node.input[0], by_path)
    return [node]
