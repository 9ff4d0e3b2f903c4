"""Differential fuzzing of every fused op, generic and tuned, against its TF
reference (tf_dietcode.reference): drawn shapes (empty ones too), broadcast
batches, operand and output permutations, adjoints, scales, activations, and
values of any magnitude with NaN, infinities and denormals mixed in.

Profiles: "ci" (the default) is bounded; TF_DIETCODE_FUZZ=long runs many more
examples. Examples follow the suite's seed (TF_DIETCODE_TEST_SEED repeats a
run); a failure prints the shrunk example.
"""

import os
from collections.abc import Callable
from typing import NamedTuple

import numpy as np
from hypothesis import example, given, seed, settings
from hypothesis import strategies as st

from conftest import SEED, assert_matches_reference
from tf_dietcode import ops, reference
from tuned_calls import expected_kernel, kernel_used, weight_operand

settings.register_profile("ci", max_examples=60, deadline=None, print_blob=True)
settings.register_profile("long", parent=settings.get_profile("ci"), max_examples=3000)
FUZZ = settings.get_profile(os.environ.get("TF_DIETCODE_FUZZ", "ci"))

# Magnitudes: ordinary, denormal, tiny (products underflow), huge (sums near float32's
# limit) and too huge (products overflow).
SCALES = (1.0, 1e-3, 1e3, 1e-40, 1e-30, 1e18, 1e30)
SPECIALS = (np.nan, np.inf, -np.inf, -0.0, 1e-45, -1e-39, 3e38, -3e38)
DIMS = st.one_of(st.integers(1, 4), st.integers(0, 70))
BATCH_DIMS = st.one_of(st.integers(1, 4), st.integers(0, 20))


@st.composite
def arrays(draw, shape):
    """float32 values of one drawn magnitude, with a few IEEE specials put in."""
    size = int(np.prod(shape))
    scale = draw(st.sampled_from(SCALES))
    values = np.random.default_rng(draw(st.integers(0, 2**32 - 1))).uniform(-scale, scale, size)
    if size:
        for index, special in draw(st.lists(st.tuples(st.integers(0, size - 1), st.sampled_from(SPECIALS)),
                                            max_size=3)):
            values[index] = special
    return values.astype(np.float32).reshape(shape)


def packed(w, tile_n, blocks):
    """w[K, N] as a packed b[blocks, K, tile_n], padded with NaN: the op must never read past N."""
    k, n = w.shape
    padded = np.full((k, blocks * tile_n), np.nan, np.float32)
    padded[:, :n] = w
    return np.ascontiguousarray(padded.reshape(k, blocks, tile_n).transpose(1, 0, 2))


@st.composite
def matmul_calls(draw):
    """(inputs, attrs) of DietcodeFusedMatMul: any layout, a packed b, bias or none, any activation."""
    m, k, n = draw(DIMS), draw(DIMS), draw(DIMS)
    transpose_a = draw(st.booleans())
    a = draw(arrays((k, m) if transpose_a else (m, k)))
    bias = draw(st.none() | arrays((n,)))
    attrs = {"transpose_a": transpose_a, "transpose_b": False,
             "activation": draw(st.sampled_from(sorted(reference.ACTIVATIONS))), "packed_n": 0}
    if n > 0 and draw(st.booleans()):
        tile_n = draw(st.integers(1, 9))
        b = packed(draw(arrays((k, n))), tile_n, -(-n // tile_n) + draw(st.integers(0, 1)))
        attrs["packed_n"] = n
    else:
        attrs["transpose_b"] = draw(st.booleans())
        b = draw(arrays((n, k) if attrs["transpose_b"] else (k, n)))
    return [a, b, bias], attrs


def broadcast_into(draw, dims):
    """A shape that broadcasts to `dims` without growing it: trailing dims, some set to 1."""
    return [d if draw(st.booleans()) else 1 for d in dims[draw(st.integers(0, len(dims))):]]


def read_through(draw, logical):
    """A stored shape and operand permutation (last axis kept last) that reads as `logical`."""
    if not draw(st.booleans()):
        return logical, None
    perm = [*draw(st.permutations(range(len(logical) - 1))), len(logical) - 1]
    stored = [0] * len(logical)
    for axis, source in enumerate(perm):
        stored[source] = logical[axis]
    return stored, perm


@st.composite
def batch_operands(draw):
    """x, y, attrs (adjoints, alpha, operand permutations) and the product's shape."""
    batch = draw(st.lists(st.integers(1, 3), max_size=3))
    m, k, n = draw(BATCH_DIMS), draw(BATCH_DIMS), draw(BATCH_DIMS)
    adj_x, adj_y = draw(st.booleans()), draw(st.booleans())
    xb, yb = broadcast_into(draw, batch), broadcast_into(draw, batch)
    x_shape, x_perm = read_through(draw, xb + ([k, m] if adj_x else [m, k]))
    y_shape, y_perm = read_through(draw, yb + ([n, k] if adj_y else [k, n]))
    attrs = {"adj_x": adj_x, "adj_y": adj_y, "alpha": draw(st.sampled_from([1.0, 0.125, -3.0, 0.0])),
             "x_perm": x_perm, "y_perm": y_perm}
    return draw(arrays(x_shape)), draw(arrays(y_shape)), attrs, [*np.broadcast_shapes(xb, yb), m, n]


@st.composite
def batch_add_calls(draw):
    x, y, attrs, product = draw(batch_operands())
    return [x, y, draw(arrays(broadcast_into(draw, product)))], attrs


@st.composite
def batch_transpose_calls(draw):
    x, y, attrs, product = draw(batch_operands())
    return [x, y], {**attrs, "perm": draw(st.permutations(range(len(product))))}


def check(fused, reference_fn, call):
    inputs, attrs = call
    assert_matches_reference(fused(*inputs, **attrs), reference_fn, inputs, **attrs)


@FUZZ
@seed(SEED)
@given(matmul_calls())
# Found by a CI seed: no rows and no K (the reference once read this as one row).
@example(([np.zeros((0, 0), np.float32), np.zeros((0, 1), np.float32), None],
          {"transpose_a": False, "transpose_b": False, "activation": "gelu", "packed_n": 0}))
def test_fused_matmul(call):
    check(ops.fused_matmul, reference.fused_matmul, call)


@FUZZ
@seed(SEED)
@given(batch_add_calls())
def test_fused_batch_matmul_add(call):
    check(ops.fused_batch_matmul_add, reference.fused_batch_matmul_add, call)


@FUZZ
@seed(SEED)
@given(batch_transpose_calls())
def test_fused_batch_matmul_transpose(call):
    check(ops.fused_batch_matmul_transpose, reference.fused_batch_matmul_transpose, call)


class TunedCall(NamedTuple):
    workload: int       # in tuned_bundle
    dims: dict          # as its dispatch sees them
    fused: Callable
    args: list
    attrs: dict
    reference_fn: Callable
    inputs: list        # the reference's (dense: the weight as [K, N])
    reference_attrs: dict


@st.composite
def tuned_calls(draw, report):
    """A call of one of tuned_bundle's workloads, its dims mostly inside the tuned ranges."""
    workload = draw(st.sampled_from(range(5)))
    if workload in (0, 4):  # dense: relu with bias and a packed weight; gelu with the weight in place
        m, n = draw(st.integers(1, 45)), 40 if workload == 0 else 48
        x, w = draw(arrays((m, 24))), draw(arrays((n, 24)))
        bias = draw(arrays((n,))) if workload == 0 else None
        activation = "relu" if workload == 0 else "gelu"
        b, packed_n = weight_operand(report, w, workload)
        return TunedCall(workload, {"m": m, "n": n, "k": 24}, ops.fused_matmul, [x, b, bias],
                         {"activation": activation, "packed_n": packed_n},
                         reference.fused_matmul, [x, w.T, bias], {"activation": activation})
    t, alpha = draw(st.integers(1, 23)), draw(st.sampled_from([1.0, 0.125, -2.0]))
    if workload == 1:  # NT
        q, k = draw(arrays((3, t, 8))), draw(arrays((3, t, 8)))
        attrs = {"perm": [0, 1, 2], "adj_y": True, "alpha": alpha}
        return TunedCall(1, {"b": 3, "m": t, "n": t, "k": 8}, ops.fused_batch_matmul_transpose, [q, k], attrs,
                         reference.fused_batch_matmul_transpose, [q, k], attrs)
    if workload == 2:  # NN
        b = draw(st.integers(1, 9))
        s, v = draw(arrays((b, t, t))), draw(arrays((b, t, 12)))
        attrs = {"perm": [0, 1, 2], "alpha": alpha}
        return TunedCall(2, {"b": b, "m": t, "n": 12, "k": t}, ops.fused_batch_matmul_transpose, [s, v], attrs,
                         reference.fused_batch_matmul_transpose, [s, v], attrs)
    # NT plus a mask, attention's [B, T, heads, depth] operands read in place
    q, k, mask = draw(arrays((2, t, 3, 8))), draw(arrays((2, t, 3, 8))), draw(arrays((2, 1, 1, t)))
    attrs = {"x_perm": [0, 2, 1, 3], "y_perm": [0, 2, 1, 3], "adj_y": True, "alpha": alpha}
    return TunedCall(3, {"b": 6, "m": t, "n": t, "k": 8}, ops.fused_batch_matmul_add, [q, k, mask], attrs,
                     reference.fused_batch_matmul_add, [q, k, mask], attrs)


@FUZZ
@seed(SEED)
@given(data=st.data())
def test_tuned_kernels(tuned_bundle, data):
    """Each call runs the kernel its bundle's tree picks (generic outside the tuned ranges)."""
    path, report = tuned_bundle
    call = data.draw(tuned_calls(report))
    out, used = kernel_used(path, lambda: call.fused(*call.args, **call.attrs, bundle=str(path)).numpy())
    assert used == expected_kernel(report, call.workload, call.dims)
    assert_matches_reference(out, call.reference_fn, call.inputs, **call.reference_attrs)
