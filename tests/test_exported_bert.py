"""The exported-encoder family (bench/exported_bert.py) at a small size: the SavedModel agrees with a
float64 numpy forward pass of the same weights (tests/bert_reference.py), and optimize() fuses every
dense layer (the pooler's tanh one included), both attention products (the scores with the mask
bias) and the softmax (without the +1e-9 before it), keeping the outputs on fresh inputs with padding,
in and beyond the tuned range."""

import numpy as np
import pytest
import tensorflow as tf

import tf_dietcode
from bench import bert_base, exported_bert, hf_bert
from tf_dietcode.graph_rewrite.fusions import softmax
from tf_dietcode.tuning import search

import bert_reference
from conftest import TINY_TUNING_OPTIONS, shared_database

SMALL = hf_bert.Config(vocab_size=97, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                       intermediate_size=64, max_position_embeddings=48, type_vocab_size=2, layer_norm_eps=1e-12,
                       hidden_act="gelu")
BATCH, MAX_LENGTH = 4, 40  # optimize()'s ranges: batch 1..4, T 1..40
# (batch, T): T = 1, primes, the range's end, and beyond it (the ops' generic kernels); batch 1 unpadded
SHAPES = [(1, 1), (1, 7), (3, 1), (2, 13), (4, 31), (3, 40), (4, 40), (2, 45)]
SEED = 3


class Loaded:
    """A SavedModel's serving signature as numpy feed -> numpy outputs (the model kept alive: a
    signature does not keep its variables alive)."""

    def __init__(self, path):
        self.model = tf.saved_model.load(str(path))
        self.signature = self.model.signatures["serving_default"]

    def __call__(self, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        result = self.signature(**{name: tf.constant(value) for name, value in feed.items()})
        return {name: value.numpy() for name, value in result.items()}


@pytest.fixture(scope="module")
def original(tmp_path_factory):
    """(SavedModel directory, float64 weights) of the small model with random weights."""
    root = tmp_path_factory.mktemp("exported_bert")
    model = exported_bert.build(SMALL)
    weights = exported_bert.random_weights(model, SMALL, SEED)
    hf_bert.load_weights(model, SMALL, weights)
    hf_bert.export(model, root / "original")
    return root / "original", {name: value.astype(np.float64) for name, value in weights.items()}


@pytest.fixture(scope="module")
def original_model(original):
    return Loaded(original[0])


@pytest.fixture(scope="module")
def optimized(original):
    """(the optimized SavedModel, loaded; optimize()'s report)"""
    path = original[0].parent / "optimized"
    report = tf_dietcode.optimize(original[0], path,
                                  shape_ranges={name: [(1, BATCH), (1, MAX_LENGTH)] for name in exported_bert.INPUTS},
                                  tuning=search.SearchOptions(**TINY_TUNING_OPTIONS), database=shared_database())
    return Loaded(path), report


def test_inputs_are_padded_sentence_pairs():
    for batch, t in SHAPES:
        feed = exported_bert.inputs(SMALL, batch, t, seed=5)
        mask, ids, segments = feed["attention_mask"], feed["input_ids"], feed["token_type_ids"]
        assert all(value.shape == (batch, t) and value.dtype == np.int32 for value in feed.values())
        lengths = mask.sum(axis=1)
        assert lengths[0] == t and lengths.min() >= 1
        np.testing.assert_array_equal(mask, np.arange(t)[None] < lengths[:, None])  # padding at the end
        assert (ids[mask == 1] > 0).all() and not ids[mask == 0].any() and ids.max() < SMALL.vocab_size
        assert not segments[mask == 0].any() and (np.diff(segments, axis=1)[mask[:, 1:] == 1] >= 0).all()
    assert (exported_bert.inputs(SMALL, 4, 40, seed=5)["attention_mask"] == 0).any()


def test_every_weight_is_drawn_and_placed_once():
    model = exported_bert.build(SMALL)
    targets = hf_bert.targets(model, SMALL)
    assert "pooler.dense.weight" in targets and len(targets) == len(model.weights) == 5 + 16 * 2 + 2
    weights = exported_bert.random_weights(model, SMALL, SEED)
    assert set(weights) == set(targets)
    again = exported_bert.random_weights(model, SMALL, SEED)
    assert all(np.array_equal(weights[name], again[name]) for name in weights)  # the seed fixes them


@pytest.mark.parametrize("batch, t", SHAPES)
def test_the_saved_model_agrees_with_a_float64_forward_pass(original, original_model, batch, t):
    feed = exported_bert.inputs(SMALL, batch, t, seed=11)
    sequence, pooled = bert_reference.forward(original[1], SMALL, feed["input_ids"], feed["token_type_ids"],
                                              feed["attention_mask"])
    actual = original_model(feed)
    np.testing.assert_allclose(actual["sequence_output"], sequence, rtol=0, atol=2e-5)
    np.testing.assert_allclose(actual["pooled_output"], pooled, rtol=0, atol=2e-5)
    assert np.abs(pooled).max() > 0.5  # the pooler's tanh is well away from linear


def test_optimize_fuses_every_dense_layer_and_both_attention_products(optimized):
    _, report = optimized
    layers = [layer for layer in report.layers if layer["signature"] == "serving_default"]
    dense = [layer for layer in layers if layer["kind"] == "dense"]
    attention = [layer for layer in layers if layer["kind"] == "attention"]
    assert len(dense) == 6 * SMALL.num_hidden_layers + 1 and all(layer["kernels"] for layer in dense)
    assert len(attention) == 2 * SMALL.num_hidden_layers and all(layer["kernels"] for layer in attention)
    pooler = [layer for layer in dense if "pooler" in layer["node"]]
    assert len(pooler) == 1 and "tanh" in pooler[0]["workload"], pooler
    softmaxes = [layer for layer in layers if layer["kind"] == "softmax"]  # each without the +1e-9 before it
    assert [layer["forms"] for layer in softmaxes] == [[softmax.SHIFTED_FORM]] * SMALL.num_hidden_layers
    assert sum(report.found.values()) == sum(report.fused.values()) and not report.left_alone, report.summary()


@pytest.mark.parametrize("batch, t", SHAPES)
def test_optimize_keeps_the_outputs(original_model, optimized, batch, t):
    feed = exported_bert.inputs(SMALL, batch, t, seed=23)
    expected, actual = original_model(feed), optimized[0](feed)
    for name in exported_bert.OUTPUTS:
        np.testing.assert_allclose(actual[name], expected[name], rtol=0, atol=1e-4, err_msg=name)


def test_the_benchmark_feeds_padded_batches_and_checks_every_output():
    """bench.bert_base's exported family: its feed at batch 16 has padding, and a peer whose second
    output (the pooled one) differs fails the check that runs at every cell."""
    family = bert_base.FAMILIES["exported"]
    feed = family.feed(16, 17)
    assert tuple(feed) == exported_bert.INPUTS and (feed["attention_mask"] == 0).any()
    assert family.feed(1, 17)["attention_mask"].all()
    expected = (np.zeros((16, 17, 768), np.float32), np.zeros((16, 768), np.float32))
    bert_base.agree_with_tensorflow({"tensorflow": expected, "dietcode": expected})
    with pytest.raises(AssertionError, match="dietcode output 1"):
        bert_base.agree_with_tensorflow({"tensorflow": expected, "dietcode": (expected[0], expected[1] + 1e-3)})
