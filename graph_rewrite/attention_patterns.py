"""Attention's products: Einsum (as Keras' MultiHeadAttention emits it) of two
computed operands, as one batched matmul with the layouts folded in.

An equation with shared batch letters, one row letter (left operand and
output), one column letter (right operand and output) and one contracted
letter (both operands), e.g. 'BTNH,BSNH->BNTS' (scores) or 'BNTS,BSNH->BTNH'
(context), is  out = transpose(alpha * x @ op(y), perm)  with x, y the
operands transposed to [batch..., rows, K] and [batch..., K, cols] (or
[batch..., cols, K], taken as an adjoint). A scalar Mul on the left operand
read by nothing else becomes alpha (Keras scales the query this way).
"""

import dataclasses

import numpy as np

from tf_dietcode.graph_rewrite.graph_index import GraphIndex, tensor_name


@dataclasses.dataclass
class AttentionMatch:
    core: str                  # the Einsum node
    x: str                     # left operand (before x_perm)
    y: str                     # right operand (before y_perm)
    x_perm: list[int] | None   # transpose bringing x to [batch..., rows, K]; None: as is
    y_perm: list[int] | None   # transpose bringing y to [batch..., K, cols] or, with adj_y, [batch..., cols, K]
    adj_y: bool
    alpha: float
    perm: list[int]            # product axes -> output axes
    output: str
    form: str = "attention (einsum)"


def _layout(letters: str, order: str) -> list[int] | None:
    """The permutation taking axes spelled `letters` to `order`; None when already in order."""
    perm = [letters.index(c) for c in order]
    return None if perm == list(range(len(perm))) else perm


def find(index: GraphIndex) -> list[AttentionMatch]:
    matches = []
    for node in index.nodes.values():
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
        b, m, n, k = "".join(batch), rows[0], cols[0], contracted[0]
        y_order, adj_y = (b + n + k, True) if rhs.index(n) < rhs.index(k) else (b + k + n, False)
        product = b + m + n
        match = AttentionMatch(node.name, tensor_name(node.input[0]), tensor_name(node.input[1]),
                               _layout(lhs, b + m + k), _layout(rhs, y_order), adj_y, 1.0,
                               [product.index(c) for c in out], f"{node.name}:0")
        scale = index.producer(match.x)
        if scale.op == "Mul" and index.sole_consumer(scale.name) is node:
            inputs = [tensor_name(i) for i in scale.input]
            for value_side, tensor_side in ((0, 1), (1, 0)):
                value = index.value(inputs[value_side])
                if value is not None and np.size(value) == 1 and index.value(inputs[tensor_side]) is None:
                    match.x, match.alpha = inputs[tensor_side], float(value)
                    break
        matches.append(match)
    return matches
