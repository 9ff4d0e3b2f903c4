"""An encoder shaped like the BERTs users export (Hugging Face's TFBertModel saved as a SavedModel):
the BERT-base benchmark's second family (`python -m bench.bert_base --families exported`).

Each piece as Hugging Face's TF BERT computes it, from Keras 3 layers and TF ops:
- inputs input_ids, token_type_ids and attention_mask, int32 [batch, T];
- word + position + segment (token type) embeddings, then LayerNorm (hf_bert.BertEmbeddings);
- the padding mask turned into an attention bias once: (1 - mask) * -10000, [batch, 1, 1, T];
- self-attention written out (TFBertSelfAttention): Dense Q, K and V, each reshaped to
  [batch, T, heads, size] and transposed to heads first; scores = matmul(Q, K, transpose_b) / sqrt(size)
  + bias; softmax(scores + 1e-9) (transformers' stable_softmax, its work-around for XLA on the CPU);
  matmul by V, transposed back and reshaped to [batch, T, hidden]; a Dense output projection;
- residual LayerNorms and the exact-GELU feed-forward block (hf_bert.encoder_layers);
- a pooler: Dense with tanh on the first token.
Outputs {"sequence_output": [batch, T, hidden], "pooled_output": [batch, hidden]}. Hugging Face's
check that the ids are within the vocabulary (an Assert) is left out.

    build(config)                      the model, untrained; random_weights + hf_bert.load_weights fill it
    with_random_weights(config, seed)  both steps
    inputs(config, batch, t, seed)     a feed: random ids, two segments, padding at batch > 1
"""

import math

import keras
import numpy as np
import tensorflow as tf

from bench import hf_bert
from bench.hf_bert import Config

BERT_BASE = Config(vocab_size=30522, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                   intermediate_size=3072, max_position_embeddings=512, type_vocab_size=2, layer_norm_eps=1e-12,
                   hidden_act="gelu")
INPUTS = ("input_ids", "token_type_ids", "attention_mask")
OUTPUTS = ("sequence_output", "pooled_output")
MASKED = -10000.0  # the bias of a padded key (Hugging Face's)


class AttentionMaskBias(keras.layers.Layer):
    """attention_mask [batch, T] (1: a token, 0: padding) -> the bias added to every head's scores,
    [batch, 1, 1, T]: 0 at tokens, MASKED at padding."""

    def call(self, mask):
        shape = tf.shape(mask)
        kept = tf.cast(tf.reshape(mask, (shape[0], 1, 1, shape[1])), tf.float32)
        return tf.multiply(tf.subtract(1.0, kept), MASKED)


class SelfAttention(keras.layers.Layer):
    """Hugging Face's TFBertSelfAttention with its output projection (TFBertSelfOutput's Dense); its
    projections are named as Keras' MultiHeadAttention names them (hf_bert.targets reads them)."""

    def __init__(self, config: Config, **kwargs):
        super().__init__(**kwargs)
        self.heads, self.size = config.num_attention_heads, config.head_size
        self.query_dense = keras.layers.Dense(config.hidden_size, name="query")
        self.key_dense = keras.layers.Dense(config.hidden_size, name="key")
        self.value_dense = keras.layers.Dense(config.hidden_size, name="value")
        self.output_dense = keras.layers.Dense(config.hidden_size, name="output")

    def call(self, hidden, bias):
        batch = tf.shape(hidden)[0]

        def split_heads(x):  # [batch, T, hidden] -> [batch, heads, T, size]
            return tf.transpose(tf.reshape(x, (batch, -1, self.heads, self.size)), perm=[0, 2, 1, 3])

        query, key, value = (split_heads(dense(hidden))
                             for dense in (self.query_dense, self.key_dense, self.value_dense))
        scores = tf.add(tf.divide(tf.matmul(query, key, transpose_b=True), math.sqrt(self.size)), bias)
        probabilities = tf.nn.softmax(scores + 1e-9, axis=-1)
        context = tf.transpose(tf.matmul(probabilities, value), perm=[0, 2, 1, 3])
        return self.output_dense(tf.reshape(context, (batch, -1, self.heads * self.size)))


def build(config: Config) -> keras.Model:
    """The encoder with untrained weights ({input_ids, token_type_ids, attention_mask} ->
    {sequence_output, pooled_output})."""
    ids, segments, mask = (keras.Input((None,), dtype="int32", name=name) for name in INPUTS)
    bias = AttentionMaskBias(name="attention_mask_bias")(mask)

    def attend(i: int, hidden: keras.KerasTensor) -> keras.KerasTensor:
        return SelfAttention(config, name=f"layer{i}_attention")(hidden, bias)

    sequence = hf_bert.encoder_layers(config, hf_bert.BertEmbeddings(config, name="embeddings")(ids, segments),
                                      attend)
    pooled = keras.layers.Dense(config.hidden_size, activation="tanh", name="pooler")(sequence[:, 0])
    return keras.Model(dict(zip(INPUTS, (ids, segments, mask))), dict(zip(OUTPUTS, (sequence, pooled))),
                       name="exported_bert")


def random_weights(model: keras.Model, config: Config, seed: int) -> dict[str, np.ndarray]:
    """Weights for `model` by their Hugging Face names, drawn with `seed`: Linear weights [out, in]
    scaled by 1/sqrt(in) (activations keep unit scale at any size, so tanh and GELU stay non-linear),
    LayerNorm scales near 1, biases, LayerNorm offsets and embedding tables small."""
    rng = np.random.default_rng(seed)
    weights = {}
    for name, target in hf_bert.targets(model, config).items():
        shape = target.source_shape
        if name.endswith("LayerNorm.weight"):
            value = 1.0 + 0.1 * rng.standard_normal(shape)
        elif len(shape) == 2 and not name.startswith("embeddings."):
            value = rng.standard_normal(shape) / math.sqrt(shape[1])
        else:
            value = 0.1 * rng.standard_normal(shape)
        weights[name] = value.astype(np.float32)
    return weights


def with_random_weights(config: Config, seed: int = 0) -> keras.Model:
    model = build(config)
    hf_bert.load_weights(model, config, random_weights(model, config, seed))
    return model


def inputs(config: Config, batch: int, t: int, seed: int = 0) -> dict[str, np.ndarray]:
    """A feed at [batch, t], as a tokenizer pads a batch of sentence pairs: random ids (0 is padding),
    the second segment from a random point on, every row but the first padded to a random length
    (the first is t long); at batch 1 no padding."""
    rng = np.random.default_rng([seed, batch, t])
    lengths = np.concatenate([[t], rng.integers(1, t + 1, batch - 1)])
    kept = np.arange(t)[None] < lengths[:, None]
    second = np.arange(t)[None] >= rng.integers(0, lengths + 1)[:, None]
    return {"input_ids": np.where(kept, rng.integers(1, config.vocab_size, (batch, t)), 0).astype(np.int32),
            "token_type_ids": (kept & second).astype(np.int32),
            "attention_mask": kept.astype(np.int32)}
