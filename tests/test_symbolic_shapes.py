"""Symbolic shapes: dynamic input dims as symbols through a signature's graph
(concat, reshape with -1, shape arithmetic, products), equalities from
broadcasting and contraction, and optimize() falling back to running the model
where a dim does not follow from the graph."""

import numpy as np
import pytest
import sympy
import tensorflow as tf

import tf_dietcode
from tf_dietcode.graph_rewrite.analysis import signature_graph
from tf_dietcode.graph_rewrite.analysis.graph_index import GraphIndex
from tf_dietcode.graph_rewrite.analysis.symbolic_shapes import SymbolicShapes
from tf_dietcode.tuning import search

from conftest import TINY_TUNING_OPTIONS, shared_database


def saved_signature(path, function, specs):
    """`function` exported as a SavedModel's serving signature, loaded back (inputs by name)."""
    module = tf.Module()
    module.serve = tf.function(function, input_signature=specs)
    tf.saved_model.save(module, str(path), signatures={"serving_default": module.serve})
    return signature_graph.from_signature("serving_default", tf.saved_model.load(str(path)).signatures["serving_default"])


def symbolic(graph, ranges) -> tuple[SymbolicShapes, dict]:
    shapes = SymbolicShapes(GraphIndex(graph.graph_def, {}), graph.input_tensors, ranges)
    return shapes, {name: shapes.shape(tensor) for name, tensor in graph.output_tensors.items()}


def test_dims_follow_concat_reshape_and_products(tmp_path):
    def serve(x, cls):
        with_cls = tf.concat([cls, x], axis=1)                               # [B, T + 1, 8]
        rows = tf.reshape(with_cls, [-1, tf.shape(with_cls)[-1]])           # [B * (T + 1), 8]
        return {"rows": rows, "scores": tf.matmul(with_cls, with_cls, transpose_b=True),
                "tiled": tf.tile(x, [2, 1, 1])}

    graph = saved_signature(tmp_path, serve, [tf.TensorSpec([None, None, 8], name="x"),
                                              tf.TensorSpec([None, 1, 8], name="cls")])
    shapes, out = symbolic(graph, {"x": [(1, 4), (1, 9), (8, 8)], "cls": [(1, 4), (1, 1), (8, 8)]})
    batch, length = (sympy.Symbol(n, integer=True, nonnegative=True) for n in ("cls[0]", "x[1]"))
    # concat broadcasts the batch dims: x's and cls's batch are one symbol
    assert shapes.same(sympy.Symbol("x[0]", integer=True, nonnegative=True), batch)
    assert sympy.expand(out["rows"][0] - batch * (length + 1)) == 0 and out["rows"][1] == 8
    assert shapes.range_of(out["rows"][0]) == (2, 40)
    assert out["scores"] == (batch, length + 1, length + 1)
    assert shapes.range_of(out["scores"][1]) == (2, 10)
    # no rule for Tile: TF's static shape, its unknown dims unknown
    assert out["tiled"] == (None, None, 8) and shapes.range_of(out["tiled"][0]) is None


def test_a_ranged_scalar_is_a_value_symbol_and_tensor_lists_are_shaped_as_their_stack(tmp_path):
    def serve(x, n):
        rows = tf.TensorArray(tf.float32, size=0, dynamic_size=True).write(0, x).write(1, x)
        _, picked = tf.math.top_k(x, k=2)
        return {"positions": tf.range(n), "stacked": rows.stack(), "best": tf.argmax(x, axis=1),
                "picked": picked, "gathered": tf.gather(x, picked, batch_dims=1)}

    graph = saved_signature(tmp_path, serve, [tf.TensorSpec([None, 8], name="x"),
                                              tf.TensorSpec([], tf.int32, name="n")])
    shapes, out = symbolic(graph, {"x": [(1, 4), (8, 8)], "n": [(1, 20)]})
    n, rows = (sympy.Symbol(name, integer=True, nonnegative=True) for name in ("n", "x[0]"))
    assert out["positions"] == (n,) and shapes.range_of(out["positions"][0]) == (1, 20)
    assert out["stacked"] == (2, rows, 8)
    assert out["best"] == (rows,) and out["picked"] == (rows, 2) and out["gathered"] == (rows, 2)


def test_a_mask_width_is_the_key_length_and_separate_lengths_stay_apart(tmp_path):
    def serve(q, k, mask):
        return {"out": tf.matmul(q, k, transpose_b=True) + mask}

    graph = saved_signature(tmp_path, serve, [tf.TensorSpec([None, 3, None, 8], name="q"),
                                              tf.TensorSpec([None, 3, None, 8], name="k"),
                                              tf.TensorSpec([None, 1, 1, None], name="mask")])
    same_ranges = [(1, 4), (3, 3), (1, 9), (8, 8)]
    shapes, out = symbolic(graph, {"q": same_ranges, "k": same_ranges, "mask": [(1, 4), (1, 1), (1, 1), (1, 9)]})
    q_length, k_length, width = (sympy.Symbol(n, integer=True, nonnegative=True) for n in ("q[2]", "k[2]", "mask[3]"))
    assert shapes.same(k_length, width)
    assert not shapes.same(q_length, k_length)  # equal ranges, but nothing in the graph makes them equal
    assert out["out"][1:] == (3, q_length, k_length)


def test_cross_attention_lengths_are_separate_shape_variables(tmp_path, rng):
    """Queries and keys of independent lengths: the product's M and N are not tied."""
    def serve(q, k):
        return {"out": tf.matmul(q, k, transpose_b=True)}

    specs = [tf.TensorSpec([2, 3, None, 8], name="q"), tf.TensorSpec([2, 3, None, 8], name="k")]
    module = tf.Module()
    module.serve = tf.function(serve, input_signature=specs)
    tf.saved_model.save(module, str(tmp_path / "in"), signatures={"serving_default": module.serve})
    report = tf_dietcode.optimize(tmp_path / "in", tmp_path / "out", tuning=search.SearchOptions(**TINY_TUNING_OPTIONS),
                                  database=shared_database(),
                                  shape_ranges={"q": [2, 3, (1, 9), 8], "k": [2, 3, (1, 9), 8]})
    [workload] = report.workloads
    assert workload.ties == () and (workload.m.lo, workload.m.hi, workload.n.lo, workload.n.hi) == (1, 9, 1, 9)
    assert report.dims[workload] == "M = q[2], N = k[2]"
    q, k = rng.uniform(-1, 1, (2, 3, 7, 8)).astype(np.float32), rng.uniform(-1, 1, (2, 3, 4, 8)).astype(np.float32)
    optimized = tf.saved_model.load(str(tmp_path / "out")).signatures["serving_default"]
    np.testing.assert_allclose(optimized(q=q, k=k)["out"], serve(q, k)["out"], rtol=1e-5, atol=1e-5)


def test_a_layer_the_graph_cannot_size_is_sized_by_running_the_model(tmp_path, rng):
    weight = rng.uniform(-1, 1, (16, 8)).astype(np.float32)

    def serve(x):
        return {"out": tf.matmul(tf.tile(x, [2, 1]), weight)}  # rows 2 * batch, through an op without a rule

    module = tf.Module()
    module.serve = tf.function(serve, input_signature=[tf.TensorSpec([None, 16], name="x")])
    tf.saved_model.save(module, str(tmp_path / "in"), signatures={"serving_default": module.serve})
    report = tf_dietcode.optimize(tmp_path / "in", tmp_path / "out", tuning=search.SearchOptions(**TINY_TUNING_OPTIONS),
                                  database=shared_database(),
                                  shape_ranges={"x": [(1, 5), 16]})
    [workload] = report.workloads
    assert (workload.m.lo, workload.m.hi) == (2, 10) and workload not in report.dims
    assert any("do not follow from the graph" in note for note in report.notes)
    x = rng.uniform(-1, 1, (3, 16)).astype(np.float32)
    optimized = tf.saved_model.load(str(tmp_path / "out")).signatures["serving_default"]
    np.testing.assert_allclose(optimized(x=x)["out"], serve(x)["out"], rtol=1e-5, atol=1e-5)


POSITION_READS = {  # T rows of a 40-row position table, as models write it
    "strided slice": lambda table, t: table[:t],
    "slice": lambda table, t: tf.slice(table, [0, 0], [t, -1]),
    "gather": lambda table, t: tf.gather(table, tf.range(t)),
    "keras take": lambda table, t: tf.gather(table, tf.where(tf.range(t) < 0, tf.range(t) + 40, tf.range(t))),
}


@pytest.mark.parametrize("read", POSITION_READS)
def test_a_dim_without_a_range_goes_up_to_the_table_the_model_slices_by_it(tmp_path, read):
    """No range given for T: the model's own position table (40 rows, read up to T) bounds it."""
    class Model(tf.Module):
        def __init__(self):
            super().__init__()
            self.positions = tf.Variable(np.zeros((40, 8), np.float32))

        @tf.function(input_signature=[tf.TensorSpec([None, None, 8], name="x")])
        def serve(self, x):
            return {"out": x + POSITION_READS[read](self.positions, tf.shape(x)[1])}

    model = Model()
    tf.saved_model.save(model, str(tmp_path), signatures={"serving_default": model.serve})
    report = tf_dietcode.Converter(tmp_path).convert().report
    assert report.ranges["serving_default"]["x"] == [(1, 16), (1, 40), (8, 8)]
    assert "serving_default: x dim 1: no range given, assumed 1..40 (the model slices a dim of 40 by it)" \
        in report.notes


def test_a_causal_mask_keeps_the_dims_symbolic(tmp_path):
    """Keras' causal attention: a band_part triangle broadcast through x[None, None]."""
    def serve(q, k):
        t = tf.shape(q)[2]
        causal = tf.linalg.band_part(tf.ones([t, t]), -1, 0)
        return {"out": tf.matmul(q, k, transpose_b=True) + (1.0 - causal[None, None, :, :]) * -1e9}

    graph = saved_signature(tmp_path, serve, [tf.TensorSpec([None, 4, None, 8], name=n) for n in ("q", "k")])
    ranges = [(1, 16), (4, 4), (1, 64), (8, 8)]
    shapes, out = symbolic(graph, {"q": ranges, "k": ranges})
    batch, length = out["out"][0], out["out"][2]
    assert out["out"][1] == 4 and out["out"][3] == length and shapes.range_of(batch) == (1, 16)
    assert shapes.same(length, sympy.Symbol("q[2]", integer=True, nonnegative=True))
    assert shapes.same(length, sympy.Symbol("k[2]", integer=True, nonnegative=True))  # the mask ties them


def test_a_model_that_fails_at_a_corner_of_the_ranges_is_a_clear_error(tmp_path):
    """A layer sized by running the model, whose 40-row table T = 128 overruns by a route no rule
    follows: the error names the corner and TF's reason, not a stack of TF internals."""
    table = np.zeros((40, 8), np.float32)

    def serve(x):
        steps = tf.math.cumsum(tf.ones([tf.shape(x)[1]], tf.int32)) - 1  # 0..T-1
        return {"out": tf.matmul(tf.tile(tf.reshape(x + tf.gather(table, steps), [-1, 8]), [2, 1]), table.T)}

    module = tf.Module()
    module.serve = tf.function(serve, input_signature=[tf.TensorSpec([None, None, 8], name="x")])
    tf.saved_model.save(module, str(tmp_path / "in"), signatures={"serving_default": module.serve})
    with pytest.raises(ValueError, match=r"fails on zero inputs at the highest corner of the shape ranges "
                                         r"\(x \[16, 128, 8\]\).*indices\[40\] = 40 is not in \[0, 40\)"):
        tf_dietcode.optimize(tmp_path / "in", tmp_path / "out", tuning=search.SearchOptions(**TINY_TUNING_OPTIONS),
                             database=shared_database())
    assert not (tmp_path / "out").exists()
