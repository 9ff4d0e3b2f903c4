"""Symbolic shapes: a model's dynamic dims as symbols, carried through its graph.

Every dynamic input dim (a range lo < hi) becomes a symbol, static dims are
integers, and shapes travel through the graph as sympy expressions, together
with the small integer tensors that compute shapes at run time (Shape,
StridedSlice, Pack, Prod, ConcatV2 feeding a Reshape). A dense layer's row
count comes out as, say, `input_ids[0]*input_ids[1]`, so its range follows
from the input ranges without running the model, and two dims are one shape
variable because the graph says so, not because their ranges happen to agree.

Shape constraints (the seeds' idea): where an elementwise op broadcasts two
dims that are not literally 1, or a product contracts two dims, they are
taken to be equal and their symbols are merged (a key length and its mask's
width become one symbol). A dim that is 1 at run time may still broadcast;
the equality only steers tuning, never correctness.

An integer scalar input given a range of values (a loop's length) is a
symbol in the values it takes part in. A TensorList (TensorArray's form in
graphs) is shaped as its stack would be: [length, *element shape]. A loop's
body starts from what the loop proves of its arguments (`Given`,
analysis.loop_ranges): dims in symbols of the signature's inputs and of the
iteration.

An op without a rule keeps TF's static shape, its unknown dims unknown; a
layer that depends on one cannot be sized here (`range_of` gives None).
"""

import dataclasses
import math
import string
from collections.abc import Callable

import numpy as np
import sympy

from tf_dietcode.graph_rewrite.analysis.graph_index import GraphIndex, tensor_name

Dim = sympy.Expr | None
Shape = tuple[Dim, ...] | None

UNARY = {"Abs", "Cast", "Ceil", "ClipByValue", "Cumsum", "Elu", "EnsureShape", "Erf", "Erfc", "Exp", "Floor", "Gelu",
         "Identity", "IdentityN", "LeakyRelu", "Log", "LogSoftmax", "MatrixBandPart", "Neg", "OnesLike",
         "Reciprocal", "Relu", "Relu6", "Round", "Rsqrt", "Selu", "Sigmoid", "Sign", "Snapshot", "Softmax",
         "Softplus", "Sqrt", "Square", "StopGradient", "Tanh", "ZerosLike"}  # output shaped as the first input
KEEPS_VALUE = {"Cast", "Identity", "IdentityN", "Snapshot", "StopGradient"}
KEEPS_VALUES = KEEPS_VALUE | {"ExpandDims", "Reshape", "Squeeze"}  # the same elements, reshaped
BROADCASTING = {"Add", "AddV2", "BiasAdd", "Div", "DivNoNan", "Equal", "FloorDiv", "FloorMod", "Greater",
                "GreaterEqual", "Less", "LessEqual", "LogicalAnd", "LogicalOr", "Maximum", "Minimum", "Mul",
                "NotEqual", "Pow", "RealDiv", "SelectV2", "SquaredDifference", "Sub"}
ARITHMETIC = {"Add": lambda a, b: a + b, "AddV2": lambda a, b: a + b, "Sub": lambda a, b: a - b,
              "Mul": lambda a, b: a * b, "FloorDiv": lambda a, b: sympy.floor(a / b),
              "Maximum": sympy.Max, "Minimum": sympy.Min}
REDUCTIONS = {"All", "Any", "Max", "Mean", "Min", "Prod", "Sum"}
MAX_VALUE_ELEMENTS = 16  # integer tensors this small are followed element by element (shape vectors)


@dataclasses.dataclass
class Given:
    """What is known of some tensors before their graph is read (a loop body's arguments): their
    shapes and small integer values, in symbols bounded by `bounds`; and what a While node in
    the graph returns: loop_outputs(shapes, node, its inputs' shapes, their values) -> the
    shape of each output, or None (TF's static shapes)."""
    shapes: dict[str, Shape]
    values: dict[str, tuple[Dim, ...] | None]
    bounds: dict[sympy.Symbol, tuple[int, int]]
    loop_outputs: Callable[["SymbolicShapes", object, list[Shape], list], list[Shape] | None] | None = None


class SymbolicShapes:
    def __init__(self, index: GraphIndex, inputs: dict[str, str], ranges: dict[str, list[tuple[int, int]]],
                 given: Given | None = None):
        """inputs: input name -> its tensor in the graph; ranges: input name -> (lo, hi) per dim (a
        scalar's: of its values, shape_ranges); given: what is known of other tensors."""
        self.index = index
        self.bounds: dict[sympy.Symbol, tuple[int, int]] = {}
        self._merged: dict[sympy.Symbol, sympy.Symbol] = {}
        self._inputs: dict[sympy.Symbol, tuple[str, int]] = {}
        self._slice_limits: dict[sympy.Symbol, int] = {}  # a symbol that slices a static dim: at most its size
        self._index_bounds: dict[str, tuple[sympy.Expr, sympy.Expr]] = {}  # integer tensor -> (min, max) element
        self._never_true: set[str] = set()  # boolean tensors known to be all false
        self._length_only: set[str] = set()  # TensorLists shaped [length] alone: their elements' rank unknown
        self._shapes: dict[str, Shape] = {}
        self._values: dict[str, tuple[Dim, ...] | None] = {}
        for name, tensor in inputs.items():
            if index.shape(tensor) == []:
                self._shapes[tensor_name(tensor)] = ()
                self._values[tensor_name(tensor)] = self._scalar_value(name, ranges[name])
                continue
            dims = []
            for axis, (lo, hi) in enumerate(ranges[name]):
                if lo == hi:
                    dims.append(sympy.Integer(lo))
                else:
                    symbol = sympy.Symbol(f"{name}[{axis}]", integer=True, nonnegative=True)
                    self.bounds[symbol] = (lo, hi)
                    self._inputs[symbol] = (name, axis)
                    dims.append(symbol)
            self._shapes[tensor_name(tensor)] = tuple(dims)
            self._values[tensor_name(tensor)] = None
        self._loop_outputs = None if given is None else given.loop_outputs
        if given is not None:
            self.bounds.update(given.bounds)
            self._shapes.update({tensor_name(t): shape for t, shape in given.shapes.items()})
            self._values.update({tensor_name(t): value for t, value in given.values.items()})
        for node in _topological_order(index):
            if f"{node.name}:0" not in self._shapes:
                self._visit(node)

    def _scalar_value(self, name: str, value_range: list[tuple[int, int]]) -> tuple[Dim] | None:
        """A scalar input's value: a symbol where shape_ranges gives it a range of values."""
        if not value_range:
            return None
        ((lo, hi),) = value_range
        if lo == hi:
            return (sympy.Integer(lo),)
        symbol = sympy.Symbol(name, integer=True, nonnegative=lo >= 0)
        self.bounds[symbol] = (lo, hi)
        return (symbol,)

    # ---- what callers ask -------------------------------------------------------------------------

    def shape(self, tensor: str) -> Shape:
        shape = self._shapes.get(tensor_name(tensor))
        return None if shape is None else tuple(None if d is None else self.canonical(d) for d in shape)

    def value(self, tensor: str) -> tuple[Dim, ...] | None:
        """A small integer tensor's elements (shape vectors, scalars), as far as they are known."""
        value = self._values.get(tensor_name(tensor))
        return None if value is None else tuple(None if v is None else self.canonical(v) for v in value)

    def canonical(self, expr: sympy.Expr) -> sympy.Expr:
        """The expression in terms of each merged group's one symbol."""
        expr = sympy.sympify(expr)
        return expr.xreplace({s: self._root(s) for s in expr.free_symbols})

    def range_of(self, expr: Dim) -> tuple[int, int] | None:
        """(lo, hi) of an expression over the input ranges, or None when it is not a polynomial with
        non-negative coefficients (then its extremes need not sit at the corners)."""
        if expr is None:
            return None
        expr = self.canonical(expr)
        if expr.is_Integer:
            return int(expr), int(expr)
        if expr.has(sympy.zoo, sympy.nan, sympy.oo, -sympy.oo):
            return None
        symbols = sorted(expr.free_symbols, key=str)
        if not set(symbols) <= set(self.bounds):
            return None
        try:
            coefficients = sympy.Poly(expr, *symbols).coeffs()
        except sympy.polys.polyerrors.BasePolynomialError:
            return None
        if any(c < 0 for c in coefficients):
            return None
        lo, hi = (expr.xreplace({s: sympy.Integer(self.bounds[s][end]) for s in symbols}) for end in (0, 1))
        return (int(lo), int(hi)) if lo.is_Integer and hi.is_Integer else None

    def declared_maxima(self) -> dict[tuple[str, int], int]:
        """(input, axis) -> the largest size the graph allows that dim: the model slices a static
        dim by it (BERT's position table, `table[:T]`, or a gather of `range(T)` from it), so a
        longer input would not fit."""
        limits: dict[sympy.Symbol, int] = {}
        for symbol, limit in self._slice_limits.items():  # recorded before later merges
            root = self._root(symbol)
            limits[root] = min(limits.get(root, limit), limit)
        return {dim: limits[self._root(s)] for s, dim in self._inputs.items() if self._root(s) in limits}

    def same(self, a: Dim, b: Dim) -> bool:
        return a is not None and b is not None and self.canonical(a) == self.canonical(b)

    # ---- shape constraints --------------------------------------------------------------------------

    def _root(self, symbol: sympy.Symbol) -> sympy.Symbol:
        while symbol in self._merged:
            symbol = self._merged[symbol]
        return symbol

    def equate(self, a: Dim, b: Dim) -> None:
        """Records a == b where both are (merged) symbols; other equalities are not used."""
        if a is None or b is None:
            return
        a, b = self.canonical(a), self.canonical(b)
        if a != b and a.is_Symbol and b.is_Symbol and a in self.bounds and b in self.bounds:
            keep, drop = sorted((a, b), key=str)
            self._merged[drop] = keep
            (klo, khi), (dlo, dhi) = self.bounds[keep], self.bounds[drop]
            self.bounds[keep] = (max(klo, dlo), max(min(khi, dhi), max(klo, dlo)))

    def _note_slice_limit(self, stop: sympy.Expr, dim: sympy.Expr) -> None:
        stop = self.canonical(stop)
        if stop.is_Symbol and stop in self.bounds and dim.is_Integer:
            self._slice_limits[stop] = min(self._slice_limits.get(stop, int(dim)), int(dim))

    def broadcast(self, *shapes: Shape) -> Shape:
        if any(s is None for s in shapes):
            return None
        rank = max(len(s) for s in shapes)
        result = []
        for dims in zip(*[(sympy.Integer(1),) * (rank - len(s)) + tuple(s) for s in shapes]):
            sized = [d for d in dims if d is not None and d != 1]
            if any(d is None for d in dims) and not any(d is not None and d.is_Integer and d != 1 for d in dims):
                result.append(None)
                continue
            for other in sized[1:]:
                self.equate(sized[0], other)
            static = [d for d in sized if d.is_Integer]
            result.append(static[0] if static else sized[0] if sized else sympy.Integer(1))
        return tuple(result)

    # ---- propagation ------------------------------------------------------------------------------------

    def _visit(self, node) -> None:
        inputs = [tensor_name(i) for i in node.input if not i.startswith("^")]
        for tensor in inputs:
            if tensor not in self._shapes:  # an op's second output: TF's static answer
                self._shapes[tensor] = self._static_shape(tensor)
                self._values[tensor] = self._static_value(tensor, self._shapes[tensor])
        shapes = [self._shapes[t] for t in inputs]
        values = [self._values[t] for t in inputs]
        looped = self._loop_outputs(self, node, shapes, values) \
            if self._loop_outputs is not None and node.op in ("While", "StatelessWhile") else None
        for i, shape in enumerate(looped or ()):
            self._shapes[f"{node.name}:{i}"], self._values[f"{node.name}:{i}"] = shape, None
        if looped:
            return
        try:
            shape, value = self._propagate(node, shapes, values)
        except (ArithmeticError, IndexError, TypeError, ValueError):  # inputs a rule does not expect
            shape, value = None, None
        output = f"{node.name}:0"
        if shape is None:
            shape = self._static_shape(output)
        if value is None:
            value = self._static_value(output, shape)
        self._shapes[output], self._values[output] = shape, value
        if node.op == "IdentityN":  # output i is input i (custom gradients return their results so)
            for i in range(1, len(inputs)):
                self._shapes[f"{node.name}:{i}"], self._values[f"{node.name}:{i}"] = shapes[i], values[i]
        if node.op == "TopKV2":  # the indices, shaped as the values
            self._shapes[f"{node.name}:1"], self._values[f"{node.name}:1"] = self._shapes[output], None
        self._follow_index_bounds(node, inputs, values, output)

    def _follow_index_bounds(self, node, inputs: list[str], values: list, output: str) -> None:
        """Bounds of integer tensors built from `range` (position ids), far enough to see that a
        gather by them reads the first `limit` rows of a table: Keras' `take` wraps negative
        indices (`where(i < 0, i + n, i)`), a branch never taken for a range from 0."""
        bounds = [self._index_bounds.get(t) for t in inputs]
        if node.op == "Range" and all(v is not None and len(v) == 1 and v[0] is not None for v in values):
            (start,), (limit,), (delta,) = values
            if delta == 1 and start.is_Integer and start >= 0:
                self._index_bounds[output] = (start, limit - 1)
        elif node.op in KEEPS_VALUES and bounds[0] is not None:
            self._index_bounds[output] = bounds[0]
        elif node.op == "Less" and bounds[0] is not None and _constant(values[1]) is not None:
            if all((bounds[0][0] - c).is_nonnegative for c in _constant(values[1])):
                self._never_true.add(output)
        elif node.op == "SelectV2" and inputs[0] in self._never_true and bounds[2] is not None:
            self._index_bounds[output] = bounds[2]
        elif node.op in ("GatherV2", "ResourceGather") and bounds[1] is not None and node.attr["batch_dims"].i == 0:
            params, axis = self._gathered(node, self._shapes[inputs[0]], values)
            if params is not None and axis is not None:
                self._note_slice_limit(bounds[1][1] + 1, params[axis])

    def _gathered(self, node, params: Shape, values: list) -> tuple[Shape, int | None]:
        """A gather's params shape and axis (ResourceGather reads the variable its handle names,
        along axis 0)."""
        if node.op == "ResourceGather":
            variable = self.index.variable_value(node.input[0])
            return (None, None) if variable is None else (_integers(np.shape(variable)), 0)
        axis = _constant(values[2])
        return (None, None) if params is None or axis is None else (params, axis[0] % len(params))

    def _propagate(self, node, shapes: list[Shape], values: list) -> tuple[Shape, tuple | None]:
        """The node's first output: its shape and, for a small integer tensor, its elements."""
        rule = getattr(self, f"_rule_{node.op}", None)
        if node.op in UNARY:
            return shapes[0], values[0] if node.op in KEEPS_VALUE else None
        if node.op in BROADCASTING:
            shape = self.broadcast(*shapes)
            return shape, _elementwise(ARITHMETIC.get(node.op), values, shape)
        if node.op in REDUCTIONS:
            return self._reduce(node, shapes[0], values[0], values[1])
        return rule(node, shapes, values) if rule is not None else (None, None)

    def _static_shape(self, tensor: str) -> Shape:
        try:
            static = self.index.graph.get_tensor_by_name(tensor).shape
        except (KeyError, ValueError):
            return None
        return None if static.rank is None else tuple(None if d is None else sympy.Integer(d)
                                                      for d in static.as_list())

    def _static_value(self, tensor: str, shape: Shape) -> tuple[Dim, ...] | None:
        if shape is None or len(shape) > 1 or not all(d is not None and d.is_Integer for d in shape):
            return None
        if math.prod(int(d) for d in shape) > MAX_VALUE_ELEMENTS:
            return None
        try:
            value = self.index.value(tensor)
        except (KeyError, ValueError, TypeError):
            return None
        if value is None or not np.issubdtype(np.asarray(value).dtype, np.integer):
            return None
        return tuple(sympy.Integer(int(v)) for v in np.ravel(value))

    def _rule_ReadVariableOp(self, node, shapes, values):
        value = self.index.value(f"{node.name}:0")
        return (None if value is None else _integers(np.shape(value))), None

    def _rule_Const(self, node, shapes, values):
        return _integers(d.size for d in node.attr["value"].tensor.tensor_shape.dim), None  # value: _static_value

    def _rule_Shape(self, node, shapes, values):
        return (None if shapes[0] is None else (sympy.Integer(len(shapes[0])),)), shapes[0]

    def _rule_Pack(self, node, shapes, values):
        axis = node.attr["axis"].i
        shape = shapes[0]
        if shape is not None:
            axis = axis % (len(shape) + 1)
            shape = (*shape[:axis], sympy.Integer(len(shapes)), *shape[axis:])
        scalars = all(v is not None and len(v) == 1 and s == () for v, s in zip(values, shapes))
        return shape, tuple(v[0] for v in values) if scalars else None

    def _rule_ConcatV2(self, node, shapes, values):
        axis, parts = _constant(values[-1]), shapes[:-1]
        if axis is None or any(s is None for s in parts):
            return None, None
        axis = axis[0] % len(parts[0])
        joined = [None if any(s[axis] is None for s in parts) else sum(s[axis] for s in parts)]
        shape = self.broadcast(*(s[:axis] + s[axis + 1:] for s in parts))
        shape = None if shape is None else (*shape[:axis], *joined, *shape[axis:])
        pieces = values[:-1]
        value = sum(pieces, ()) if all(v is not None for v in pieces) and len(parts[0]) == 1 else None
        return shape, value

    def _rule_GatherV2(self, node, shapes, values):
        (params, axis), indices = self._gathered(node, shapes[0], values), shapes[1]
        if params is None or indices is None or axis is None:
            return None, None
        batch_dims = node.attr["batch_dims"].i  # leading dims params and indices share (negative: from the end)
        batch_dims += len(indices) if batch_dims < 0 else 0
        shape = (*params[:axis], *indices[batch_dims:], *params[axis + 1:])
        picks = _constant(values[1])
        value = None if values[0] is None or picks is None or batch_dims else tuple(values[0][i] for i in picks)
        return shape, value

    _rule_ResourceGather = _rule_GatherV2

    def _rule_Range(self, node, shapes, values):
        if any(v is None or len(v) != 1 or v[0] is None for v in values):
            return None, None
        (start,), (limit,), (delta,) = values
        if not delta.is_Integer or delta <= 0:
            return None, None
        length = sympy.ceiling((limit - start) / delta)
        return (length if length.is_nonnegative else sympy.Max(length, 0),), None

    def _rule_Slice(self, node, shapes, values):
        source, begin, size = shapes[0], values[1], values[2]
        if source is None or begin is None or size is None or None in begin or None in size:
            return None, None
        shape = []
        for start, length, dim in zip(begin, size, source):
            if length == -1:
                length = None if dim is None else dim - start
            elif dim is not None:
                self._note_slice_limit(start + length, dim)
            shape.append(length)
        return tuple(shape), None

    def _rule_StridedSlice(self, node, shapes, values):
        begin, end, strides = values[1:4]
        source = shapes[0]
        if source is None or begin is None or end is None or strides is None or node.attr["ellipsis_mask"].i:
            return None, None
        masks = {k: node.attr[f"{k}_mask"].i for k in ("begin", "end", "shrink_axis", "new_axis")}
        shape, picks, axis = [], [], 0  # spec entry i slices source axis `axis` (new axes take none)
        for i in range(len(begin)):
            if masks["new_axis"] >> i & 1:  # x[None, ...]
                shape.append(sympy.Integer(1))
                continue
            if axis >= len(source):
                return None, None
            dim = source[axis]
            axis += 1
            start = sympy.Integer(0) if masks["begin"] >> i & 1 else begin[i]
            stop = dim if masks["end"] >> i & 1 else end[i]
            if masks["shrink_axis"] >> i & 1:
                picks.append(start)
                continue
            if strides[i] != 1 or start is None or stop is None or dim is None:
                return None, None
            self._note_slice_limit(stop, dim)
            start, stop = (_clamp(v, dim) for v in (start, stop))
            shape.append(sympy.Max(stop - start, 0) if not (stop - start).is_nonnegative else stop - start)
            picks.append(slice(start, stop))
        shape += source[axis:]
        value = None
        if len(source) == 1 and values[0] is not None and picks and not masks["new_axis"]:
            pick = picks[0]
            if isinstance(pick, slice) and all(p is None or p.is_Integer for p in (pick.start, pick.stop)):
                value = values[0][int(pick.start or 0):None if pick.stop is None else int(pick.stop)]
            elif not isinstance(pick, slice) and pick is not None and pick.is_Integer:
                value = (values[0][int(pick)],)
        return tuple(shape), value

    def _rule_Reshape(self, node, shapes, values):
        target = values[1]
        if target is None:
            return None, None
        if any(d is None for d in target):
            return tuple(None if d is None or d == -1 else d for d in target), None
        if -1 in target:
            if shapes[0] is None or any(d is None for d in shapes[0]):
                return tuple(None if d == -1 else d for d in target), None
            known = math.prod(d for d in target if d != -1)
            target = tuple(sympy.cancel(math.prod(shapes[0]) / known) if d == -1 else d for d in target)
        return tuple(target), None

    def _rule_Transpose(self, node, shapes, values):
        perm = _constant(values[1])
        if shapes[0] is None or perm is None:
            return None, None
        return tuple(shapes[0][p] for p in perm), None

    def _rule_ExpandDims(self, node, shapes, values):
        axis = _constant(values[1])
        if shapes[0] is None or axis is None:
            return None, None
        axis = axis[0] % (len(shapes[0]) + 1)
        return (*shapes[0][:axis], sympy.Integer(1), *shapes[0][axis:]), None

    def _rule_Squeeze(self, node, shapes, values):
        if shapes[0] is None:
            return None, None
        axes = {a % len(shapes[0]) for a in node.attr["squeeze_dims"].list.i}
        if not axes and any(d is None or not d.is_Integer for d in shapes[0]):
            return None, None
        return tuple(d for i, d in enumerate(shapes[0]) if (i not in axes if axes else d != 1)), None

    def _rule_Fill(self, node, shapes, values):
        return values[0], None

    def _rule_ArgMax(self, node, shapes, values):
        axis = _constant(values[1])
        if shapes[0] is None or axis is None:
            return None, None
        axis = axis[0] % len(shapes[0])
        return (*shapes[0][:axis], *shapes[0][axis + 1:]), None

    _rule_ArgMin = _rule_ArgMax

    def _rule_TopKV2(self, node, shapes, values):
        k = _constant(values[1])
        return (None if shapes[0] is None or k is None else (*shapes[0][:-1], sympy.Integer(k[0]))), None

    # TensorLists (TensorArrays), shaped as their stack: [length, *element shape]

    def _rule_TensorListReserve(self, node, shapes, values):
        return self._new_list(node, values[1][0] if values[1] else None, shapes[0], values[0]), None

    def _rule_EmptyTensorList(self, node, shapes, values):
        return self._new_list(node, sympy.Integer(0), shapes[0], values[0]), None

    def _new_list(self, node, length: Dim, element_shape: Shape, element: tuple | None) -> Shape:
        """A new list's shape from its length and element_shape input (-1 dims unknown). Of one
        whose elements' rank is unknown (element_shape -1) only the length is followed: it is
        shaped [length] and its stack is not known until an item is set."""
        if length is None:
            return None
        if element_shape == () or element is None:
            self._length_only.add(f"{node.name}:0")
            return (length,)
        return (length, *(None if d is None or d == -1 else d for d in element))

    def _rule_TensorListFromTensor(self, node, shapes, values):
        return shapes[0], None

    def _rule_TensorListSetItem(self, node, shapes, values):
        (length, *_), (index,), item = shapes[0], values[1], shapes[2]
        if item is None or length is None or index is None:
            return None, None
        grown = sympy.Max(length, index + 1) if node.attr["resize_if_index_out_of_bounds"].b else length
        return (grown, *item), None

    def _rule_TensorListPushBack(self, node, shapes, values):
        (length, *_), item = shapes[0], shapes[1]
        return (None if item is None or length is None else (length + 1, *item)), None

    def _rule_TensorListStack(self, node, shapes, values):
        return self._listed(node, shapes[0]), None

    def _rule_TensorListGetItem(self, node, shapes, values):
        stacked = self._listed(node, shapes[0])
        return (None if stacked is None else stacked[1:]), None

    def _rule_TensorListLength(self, node, shapes, values):
        return (), (shapes[0][0],) if shapes[0] else None

    def _listed(self, node, shape: Shape) -> Shape:
        """A list's stacked shape where it is known (a list no rule followed is shaped as a scalar
        variant: it tells nothing)."""
        return shape if shape and tensor_name(node.input[0]) not in self._length_only else None

    def _rule_LookupTableFindV2(self, node, shapes, values):
        """A table lookup (StringLookup's token ids): a value, shaped like the default, per key."""
        keys, default = shapes[1], shapes[2]
        return (None, None) if keys is None or default is None else (keys + default, None)

    def _rule_MatMul(self, node, shapes, values):
        a, b = shapes
        if a is None or b is None:
            return None, None
        m, ka = (a[1], a[0]) if node.attr["transpose_a"].b else (a[0], a[1])
        kb, n = (b[1], b[0]) if node.attr["transpose_b"].b else (b[0], b[1])
        self.equate(ka, kb)
        return (m, n), None

    def _rule_BatchMatMulV2(self, node, shapes, values):
        x, y = shapes
        if x is None or y is None:
            return None, None
        m, kx = (x[-1], x[-2]) if node.attr["adj_x"].b else (x[-2], x[-1])
        ky, n = (y[-1], y[-2]) if node.attr["adj_y"].b else (y[-2], y[-1])
        self.equate(kx, ky)
        batch = self.broadcast(x[:-2], y[:-2])
        return (None if batch is None else (*batch, m, n)), None

    _rule_BatchMatMulV3 = _rule_BatchMatMulV2

    def _rule_Einsum(self, node, shapes, values):
        equation = node.attr["equation"].s.decode().replace(" ", "")
        operands, _, output = equation.partition("->")
        operands = operands.split(",")
        if "." in equation or len(operands) != len(shapes) or any(s is None for s in shapes):
            return None, None
        sizes: dict[str, Dim] = {}
        for letters, shape in zip(operands, shapes):
            for letter, dim in zip(letters, shape):
                if letter in sizes and dim != 1 and sizes[letter] != 1:
                    self.equate(sizes[letter], dim)
                if letter not in sizes or sizes[letter] == 1:
                    sizes[letter] = dim
        if not set(output) <= set(sizes) or not set(equation) - set("->,") <= set(string.ascii_letters):
            return None, None
        return tuple(sizes[letter] for letter in output), None

    def _reduce(self, node, shape: Shape, value, axes):
        axes = _constant(axes)
        if shape is None or axes is None:
            return None, None
        axes = {a % max(len(shape), 1) for a in axes}
        keep = node.attr["keep_dims"].b
        reduced = tuple(sympy.Integer(1) if i in axes else d for i, d in enumerate(shape) if keep or i not in axes)
        if node.op in ("Prod", "Sum") and value is not None and len(shape) == 1 and axes == {0}:
            return reduced, (math.prod(value) if node.op == "Prod" else sum(value),) \
                if all(v is not None for v in value) else None
        return reduced, None


def _integers(shape) -> tuple[sympy.Integer, ...]:
    return tuple(sympy.Integer(int(d)) for d in shape)


def _constant(value) -> list[int] | None:
    """An integer tensor's elements when every one is a known number (axes, permutations)."""
    if value is None or any(v is None or not v.is_Integer for v in value):
        return None
    return [int(v) for v in value]


def _clamp(index: sympy.Expr, dim: sympy.Expr) -> sympy.Expr:
    """A slice bound as Python reads it: negative counts from the end."""
    return dim + index if index.is_negative else index


def _elementwise(operation, values, shape: Shape):
    """Shape arithmetic (e.g. batch * heads) on small integer vectors, broadcasting scalars."""
    if operation is None or shape is None or len(shape) > 1 or any(v is None for v in values):
        return None
    length = max(len(v) for v in values)
    if any(len(v) not in (1, length) for v in values):
        return None
    columns = [v * length if len(v) == 1 else v for v in values]
    return tuple(operation(*elements) if None not in elements else None for elements in zip(*columns))


def _topological_order(index: GraphIndex):
    """Nodes with every data input before them (Kahn's algorithm; GraphDefs need not be sorted)."""
    waiting = {name: {i.lstrip("^").split(":")[0] for i in node.input} & index.nodes.keys()
               for name, node in index.nodes.items()}
    users: dict[str, list[str]] = {}
    for name, sources in waiting.items():
        for source in sources:
            users.setdefault(source, []).append(name)
    ready = [name for name, sources in waiting.items() if not sources]
    order = []
    while ready:
        name = ready.pop()
        order.append(index.nodes[name])
        for user in users.get(name, []):
            waiting[user].discard(name)
            if not waiting[user]:
                ready.append(user)
    return order
