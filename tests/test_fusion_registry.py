"""A fusion kind is its own class and one line in graph_rewrite.fusions.FUSIONS: a kind
defined here (tf.square(x) written as x * x), registered for one test, is found, spliced
in after the kinds before it, counted and reported, and the optimized model computes
what the original does."""

import numpy as np
import pytest
import tensorflow as tf

import tf_dietcode
from tf_dietcode.graph_rewrite import fusions
from tf_dietcode.graph_rewrite.analysis.graph_index import tensor_name
from tf_dietcode.graph_rewrite.fusions.contract import Found, Fusion, Replacement
from tf_dietcode.graph_rewrite.splice import scratch_graph
from tf_dietcode.tuning import search

from conftest import TINY_TUNING_OPTIONS, shared_database


class Square(Fusion):
    """Each float32 Square node as a Mul of its input by itself; a match is (x, output)."""
    name = "square"

    def find(self, index, shapes, switches) -> Found:
        return Found([(tensor_name(node.input[0]), f"{node.name}:0") for node in index.nodes.values()
                      if node.op == "Square" and node.attr["T"].type == tf.float32.as_datatype_enum])

    def forms(self, match) -> tuple[str, ...]:
        return ("square",)

    def replacement(self, match, binding) -> Replacement:
        x, output = match
        graph_def = scratch_graph(lambda: tf.multiply(*[tf.compat.v1.placeholder(tf.float32, name="x")] * 2,
                                                      name="out_0"))
        return Replacement(graph_def, {"x": x}, [output])


@pytest.fixture
def square_registered(monkeypatch):
    monkeypatch.setattr(fusions, "FUSIONS", [*fusions.FUSIONS, Square()])


def test_a_kind_registered_by_one_line_is_found_rewritten_and_reported(tmp_path, rng, square_registered):
    weight, bias = rng.uniform(-1, 1, (16, 8)).astype(np.float32), rng.uniform(-1, 1, 8).astype(np.float32)

    class Model(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None, 16], tf.float32, name="x")])
        def serve(self, x):  # the square reads the dense layer's output, which is spliced in first
            return {"out": tf.square(tf.matmul(x, weight) + bias) - tf.square(x[:, :8])}

    model = Model()
    tf.saved_model.save(model, str(tmp_path / "in"), signatures={"serving_default": model.serve})
    report = tf_dietcode.optimize(tmp_path / "in", tmp_path / "out", shape_ranges={"x": [(1, 9), 16]},
                                  tuning=search.SearchOptions(**TINY_TUNING_OPTIONS),
                                  database=shared_database())
    assert dict(report.found) == dict(report.fused) == {"matmul": 1, "square": 2}
    assert "  square: 2 / 2" in report.summary() and "  dense (matmul): 1 / 1" in report.summary()
    optimized = tf.saved_model.load(str(tmp_path / "out")).signatures["serving_default"]
    for rows in (1, 5, 9, 12):
        x = rng.uniform(-2, 2, (rows, 16)).astype(np.float32)
        np.testing.assert_allclose(optimized(x=x)["out"], model.serve(x)["out"], rtol=1e-5, atol=1e-5)
    graph_ops = {n.op for f in optimized.graph.as_graph_def().library.function for n in f.node_def}
    assert "DietcodeFusedMatMul" in graph_ops and "Mul" in graph_ops and "Square" not in graph_ops
