"""Attention's products of two computed operands, as one batched matmul with
layouts, scale and epilogue folded in.

Einsum (as Keras' MultiHeadAttention emits it): an equation with shared batch
letters, one row letter (left operand and output), one column letter (right
operand and output) and one contracted letter, e.g. 'aecd,abcd->acbe'
(scores) or 'acbe,aecd->abcd' (context), is  transpose(alpha * op(x') @ op(y'), perm)
with x', y' the operands permuted to [batch..., rows, K] and [batch..., K, cols]
(or to their adjoints, whichever keeps each operand's last axis last, so the
op reads them in place). The operands are swapped when the output's last
letter is the left operand's row letter, so the product's columns are the
output's contiguous axis (what tuned kernels write).

BatchMatMulV2 (as hand-written BERTs use it): a Transpose of an operand
becomes its operand permutation (an adjoint where it moves the last axis to
second-to-last); a Transpose of the product becomes perm, or else a broadcast
Add of a mask or bias becomes the addend.

Either way a scalar Mul (or a division by a scalar) on the left operand or on
the product becomes alpha (Keras 3's MultiHeadAttention scales the scores,
hand-written BERTs the query or the scores before the mask, Hugging Face's
divide the scores). Every folded node must be read by nothing else.

Each product becomes one DietcodeFusedBatchMatMulAdd or ...Transpose; its
workload is the product's b (all batch matrices), m, n and k, the dynamic
ones tied where they follow one size (attention's rows and columns both
follow the sequence length). Products that read x transposed run the generic
kernel only: tuned kernels read x as is.
"""

import collections
import dataclasses
import math

import tensorflow as tf

from tf_dietcode import ops
from tf_dietcode.graph_rewrite.analysis.graph_index import GraphIndex, tensor_name
from tf_dietcode.graph_rewrite.analysis.symbolic_shapes import SymbolicShapes
from tf_dietcode.graph_rewrite.fusions.contract import Binding, Found, Replacement, Switches, TunedFusion
from tf_dietcode.graph_rewrite.splice import scratch_graph
from tf_dietcode.tuning.workload import Workload


@dataclasses.dataclass
class AttentionMatch:
    core: str                  # the Einsum or BatchMatMulV2 node
    x: str                     # left operand (before x_perm)
    y: str                     # right operand (before y_perm)
    x_perm: list[int] | None   # transpose bringing x to [batch..., rows, K] or, with adj_x, [.., K, rows]
    y_perm: list[int] | None   # transpose bringing y to [batch..., K, cols] or, with adj_y, [.., cols, K]
    adj_y: bool
    alpha: float
    perm: list[int] | None     # product axes -> output axes; None with an addend
    output: str
    form: str = "attention (einsum)"
    adj_x: bool = False
    addend: str | None = None  # added to the product (broadcast); only without perm


def _layout(letters: str, order: str) -> list[int] | None:
    """The permutation taking axes spelled `letters` to `order`; None when already in order."""
    perm = [letters.index(c) for c in order]
    return None if perm == list(range(len(perm))) else perm


def find(index: GraphIndex) -> list[AttentionMatch]:
    matches = []
    for node in index.nodes.values():
        if node.op == "BatchMatMulV2" and node.attr["T"].type == 1:
            match = _batch_matmul(index, node)
            if match is not None:
                _fold_scale(index, match, node)
                matches.append(match)
        if node.op != "Einsum" or len(node.input) != 2 or node.attr["T"].type != 1:
            continue
        equation = node.attr["equation"].s.decode()
        if "..." in equation or "->" not in equation:
            continue
        operands, out = equation.split("->")
        lhs, rhs = operands.split(",")
        if index.value(node.input[1]) is not None or len(set(lhs + rhs)) != len(set(lhs + rhs + out)):
            continue  # a fixed weight (dense), or a letter only in the output
        batch = [c for c in out if c in lhs and c in rhs]
        rows = [c for c in lhs if c in out and c not in rhs]
        cols = [c for c in rhs if c in out and c not in lhs]
        contracted = [c for c in lhs if c in rhs and c not in out]
        if (len(rows), len(cols), len(contracted)) != (1, 1, 1) or \
                len(batch) + 2 != len(lhs) or len(batch) + 2 != len(rhs) or len(out) != len(batch) + 2:
            continue
        inputs = [tensor_name(i) for i in node.input]
        if out[-1] in lhs:  # swap: the product's columns become the output's last axis
            lhs, rhs, rows, cols, inputs = rhs, lhs, cols, rows, inputs[::-1]
        b, m, n, k = "".join(batch), rows[0], cols[0], contracted[0]
        x_order, adj_x = (b + k + m, True) if lhs[-1] == m else (b + m + k, False)
        y_order, adj_y = (b + n + k, True) if rhs[-1] == k else (b + k + n, False)
        product = b + m + n
        match = AttentionMatch(node.name, inputs[0], inputs[1], _layout(lhs, x_order), _layout(rhs, y_order),
                               adj_y, 1.0, [product.index(c) for c in out], f"{node.name}:0", adj_x=adj_x)
        _fold_scale(index, match, node)
        _fold_output_scale(index, match)
        matches.append(match)
    return matches


def _scalar_operand(index: GraphIndex, node, tensor: str) -> float | None:
    """The fixed scalar that Mul(tensor, s), Mul(s, tensor) or RealDiv(tensor, s) scales `tensor`
    by (1/s for the division), or None."""
    inputs = [tensor_name(i) for i in node.input]
    if node.op == "Mul" and tensor in inputs:
        return index.scalar(inputs[1] if inputs[0] == tensor else inputs[0])
    if node.op == "RealDiv" and inputs[0] == tensor:
        divisor = index.scalar(inputs[1])
        return None if divisor is None else 1.0 / divisor
    return None


def _fold_scale(index: GraphIndex, match: AttentionMatch, core) -> None:
    """x = t * scalar (or t / scalar) read only by the product: alpha = the factor, x = t."""
    scale = index.producer(match.x)
    if index.sole_consumer(scale.name) is not core or scale.op not in ("Mul", "RealDiv"):
        return
    for tensor in dict.fromkeys(tensor_name(i) for i in scale.input):
        factor = _scalar_operand(index, scale, tensor)
        if factor is not None and index.value(tensor) is None:
            match.x, match.alpha = tensor, factor
            return


def _fold_output_scale(index: GraphIndex, match: AttentionMatch) -> None:
    """output * scalar (or / scalar) the only reader of the output: alpha times the factor, the
    scaling's output."""
    scale = index.sole_consumer(match.output)
    factor = None if scale is None else _scalar_operand(index, scale, tensor_name(match.output))
    if factor is not None:
        match.alpha *= factor
        match.output = f"{scale.name}:0"


def _folded_transpose(index: GraphIndex, tensor: str, reader) -> tuple[str, list[int] | None, bool] | None:
    """(T, operand perm, adjoint toggled) when tensor = Transpose(T, p) read only by `reader` and
    p keeps T's last axis in one of the last two places; the perm is None when only an adjoint remains."""
    node = index.producer(tensor)
    if node.op != "Transpose" or index.sole_consumer(node.name) is not reader:
        return None
    perm = index.value(node.input[1])
    if perm is None or len(perm) < 2:
        return None
    perm, last = [int(p) for p in perm], len(perm) - 1
    if perm[-1] != last and perm[-2] != last:
        return None
    toggled = perm[-1] != last
    if toggled:
        perm = [*perm[:-2], perm[-1], perm[-2]]
    return tensor_name(node.input[0]), (None if perm == list(range(len(perm))) else perm), toggled


def _batch_matmul(index: GraphIndex, node) -> AttentionMatch | None:
    x, y = tensor_name(node.input[0]), tensor_name(node.input[1])
    shape = index.shape(f"{node.name}:0")
    if index.value(x) is not None or index.value(y) is not None or shape is None:
        return None  # a fixed operand (a dense layer's business), or an unknown rank
    match = AttentionMatch(node.name, x, y, None, None, node.attr["adj_y"].b, 1.0, list(range(len(shape))),
                           f"{node.name}:0", form="attention (BatchMatMulV2)", adj_x=node.attr["adj_x"].b)
    for side in ("x", "y"):
        folded = _folded_transpose(index, getattr(match, side), node)
        if folded is not None:
            source, perm, toggled = folded
            setattr(match, side, source)
            setattr(match, f"{side}_perm", perm)
            setattr(match, f"adj_{side}", getattr(match, f"adj_{side}") != toggled)
    _fold_output_scale(index, match)  # before an addend: (x @ y) * s + mask
    after = index.sole_consumer(match.output)
    if after is not None and after.op == "Transpose":
        perm = index.value(after.input[1])
        if perm is not None:
            match.perm, match.output = [int(p) for p in perm], f"{after.name}:0"
    elif after is not None and after.op in ("Add", "AddV2"):
        inputs = [tensor_name(i) for i in after.input]
        match.addend, match.perm = inputs[1] if inputs[0] == match.output else inputs[0], None
        match.output = f"{after.name}:0"
    return match


def product_dims(match: AttentionMatch, x_shape: list, y_shape: list) -> dict:
    """The product's b (all batch matrices), m, n, k for operands of these shapes: sizes at a
    corner of the shape ranges, or symbolic dims (graph_rewrite.analysis.symbolic_shapes)."""
    x = [x_shape[p] for p in match.x_perm] if match.x_perm else list(x_shape)
    y = [y_shape[p] for p in match.y_perm] if match.y_perm else list(y_shape)
    m, k = (x[-1], x[-2]) if match.adj_x else (x[-2], x[-1])
    n = y[-2] if match.adj_y else y[-1]
    try:
        if k != (y[-1] if match.adj_y else y[-2]):
            raise ValueError("contraction dims differ")
        batch = _broadcast(x[:-2], y[:-2])
    except ValueError as error:
        raise ValueError(f"{match.core}: operands of shapes {x_shape} and {y_shape} "
                         f"cannot be multiplied ({error}); the ranges do not fit the model") from error
    return {"b": math.prod(batch), "m": m, "n": n, "k": k}


def _broadcast(a: list, b: list) -> list:
    """numpy's broadcasting of two batch shapes, for sizes or symbolic dims alike."""
    a, b = [1] * (len(b) - len(a)) + a, [1] * (len(a) - len(b)) + b
    if any(p != 1 and q != 1 and p != q for p, q in zip(a, b)):
        raise ValueError(f"batch dims {a} and {b} do not broadcast")
    return [q if p == 1 else p for p, q in zip(a, b)]


class Attention(TunedFusion):
    name = "attention"
    ops_in_bodies = frozenset({"BatchMatMulV2", "Einsum"})

    def find(self, index: GraphIndex, shapes: SymbolicShapes, switches: Switches) -> Found:
        return Found(find(index))

    def forms(self, match: AttentionMatch) -> tuple[str, ...]:
        return (match.form,)

    def tuned(self, match: AttentionMatch) -> bool:
        return not match.adj_x  # tuned kernels read x as is

    def operands(self, match: AttentionMatch) -> dict[str, str]:
        return {"x": match.x, "y": match.y}

    def sized_by_graph(self, match: AttentionMatch, shapes: SymbolicShapes,
                       cold_weight: bool) -> tuple[Workload, str] | None:
        dims = _symbolic_product_dims(match, shapes)
        ranges = {d: shapes.range_of(e) for d, e in (dims or {}).items()}
        if dims is None or None in ranges.values():
            return None
        return _workload(match, ranges, dims), ", ".join(f"{d.upper()} = {e}" for d, e in dims.items()
                                                           if ranges[d][0] != ranges[d][1])

    def sized_at_corners(self, match: AttentionMatch, observed: dict[str, list[list[int]]],
                         cold_weight: bool) -> tuple[Workload, bool]:
        runs = [product_dims(match, x, y) for x, y in zip(observed["x"], observed["y"])]
        ranges = {d: (min(run[d] for run in runs), max(run[d] for run in runs)) for d in runs[0]}
        return _workload(match, ranges, ranges), all(lo == hi for lo, hi in ranges.values())

    def replacement(self, match: AttentionMatch, binding: Binding) -> Replacement:
        bound = {"x": match.x, "y": match.y, "addend": match.addend, "bundle": binding.bundle}
        return Replacement(_replacement_graph(match), bound, [match.output])


def _workload(match: AttentionMatch, ranges: dict, same_size: dict) -> Workload:
    """The product's workload from the ranges of its dims.

    Dynamic dims are one shape variable where `same_size` gives them the same key: their
    expression when the graph's shapes sized them (attention's rows and columns both follow
    the sequence length), else their range; the largest such group is tied.
    """
    groups = collections.defaultdict(list)
    for d, (lo, hi) in ranges.items():
        if lo != hi:
            groups[same_size[d]].append(d)
    ties = max(groups.values(), key=len, default=[])
    return Workload("batch_matmul", ranges["m"], ranges["n"], ranges["k"], b=ranges["b"],
                    transpose_b=match.adj_y, bias=match.addend is not None,
                    ties=tuple(ties) if len(ties) > 1 else ())


def _symbolic_product_dims(match: AttentionMatch, shapes: SymbolicShapes) -> dict | None:
    """b, m, n, k of a product as expressions of the input dims, or None."""
    x, y = shapes.shape(match.x), shapes.shape(match.y)
    if x is None or y is None or None in x or None in y:
        return None
    try:
        return {d: shapes.canonical(e) for d, e in product_dims(match, x, y).items()}
    except ValueError:
        return None


def _operand_layout(tensor: tf.Tensor, perm: list[int] | None) -> tuple[tf.Tensor, list[int] | None]:
    """The operand and the perm the op reads it through: in place where the perm keeps the last
    axis last, else transposed first (and read as is)."""
    if perm is None or perm[-1] == len(perm) - 1:
        return tensor, perm
    return tf.transpose(tensor, perm), None


def _replacement_graph(match: AttentionMatch) -> tf.compat.v1.GraphDef:
    """alpha * op(x') @ op(y'), then + addend or transposed by perm, with x', y' the operands in
    matmul layout (read in place through x_perm/y_perm where the op can, else transposed first);
    placeholders x, y, addend and bundle."""
    def build():
        x = tf.compat.v1.placeholder(tf.float32, name="x")
        y = tf.compat.v1.placeholder(tf.float32, name="y")
        bundle = tf.compat.v1.placeholder(tf.string, [], name="bundle")
        x, x_perm = _operand_layout(x, match.x_perm)
        y, y_perm = _operand_layout(y, match.y_perm)
        options = {"adj_x": match.adj_x, "adj_y": match.adj_y, "alpha": match.alpha, "x_perm": x_perm,
                   "y_perm": y_perm, "bundle": bundle, "name": "out_0"}
        if match.addend is not None:
            ops.fused_batch_matmul_add(x, y, tf.compat.v1.placeholder(tf.float32, name="addend"), **options)
        else:
            ops.fused_batch_matmul_transpose(x, y, match.perm, **options)
    return scratch_graph(build)
