"""graph_rewrite.loop_invariants: products in a loop body that follow only from values the loop
passes through unchanged (and variables nothing in it writes) are computed once before the loop;
the loop then returns what it did (to float32 rounding), including when it runs no step. What changes per step,
reads of variables the body writes, stateful ops and loops in loops stay in their bodies."""

import numpy as np
import pytest
import tensorflow as tf

from tf_dietcode.graph_rewrite import loop_invariants
from tf_dietcode.graph_rewrite.analysis import signature_graph

DEPTH = 8
SPECS = [tf.TensorSpec([None, DEPTH], tf.float32, name="memory"), tf.TensorSpec([], tf.int32, name="steps")]


class Decoder(tf.Module):
    """Each step reads a projection of `memory` (the same every step) and a state that changes."""

    def __init__(self, body):
        super().__init__()
        rng = np.random.default_rng(3)
        self.weight = tf.Variable(rng.standard_normal((DEPTH, DEPTH), np.float32))
        self.counter = tf.Variable(0.0)
        self.body = body

    @tf.function(input_signature=SPECS)
    def decode(self, memory, steps):
        state = tf.ones([1, DEPTH])
        for _ in tf.range(steps):
            state = self.body(self, memory, state)
        return {"state": state}


def _attend(module, memory, state):
    keys = tf.matmul(memory, module.weight)                    # invariant
    scores = tf.nn.softmax(tf.matmul(state, keys, transpose_b=True))
    return tf.tanh(tf.matmul(scores, keys) + state)


def _with_write(module, memory, state):
    module.counter.assign_add(1.0)
    return _attend(module, memory, state)


def _with_noise(module, memory, state):
    return _attend(module, memory + tf.random.uniform([]) * 0.0, state)


def _nested(module, memory, state):
    for _ in tf.range(2):
        state = _attend(module, memory, state)
    return state


def _hoisted(module, tmp_path):
    tf.saved_model.save(module, str(tmp_path), signatures={"serving_default": module.decode})
    loaded = tf.saved_model.load(str(tmp_path))
    graph = signature_graph.from_signature("serving_default", loaded.signatures["serving_default"])
    resources = signature_graph.resources_of(loaded)
    hoisted, notes = loop_invariants.hoist(graph, signature_graph.captured_values(graph, resources))
    return graph, hoisted, notes


def _loop_ops(graph) -> set[str]:
    functions = {f.signature.name: f for f in graph.graph_def.library.function}
    loops = [n for n in graph.graph_def.node if n.op in ("While", "StatelessWhile")]
    return {n.op for loop in loops for n in functions[loop.attr["body"].func.name].node_def}


def _same_results(graph, hoisted):
    rng = np.random.default_rng(5)
    original, rewritten = graph.function(), hoisted.function()
    for rows, steps in [(1, 1), (7, 4), (13, 0), (0, 3), (64, 9)]:
        memory = tf.constant(rng.standard_normal((rows, DEPTH), np.float32))
        expected, actual = original(memory, tf.constant(steps)), rewritten(memory, tf.constant(steps))
        # the same ops on the same values; TF may pick another matmul kernel outside the loop (last bits)
        np.testing.assert_allclose(actual["state"].numpy(), expected["state"].numpy(), rtol=1e-5, atol=1e-6)


def test_an_invariant_product_is_computed_once_before_the_loop(tmp_path):
    graph, hoisted, notes = _hoisted(Decoder(_attend), tmp_path)
    assert len(notes) == 1 and "computed once before the loop" in notes[0], notes
    assert "MatMul" in _loop_ops(hoisted)  # the two products of the state
    outer_products = [n for n in hoisted.graph_def.node if n.op == "MatMul" and "/hoisted/" in n.name]
    assert len(outer_products) == 1, [n.name for n in hoisted.graph_def.node if "/hoisted/" in n.name]
    _same_results(graph, hoisted)


@pytest.mark.parametrize("body, why", [(_with_write, "the body writes a variable"),
                                       (_with_noise, "a stateful op in the product's inputs"),
                                       (_nested, "a loop in a loop")])
def test_what_may_change_stays_in_the_loop(body, why, tmp_path):
    graph, hoisted, notes = _hoisted(Decoder(body), tmp_path)
    assert not notes, why
    assert hoisted is graph
