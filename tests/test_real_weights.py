"""A real model: all-MiniLM-L6-v2 with its pretrained weights (bench/minilm.py), whose embeddings show
errors that random weights hide. The port is checked against the model's published similarities and a
float64 numpy forward pass (tests/bert_reference.py) from the weight file alone; then optimize() must keep every
sentence's embedding (tests/data/sentences.txt) where the original puts it."""

import numpy as np
import pytest
import tensorflow as tf

import tf_dietcode
from bench import hf_bert, minilm
from tf_dietcode.tuning import search

import bert_reference
from conftest import TINY_TUNING_OPTIONS, shared_database

BATCH, MAX_LENGTH = 4, 64  # the shape ranges optimize() is given: batch 1..4, T 1..64
# The least cosine similarity to the original's embedding each precision must keep for every sentence.
COSINE = {"float32": 0.99999, "bfloat16": 0.999, "int8": 0.99}
# The most of its 36 dense layers the accuracy gate may put back (with the defaults it puts back 0 in
# bfloat16 and 2 in int8: docs/decisions.md, "Precision").
PUT_BACK = {"bfloat16": 0, "int8": 4}
# Published by sentence-transformers (sbert.net, "Usage") for this model: similarities to 4 decimals.
PUBLISHED = (["The weather is lovely today.", "It's so sunny outside!", "He drove to the stadium."],
             {(0, 1): 0.6660, (0, 2): 0.1046, (1, 2): 0.1411})
PARAPHRASES = [
    ("A Fox one day spied a beautiful bunch of ripe grapes hanging from a vine trained along the branches of a tree.",
     "One day a fox saw a lovely cluster of ripe grapes hanging from a vine."),
    ("Snow fell all night, and in the morning the fields were white and still.",
     "It snowed through the night, and by morning the fields lay quiet and white."),
    ("The doctor came in the morning, looked at the patient, and shook his head.",
     "In the morning the physician examined the sick man and shook his head."),
    ("The cat slept in the sun by the kitchen door.", "By the kitchen door the cat was sleeping in the sunshine."),
]


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.sum(a * b, axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def reference_embeddings(w: dict[str, np.ndarray], config: hf_bert.Config, sentences: list[list[int]]) -> np.ndarray:
    """Each sentence's embedding (token ids, no padding) from the weights `w` (float64, by Hugging Face's
    names), as Hugging Face's BertModel (bert_reference) and sentence-transformers' mean pooling and
    normalization compute it, one sentence at a time."""
    means = []
    for ids in sentences:
        ids = np.array([ids])
        sequence, _ = bert_reference.forward(w, config, ids, np.zeros_like(ids), np.ones_like(ids))
        means.append(sequence[0].mean(0))
    means = np.stack(means)
    return means / np.maximum(np.linalg.norm(means, axis=1, keepdims=True), 1e-12)


@pytest.fixture(scope="module")
def sentences():
    return minilm.read_sentences()


@pytest.fixture(scope="module")
def models(tmp_path_factory, sentences):
    """The pretrained SavedModel and what optimize() makes of it in each precision (quick tuning), loaded
    (kept alive here: a signature does not keep its variables alive), with the reports:
    ({"original": model, "float32": model, ...}, {"float32": report, ...}).

    Optimized on representative inputs (minilm.examples: batch 1..4, T 1..64), so that the output check
    and the accuracy gate run real sentences; a quarter of them keeps the gate's runs short."""
    root = tmp_path_factory.mktemp("minilm")
    hf_bert.export(minilm.pretrained(), root / "original")
    examples = minilm.examples(sentences[::4], BATCH, MAX_LENGTH)
    reports = {precision: tf_dietcode.optimize(root / "original", root / precision, input_fn=lambda: iter(examples),
                                               precision=precision, tuning=search.SearchOptions(**TINY_TUNING_OPTIONS),
                                               database=shared_database())
               for precision in COSINE}
    return {name: tf.saved_model.load(str(root / name)) for name in ("original", *COSINE)}, reports


@pytest.fixture(scope="module")
def original_embeddings(models, sentences):
    return minilm.embed(models[0]["original"].signatures["serving_default"], sentences, BATCH)


def test_the_sentences_are_many_and_varied(sentences):
    lengths = [int(b.attention_mask.sum()) for b in minilm.batches(sentences, 1)]
    assert len(sentences) >= 220 and len(set(sentences)) == len(sentences)
    assert min(lengths) <= 5 and max(lengths) > MAX_LENGTH  # a few beyond the tuned range


def test_the_port_reproduces_the_published_similarities(models):
    texts, published = PUBLISHED
    embeddings = minilm.embed(models[0]["original"].signatures["serving_default"], texts)
    for (i, j), value in published.items():
        assert abs(float(embeddings[i] @ embeddings[j]) - value) <= 6e-5, (texts[i], texts[j])


def test_paraphrases_are_far_closer_than_unrelated_sentences(models):
    signature = models[0]["original"].signatures["serving_default"]
    first = minilm.embed(signature, [a for a, _ in PARAPHRASES])
    second = minilm.embed(signature, [b for _, b in PARAPHRASES])
    similarity = first @ second.T
    assert np.diag(similarity).min() > 0.75
    assert similarity[~np.eye(len(PARAPHRASES), dtype=bool)].max() < 0.35


def test_the_port_agrees_with_a_float64_forward_pass(original_embeddings, sentences):
    """Every sentence, run padded in batches by the SavedModel and alone by the reference: to 1e-5."""
    weights = {name: value.astype(np.float64) for name, value in minilm.read_weights().items()}
    alone = [minilm.tokenizer().encode(sentence).ids for sentence in sentences]  # one at a time: no padding
    expected = reference_embeddings(weights, minilm.read_config(), alone)
    for index, sentence in enumerate(sentences):
        np.testing.assert_allclose(original_embeddings[index], expected[index], rtol=0, atol=1e-5, err_msg=sentence)


def test_every_weight_is_placed_once():
    config = minilm.read_config()
    model = minilm.build(config)
    targets = hf_bert.targets(model, config)
    weights = minilm.read_weights()
    assert set(targets) | set(minilm.UNUSED) == set(weights)
    assert len({id(t.variable) for t in targets.values()}) == len(targets) == len(model.weights)


@pytest.mark.parametrize("change, message", [
    (lambda w: w.pop("encoder.layer.3.intermediate.dense.bias"), r"missing: \['encoder.layer.3.intermediate"),
    (lambda w: w.update({"encoder.layer.6.output.dense.bias": np.zeros(384, np.float32)}),
     r"does not place: \['encoder.layer.6.output.dense.bias'\]"),
    (lambda w: w.update({"encoder.layer.0.attention.self.key.weight": np.zeros((384, 383), np.float32)}),
     r"encoder.layer.0.attention.self.key.weight: shape \(384, 383\), .*key.*kernel \(384, 12, 32\) wants \(384, 384\)"),
    (lambda w: w.update({"encoder.layer.5.output.dense.weight": w["encoder.layer.5.output.dense.weight"].T}),
     r"encoder.layer.5.output.dense.weight: shape \(1536, 384\), .* wants \(384, 1536\)"),
    (lambda w: w.update({"embeddings.position_ids": np.zeros((1, 512), np.int64)}), "position_ids is not"),
])
def test_weights_that_do_not_fit_are_named(change, message):
    config = minilm.read_config()
    model = minilm.build(config)
    weights = minilm.read_weights()
    change(weights)
    before = [v.numpy().copy() for v in model.weights]
    with pytest.raises(ValueError, match=message):
        hf_bert.load_weights(model, config, weights, unused=minilm.UNUSED)
    assert all(np.array_equal(a, v.numpy()) for a, v in zip(before, model.weights))  # nothing assigned


def test_batches_pad_each_batch_to_its_longest_sentence(sentences):
    chosen = sentences[:9]
    batches = minilm.batches(chosen, 4)
    assert [len(b.indices) for b in batches] == [4, 4, 1]
    assert sorted(i for b in batches for i in b.indices.tolist()) == list(range(9))
    for batch in batches:
        lengths = batch.attention_mask.sum(axis=1)
        assert batch.input_ids.dtype == batch.attention_mask.dtype == np.int32
        assert batch.input_ids.shape == batch.attention_mask.shape == (len(batch.indices), lengths.max())
        for row, index in enumerate(batch.indices):
            alone = minilm.tokenizer().encode(chosen[index]).ids
            np.testing.assert_array_equal(batch.input_ids[row, :lengths[row]], alone[:lengths[row]])
            assert not batch.input_ids[row, lengths[row]:].any()
    with pytest.raises(ValueError, match="batch_size must be at least 1"):
        minilm.batches(chosen, 0)


def test_examples_span_the_ranges(sentences):
    examples = minilm.examples(sentences, BATCH, MAX_LENGTH)
    shapes = [e["input_ids"].shape for e in examples]
    assert min(shapes) == (1, 1) and max(shapes) == (BATCH, MAX_LENGTH)
    assert all(e["attention_mask"].shape == e["input_ids"].shape and e["attention_mask"].any() for e in examples)


@pytest.mark.parametrize("precision", COSINE)
def test_optimize_keeps_every_embedding(models, sentences, original_embeddings, precision):
    """Every sentence's embedding (batches of 4 up to 88 tokens: beyond T = 64 the ops' generic kernels)."""
    loaded, reports = models
    optimized = minilm.embed(loaded[precision].signatures["serving_default"], sentences, BATCH)
    similarity = cosines(optimized, original_embeddings)
    worst = int(np.argmin(similarity))
    assert similarity.min() >= COSINE[precision], (sentences[worst], similarity[worst])
    if precision != "float32":  # the precision runs: the accuracy gate left (nearly) every dense layer in it
        gate = reports[precision].accuracy_gate
        assert gate.put_back <= PUT_BACK[precision], gate
