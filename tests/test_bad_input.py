"""Bad input gets InvalidArgument naming the problem, never a crash or garbage."""

import json
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from conftest import random_tensor
from tf_dietcode import ops

InvalidArgument = tf.errors.InvalidArgumentError


@pytest.mark.parametrize("a_shape,options", [((4,), {"num_k_dims": 2}), ((2, 3, 4), {"transpose_a": True}),
                                             ((4, 3), {"transpose_a": True, "num_k_dims": 2})])
def test_matmul_rank(rng, a_shape, options):
    with pytest.raises(InvalidArgument, match="a must be .* contracted dim"):
        ops.fused_matmul(random_tensor(rng, a_shape), random_tensor(rng, (4, 5)), **options)


@pytest.mark.parametrize("n_dims,message", [((2, 3), "must multiply to N=5"), ((-1, -5), "must be >= 0"),
                                            ((2**40, 2**40), "overflow")])
def test_matmul_output_dims(rng, n_dims, message):
    with pytest.raises(InvalidArgument, match=message):
        ops.fused_matmul(random_tensor(rng, (2, 4)), random_tensor(rng, (4, 5)), n_dims=n_dims)


def test_matmul_k_mismatch(rng):
    with pytest.raises(InvalidArgument, match="contraction dims differ"):
        ops.fused_matmul(random_tensor(rng, (2, 3)), random_tensor(rng, (4, 5)))


@pytest.mark.parametrize("bias_shape", [(4,), (1,), (5, 1), ()])
def test_matmul_bias_shape(rng, bias_shape):
    with pytest.raises(InvalidArgument, match=r"bias must have shape \[5\]"):
        ops.fused_matmul(random_tensor(rng, (2, 3)), random_tensor(rng, (3, 5)), random_tensor(rng, bias_shape))


def test_batch_matmul_rank(rng):
    with pytest.raises(InvalidArgument, match="rank >= 2"):
        ops.fused_batch_matmul_add(random_tensor(rng, (3,)), random_tensor(rng, (3, 2)), 0.0)


def test_batch_matmul_k_mismatch(rng):
    with pytest.raises(InvalidArgument, match="contraction dims differ"):
        ops.fused_batch_matmul_transpose(random_tensor(rng, (2, 3, 4)), random_tensor(rng, (2, 5, 6)), [0, 1, 2])


def test_batch_dims_do_not_broadcast(rng):
    with pytest.raises(InvalidArgument, match="batch dims .* do not broadcast"):
        ops.fused_batch_matmul_add(random_tensor(rng, (2, 3, 4)), random_tensor(rng, (3, 4, 5)), 0.0)


@pytest.mark.parametrize("addend_shape", [(4, 5), (2, 2, 3, 5), (3, 3, 5), (5, 1, 1)])
def test_addend_must_not_grow_the_output(rng, addend_shape):
    with pytest.raises(InvalidArgument, match="does not broadcast to the product"):
        ops.fused_batch_matmul_add(random_tensor(rng, (2, 3, 4)), random_tensor(rng, (2, 4, 5)),
                                   random_tensor(rng, addend_shape))


@pytest.mark.parametrize("perm", [[0, 1], [0, 1, 1], [0, 1, 3], [2, 1, 0, 3], [], [-1, 0, 1]])
def test_bad_permutation(rng, perm):
    with pytest.raises(InvalidArgument, match="perm"):
        ops.fused_batch_matmul_transpose(random_tensor(rng, (2, 3, 4)), random_tensor(rng, (2, 4, 5)), perm)


@pytest.mark.parametrize("x_perm,message", [([1, 0, 2, 3], "x_perm has 4 entries"), ([1, 0], "keep the last axis last"),
                                             ([0, 0, 1], "is not a permutation")])
def test_bad_operand_permutation(rng, x_perm, message):
    with pytest.raises(InvalidArgument, match=message):
        ops.fused_batch_matmul_add(random_tensor(rng, (2, 3, 4)), random_tensor(rng, (2, 4, 5)), 0.0, x_perm=x_perm)


def test_bad_permutation_at_graph_construction_is_a_shape_error(rng):
    @tf.function
    def transposed(x, y):
        return ops.fused_batch_matmul_transpose(x, y, [0, 1, 1])

    with pytest.raises(ValueError, match="is not a permutation"):
        transposed(random_tensor(rng, (2, 3, 4)), random_tensor(rng, (2, 4, 5)))


@pytest.mark.parametrize("dtype", [np.float64, np.float16, np.int32])
def test_unsupported_dtype(rng, dtype):
    with pytest.raises(InvalidArgument, match="must be float32, got"):
        ops.fused_matmul(random_tensor(rng, (2, 3)).astype(dtype), random_tensor(rng, (3, 4)))


def test_bundle_must_be_scalar_string(rng):
    with pytest.raises(InvalidArgument, match="bundle must be a scalar string"):
        ops.fused_matmul(random_tensor(rng, (2, 3)), random_tensor(rng, (3, 4)), bundle=["a", "b"])


def test_unknown_shapes_fail_at_run_time_with_invalid_argument(rng):
    @tf.function(input_signature=[tf.TensorSpec(None, tf.float32)] * 2)
    def dense(a, b):
        return ops.fused_matmul(a, b)

    with pytest.raises(InvalidArgument, match="contraction dims differ"):
        dense(random_tensor(rng, (2, 3)), random_tensor(rng, (4, 5)))


def test_misaligned_and_strided_views_compute_correctly(rng):
    """TF hands kernels dense buffers, but slices may start at any float: the
    generic kernel makes no alignment assumption."""
    base = tf.constant(random_tensor(rng, (1 + 7 * 33,)))
    for offset in (1, 2, 3):
        a = tf.reshape(base[offset:offset + 7 * 32], (7, 32))
        b = tf.transpose(tf.constant(random_tensor(rng, (48, 32))))[:, 1:]
        np.testing.assert_allclose(ops.fused_matmul(a, b), tf.matmul(a, b), rtol=1e-5, atol=1e-5)


def test_a_missing_bundle_still_computes_correctly(rng):
    a, b = random_tensor(rng, (9, 16)), random_tensor(rng, (16, 4))
    np.testing.assert_allclose(ops.fused_matmul(a, b, bundle="/no/such/bundle"), a @ b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("b_shape,transpose_b,match", [
    ((2, 16, 4), True, "transpose_b must be false"),
    ((2, 16, 4), False, "holds 8 columns, fewer than packed_n=9"),
    ((16, 36), False, "packed weight"),
    ((2, 15, 8), False, "contraction dims differ"),
])
def test_packed_weight_mismatches(rng, b_shape, transpose_b, match):
    a, b = random_tensor(rng, (3, 16)), random_tensor(rng, b_shape)
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError), match=match):
        ops.fused_matmul(a, b, transpose_b=transpose_b, packed_n=9)


HUGE_EMPTY_OPERANDS = """
import json
import numpy as np
import tensorflow as tf
from tf_dietcode import ops

empty = lambda *shape: np.zeros(shape, np.float32)  # no elements: free to send, whatever the dims
calls = [lambda: ops.fused_matmul(empty(2**40, 0), empty(0, 2**40)),
         lambda: ops.fused_batch_matmul_add(empty(2**20, 2**20, 0, 4), empty(1, 4, 3), 0.0),
         lambda: ops.fused_batch_matmul_transpose(empty(2**20, 2**20, 0, 4), empty(4, 3), [2, 3, 0, 1])]
results = []
for call in calls:
    try:
        results.append(list(call().shape))
    except tf.errors.InvalidArgumentError as error:
        results.append(error.message)
print(json.dumps(results))
"""


def test_empty_operands_of_huge_dims_are_empty_outputs_or_errors():
    """An output too large to count is InvalidArgument, as for TF's MatMul; an empty output of a
    2^40-matrix batch is returned without planning its batch. In a fresh process, so that an
    abort fails this test alone."""
    result = subprocess.run([sys.executable, "-c", HUGE_EMPTY_OPERANDS], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    overflow, added, transposed = json.loads(result.stdout.strip().splitlines()[-1])
    assert "overflow" in overflow, overflow
    assert added == [2**20, 2**20, 0, 3] and transposed == [0, 3, 2**20, 2**20]
