"""DietcodeReorderAppend against tf.concat([tf.gather(cache, rows), new], axis), and the rewrite
(graph_rewrite/cache_reorder.py) that carries a loop's cache unreordered so the next step's
append reorders it: outputs as the original's, and left alone where its conditions fail."""

import numpy as np
import pytest
import tensorflow as tf

import tf_dietcode
from tf_dietcode import ops, reference


@pytest.mark.parametrize("cache_shape,new_rows,axis", [
    ((6, 3, 5, 4), 4, 2), ((4, 7), 4, 1), ((5, 2, 0, 3), 5, 2), ((3, 2, 4), 7, 1), ((2, 3, 1, 2, 5), 3, 3),
    ((1, 8, 17, 64), 1, 2), ((4, 2, 3), 0, 2)])
def test_matches_gather_then_concat(rng, cache_shape, new_rows, axis):
    cache = rng.normal(size=cache_shape).astype(np.float32)
    new_shape = list(cache_shape)
    new_shape[0], new_shape[axis] = new_rows, 1 + cache_shape[axis] % 2
    new = rng.normal(size=new_shape).astype(np.float32)
    rows = rng.integers(0, cache_shape[0], new_rows).astype(np.int32)
    got = ops.reorder_append(cache, rows, new, axis=axis).numpy()
    np.testing.assert_array_equal(got, reference.reorder_append(cache, rows, new, axis=axis).numpy())


def test_shape_inside_tf_function_and_gradient(rng):
    traced = tf.function(lambda c, r, n: ops.reorder_append(c, r, n, axis=2), input_signature=[
        tf.TensorSpec([None, 8, None, 64]), tf.TensorSpec([None], tf.int32), tf.TensorSpec([None, 8, 1, 64])])
    assert traced.get_concrete_function().outputs[0].shape.as_list() == [None, 8, None, 64]
    cache, new = (tf.constant(rng.normal(size=s).astype(np.float32)) for s in ((3, 2, 4, 5), (4, 2, 1, 5)))
    rows = tf.constant([2, 2, 0, 1], tf.int32)
    weights = tf.constant(rng.normal(size=(4, 2, 5, 5)).astype(np.float32))
    grads = []
    for function in (ops.reorder_append, reference.reorder_append):
        with tf.GradientTape() as tape:
            tape.watch([cache, new])
            loss = tf.reduce_sum(function(cache, rows, new, axis=2) * weights)
        grads.append(tape.gradient(loss, [cache, new]))
    for ours, theirs in zip(*grads):
        np.testing.assert_allclose(tf.convert_to_tensor(ours), tf.convert_to_tensor(theirs), rtol=1e-6, atol=1e-6)


def test_bad_input_is_a_clear_error():
    cache, new = np.zeros((3, 2, 4), np.float32), np.zeros((2, 2, 1), np.float32)
    with pytest.raises(tf.errors.InvalidArgumentError, match="not a row"):
        ops.reorder_append(cache, np.array([0, 3], np.int32), new, axis=2)
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError), match="rows|Dimensions must be equal"):
        ops.reorder_append(cache, np.array([0], np.int32), new, axis=2)
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError), match="differ in dim|Dimensions must be equal"):
        ops.reorder_append(cache, np.array([0, 1], np.int32), np.zeros((2, 3, 1), np.float32), axis=2)
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError), match="rank"):
        ops.reorder_append(cache, np.array([0, 1], np.int32), np.zeros((2, 2), np.float32), axis=2)


class _Reordering(tf.Module):
    """A loop appending to a cache each step and reordering it by a permutation the step computes,
    as a beam search does; `return_cache` also returns the final cache."""

    def __init__(self, return_cache: bool):
        super().__init__()
        self.return_cache = return_cache

    @tf.function(input_signature=[tf.TensorSpec([None, 4], tf.float32, name="x"),
                                  tf.TensorSpec([], tf.int32, name="steps")])
    def serve(self, x, steps):
        rows = tf.shape(x)[0]

        def body(i, cache, total):
            new = tf.reshape(tf.tile(x * tf.cast(i + 1, tf.float32), [1, 2]), [rows, 2, 1, 4])
            keys = tf.concat([cache, new], axis=2)
            total = total + tf.nn.softmax(tf.reduce_sum(keys, axis=[1, 3]))[:, 0] + tf.reduce_sum(new, [1, 2, 3])
            order = tf.argsort(total, stable=True)
            return i + 1, tf.gather(keys, order), tf.gather(total, order)

        _, cache, total = tf.while_loop(
            lambda i, cache, total: i < steps, body, (0, tf.zeros([rows, 2, 0, 4]), tf.zeros([rows])),
            shape_invariants=(tf.TensorShape([]), tf.TensorShape([None, 2, None, 4]), tf.TensorShape([None])))
        return {"total": total, "cache": cache} if self.return_cache else {"total": total}


def _optimized(tmp_path, model):
    tf.saved_model.save(model, str(tmp_path / "in"), signatures={"serving_default": model.serve})
    report = tf_dietcode.optimize(tmp_path / "in", tmp_path / "out",
                                  shape_ranges={"x": [(1, 5), 4], "steps": (0, 6)})
    return report, tf.saved_model.load(str(tmp_path / "out")).signatures["serving_default"]


def _ops(signature) -> list[str]:
    return [n.op for f in signature.graph.as_graph_def().library.function for n in f.node_def]


def test_a_reordered_cache_is_carried_unreordered_with_the_same_outputs(tmp_path, rng):
    model = _Reordering(return_cache=False)
    report, optimized = _optimized(tmp_path, model)
    assert any("1 caches carried unreordered" in note for note in report.notes), report.notes
    assert _ops(optimized).count("DietcodeReorderAppend") == 1
    for rows, steps in [(1, 0), (1, 1), (3, 4), (5, 6), (2, 9)]:
        x = rng.normal(size=(rows, 4)).astype(np.float32)
        expected, actual = model.serve(x, steps), optimized(x=x, steps=np.int32(steps))
        np.testing.assert_allclose(actual["total"], expected["total"], rtol=1e-6, atol=1e-6)


def test_a_cache_read_after_the_loop_stays_reordered_by_the_loop(tmp_path, rng):
    model = _Reordering(return_cache=True)
    report, optimized = _optimized(tmp_path, model)
    assert not any("carried unreordered" in note for note in report.notes), report.notes
    assert "DietcodeReorderAppend" not in _ops(optimized)
    x = rng.normal(size=(3, 4)).astype(np.float32)
    expected, actual = model.serve(x, 4), optimized(x=x, steps=np.int32(4))
    for name in expected:
        np.testing.assert_allclose(actual[name], expected[name], rtol=1e-6, atol=1e-6, err_msg=name)
