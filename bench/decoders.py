"""Transformer translators whose decoder runs step by step in a tf.while_loop, as users write them.

- GreedyTranslator: TF's Transformer tutorial's export (a tf.Module whose
  tf.function encodes the source once, then loops over a TensorArray of ids,
  re-running the Keras decoder on the whole prefix and appending the argmax of
  its last position, stopping at END or max_len).
- BeamSearchTranslator: a KV-cache decoder with beam search. Each step runs the
  decoder on the newest token only: per layer, one query against self-attention
  key/value caches that grow by one position per step, and cross-attention
  against keys/values of the encoder's output computed once before the loop;
  then the beam bookkeeping (log-softmax, top-k over beams x vocabulary, caches
  and sequences gathered by the chosen beams).

The caches grow by tf.concat, as Hugging Face's TF decoders (past_key_values)
and TF Model Garden's CachedAttention off TPU write them; a preallocated cache
written with tensor_scatter_nd_update (`cache="preallocated"`, the TPU form:
static shapes, every step attends over max_len positions under a mask) is the
other form, kept for the rewriter's tests.

Both are built from Keras layers with seeded random weights; both signatures
take the source ids [batch, source length] and max_len (a scalar), and return
the ids (and the logits of each greedy step, or each beam's summed log
probability). Everything is deterministic on the CPU, so ids compare exactly.
"""

import dataclasses

import keras
import numpy as np
import tensorflow as tf

START, END, PAD = 1, 2, 0


@dataclasses.dataclass(frozen=True)
class DecoderConfig:
    name: str
    layers: int           # encoder layers, and as many decoder layers
    d_model: int
    heads: int
    ffn: int
    vocabulary: int
    beam: int = 4
    max_positions: int = 128  # the positional encoding's table: source and output lengths up to this
    end_bias: float = 0.0     # added to END's logit: an untrained model's odds of stopping (a trained one
    #                           stops where its translation ends); very negative: always max_len tokens

    @property
    def depth(self) -> int:
        return self.d_model // self.heads


TRANSFORMER_BASE = DecoderConfig("transformer_base", layers=6, d_model=512, heads=8, ffn=2048, vocabulary=8000)
SMALL = DecoderConfig("small", layers=2, d_model=32, heads=4, ffn=64, vocabulary=50, beam=4)


def positional_encoding(length: int, depth: int) -> np.ndarray:
    """The tutorial's sinusoidal table [length, depth]: sines in the first half, cosines in the second."""
    positions = np.arange(length)[:, None]
    rates = 1 / (10000 ** (np.arange(depth // 2)[None, :] / (depth // 2)))
    angles = positions * rates
    return np.concatenate([np.sin(angles), np.cos(angles)], axis=-1).astype(np.float32)


class FeedForward(keras.layers.Layer):
    def __init__(self, config: DecoderConfig):
        super().__init__()
        self.inner = keras.layers.Dense(config.ffn, activation="relu")
        self.outer = keras.layers.Dense(config.d_model)
        self.norm = keras.layers.LayerNormalization()

    def call(self, x):
        return self.norm(x + self.outer(self.inner(x)))


class EncoderLayer(keras.layers.Layer):
    def __init__(self, config: DecoderConfig):
        super().__init__()
        self.attention = keras.layers.MultiHeadAttention(config.heads, config.depth)
        self.norm = keras.layers.LayerNormalization()
        self.ffn = FeedForward(config)

    def call(self, x):
        return self.ffn(self.norm(x + self.attention(x, x)))


class Encoder(keras.layers.Layer):
    def __init__(self, config: DecoderConfig):
        super().__init__()
        self.config = config
        self.embedding = keras.layers.Embedding(config.vocabulary, config.d_model)
        self.positions = tf.constant(positional_encoding(config.max_positions, config.d_model))
        self.stack = [EncoderLayer(config) for _ in range(config.layers)]

    def call(self, tokens):
        x = self.embedding(tokens) * np.sqrt(self.config.d_model).astype(np.float32)
        x = x + self.positions[tf.newaxis, : tf.shape(tokens)[1]]
        for layer in self.stack:
            x = layer(x)
        return x


class PrefixDecoderLayer(keras.layers.Layer):
    """The tutorial's decoder layer: causal self-attention, cross-attention, feed-forward."""

    def __init__(self, config: DecoderConfig):
        super().__init__()
        self.self_attention = keras.layers.MultiHeadAttention(config.heads, config.depth)
        self.cross_attention = keras.layers.MultiHeadAttention(config.heads, config.depth)
        self.self_norm, self.cross_norm = keras.layers.LayerNormalization(), keras.layers.LayerNormalization()
        self.ffn = FeedForward(config)

    def call(self, x, memory):
        x = self.self_norm(x + self.self_attention(x, x, use_causal_mask=True))
        x = self.cross_norm(x + self.cross_attention(x, memory))
        return self.ffn(x)


class GreedyTranslator(tf.Module):
    """Greedy decoding that re-runs the decoder on the whole prefix each step (no cache)."""

    def __init__(self, config: DecoderConfig, seed: int = 0):
        super().__init__()
        keras.utils.set_random_seed(seed)
        self.config = config
        self.encoder = Encoder(config)
        self.embedding = keras.layers.Embedding(config.vocabulary, config.d_model)
        self.positions = tf.constant(positional_encoding(config.max_positions, config.d_model))
        self.stack = [PrefixDecoderLayer(config) for _ in range(config.layers)]
        self.logits = keras.layers.Dense(config.vocabulary)
        self._decode(tf.fill([1, 1], START), self.encoder(tf.fill([1, 2], 3)))  # builds the layers
        _bias_end(self.logits, config)

    def _decode(self, prefix, memory):
        x = self.embedding(prefix) * np.sqrt(self.config.d_model).astype(np.float32)
        x = x + self.positions[tf.newaxis, : tf.shape(prefix)[1]]
        for layer in self.stack:
            x = layer(x, memory)
        return self.logits(x)

    @tf.function(input_signature=[tf.TensorSpec([None, None], tf.int32, name="tokens"),
                                  tf.TensorSpec([], tf.int32, name="max_len")])
    def translate(self, tokens, max_len):
        return greedy_decoding(self._decode, self.encoder(tokens), max_len, self.config.vocabulary)


def greedy_decoding(decode, memory: tf.Tensor, max_len: tf.Tensor, vocabulary: int, start: int = START,
                    end: int = END) -> dict[str, tf.Tensor]:
    """The tutorial's loop (inside a tf.function): decode(prefix [batch, i], memory) -> logits
    [batch, i, vocabulary] re-run on the prefix each step, its last position's argmax appended,
    until every sentence produced `end` or max_len steps; the ids [batch, steps + 1] (from
    `start`) and each step's logits [batch, steps, vocabulary]."""
    ids = tf.TensorArray(tf.int32, size=0, dynamic_size=True).write(0, tf.fill([tf.shape(memory)[0]], start))
    logits = tf.TensorArray(tf.float32, size=0, dynamic_size=True, element_shape=[None, vocabulary])
    for i in tf.range(max_len):
        step = decode(tf.transpose(ids.stack()), memory)[:, -1, :]
        predicted = tf.argmax(step, axis=-1, output_type=tf.int32)
        ids, logits = ids.write(i + 1, predicted), logits.write(i, step)
        if tf.reduce_all(predicted == end):
            break
    return {"ids": tf.transpose(ids.stack()), "logits": tf.transpose(logits.stack(), [1, 0, 2])}


class CachedAttention(keras.layers.Layer):
    """Multi-head attention of new queries against keys and values given per head,
    [rows, heads, positions, depth], written with tf.matmul as hand-written KV-cache decoders do."""

    def __init__(self, config: DecoderConfig):
        super().__init__()
        self.heads, self.depth = config.heads, config.depth
        self.query, self.key, self.value, self.out = (keras.layers.Dense(config.d_model) for _ in range(4))

    def split(self, x):
        """[rows, length, d_model] -> [rows, heads, length, depth]."""
        return tf.transpose(tf.reshape(x, [tf.shape(x)[0], -1, self.heads, self.depth]), [0, 2, 1, 3])

    def keys_and_values(self, x):
        return self.split(self.key(x)), self.split(self.value(x))

    def attend(self, x, keys, values, bias=None):
        q = self.split(self.query(x)) * (1.0 / np.sqrt(self.depth)).astype(np.float32)
        scores = tf.matmul(q, keys, transpose_b=True)
        if bias is not None:
            scores = scores + bias
        context = tf.transpose(tf.matmul(tf.nn.softmax(scores), values), [0, 2, 1, 3])
        return self.out(tf.reshape(context, [tf.shape(x)[0], -1, self.heads * self.depth]))


class CachedDecoderLayer(keras.layers.Layer):
    def __init__(self, config: DecoderConfig):
        super().__init__()
        self.self_attention, self.cross_attention = CachedAttention(config), CachedAttention(config)
        self.self_norm, self.cross_norm = keras.layers.LayerNormalization(), keras.layers.LayerNormalization()
        self.ffn = FeedForward(config)


class BeamSearchTranslator(tf.Module):
    """Beam search over a KV-cache decoder: one new token per beam per step.

    Caches are [batch * beam, heads, positions, depth] per layer (keys and values).
    A finished beam (it produced END) extends only with END at no cost. Scores are
    the beams' summed log probabilities (no length penalty); the result holds the
    beams best first.
    """

    def __init__(self, config: DecoderConfig, seed: int = 0, cache: str = "concat"):
        super().__init__()
        if cache not in ("concat", "preallocated"):
            raise ValueError(f"cache must be 'concat' or 'preallocated', not {cache!r}")
        keras.utils.set_random_seed(seed)
        self.config, self.cache = config, cache
        self.encoder = Encoder(config)
        self.embedding = keras.layers.Embedding(config.vocabulary, config.d_model)
        self.positions = tf.constant(positional_encoding(config.max_positions, config.d_model))
        self.stack = [CachedDecoderLayer(config) for _ in range(config.layers)]
        self.logits = keras.layers.Dense(config.vocabulary)
        self.translate(tf.fill([1, 2], 3), tf.constant(1))  # builds the layers
        _bias_end(self.logits, config)

    def _step(self, token, position, caches, crosses, cross_bias, positions_seen):
        """Logits [rows, vocabulary] for each row's newest token at `position`, and the caches with it."""
        x = self.embedding(token[:, tf.newaxis]) * np.sqrt(self.config.d_model).astype(np.float32)
        x = x + self.positions[position]
        updated = []
        for layer, (keys, values), (cross_keys, cross_values) in zip(self.stack, caches, crosses):
            new_keys, new_values = layer.self_attention.keys_and_values(x)
            keys, values = self._write(keys, new_keys, position), self._write(values, new_values, position)
            updated.append((keys, values))
            x = layer.self_norm(x + layer.self_attention.attend(x, keys, values, positions_seen))
            x = layer.cross_norm(x + layer.cross_attention.attend(x, cross_keys, cross_values, cross_bias))
            x = layer.ffn(x)
        return self.logits(x)[:, 0, :], updated

    def _write(self, cache, new, position):
        if self.cache == "concat":
            return tf.concat([cache, new], axis=2)
        # [rows, heads, max positions, depth]: position's slot of every row and head
        rows_heads = tf.shape(cache)[0] * self.config.heads
        flat = tf.reshape(cache, [rows_heads, -1, self.config.depth])
        indices = tf.stack([tf.range(rows_heads), tf.fill([rows_heads], position)], axis=1)
        flat = tf.tensor_scatter_nd_update(flat, indices, tf.reshape(new, [rows_heads, self.config.depth]))
        return tf.reshape(flat, tf.shape(cache))

    @tf.function(input_signature=[tf.TensorSpec([None, None], tf.int32, name="tokens"),
                                  tf.TensorSpec([], tf.int32, name="max_len")])
    def translate(self, tokens, max_len):
        config, beam = self.config, self.config.beam
        batch = tf.shape(tokens)[0]
        rows = batch * beam
        memory = tf.repeat(self.encoder(tokens), beam, axis=0)  # [rows, source, d_model], beam-major per sentence
        crosses = [layer.cross_attention.keys_and_values(memory) for layer in self.stack]
        cross_bias = tf.repeat(tf.cast(tokens == PAD, tf.float32) * -1e9, beam, axis=0)[:, tf.newaxis, tf.newaxis, :]
        length = 0 if self.cache == "concat" else max_len
        empty = tf.zeros([rows, config.heads, length, config.depth])
        caches = [(empty, empty) for _ in self.stack]
        # only the first beam is alive at the start: the others would repeat it
        scores = tf.tile(tf.constant([[0.0] + [-np.inf] * (beam - 1)]), [batch, 1])
        ids = tf.fill([batch, beam, 1], START)
        finished = tf.zeros([batch, beam], tf.bool)
        only_end = tf.constant(np.where(np.arange(config.vocabulary) == END, 0.0, -np.inf).astype(np.float32))

        def body(i, ids, scores, finished, caches):
            seen = None if self.cache == "concat" else \
                tf.where(tf.range(max_len) <= i, 0.0, -1e9)[tf.newaxis, tf.newaxis, tf.newaxis, :]
            logits, caches = self._step(tf.reshape(ids[:, :, -1], [-1]), i, caches, crosses, cross_bias, seen)
            log_probs = tf.reshape(tf.nn.log_softmax(logits), [batch, beam, config.vocabulary])
            log_probs = tf.where(finished[:, :, tf.newaxis], only_end, log_probs)
            candidates = tf.reshape(scores[:, :, tf.newaxis] + log_probs, [batch, beam * config.vocabulary])
            scores, chosen = tf.math.top_k(candidates, k=beam)
            parent, token = chosen // config.vocabulary, chosen % config.vocabulary
            ids = tf.concat([tf.gather(ids, parent, batch_dims=1), token[:, :, tf.newaxis]], axis=2)
            finished = tf.gather(finished, parent, batch_dims=1) | (token == END)
            rows_from = tf.reshape(parent + tf.range(batch)[:, tf.newaxis] * beam, [-1])
            caches = [tuple(tf.gather(c, rows_from) for c in pair) for pair in caches]
            return i + 1, ids, scores, finished, caches

        cache_shape = tf.TensorShape([None, config.heads, None, config.depth])
        _, ids, scores, _, _ = tf.while_loop(
            lambda i, ids, scores, finished, caches: tf.logical_and(i < max_len, ~tf.reduce_all(finished)),
            body, (tf.constant(0), ids, scores, finished, caches),
            shape_invariants=(tf.TensorShape([]), tf.TensorShape([None, beam, None]), tf.TensorShape([None, beam]),
                              tf.TensorShape([None, beam]), [(cache_shape, cache_shape)] * config.layers))
        return {"ids": ids, "scores": scores}


def _bias_end(logits: keras.layers.Dense, config: DecoderConfig) -> None:
    logits.bias.assign(tf.tensor_scatter_nd_update(logits.bias, [[END]], [config.end_bias]))


def export(model: tf.Module, directory) -> None:
    """The model's translate as the SavedModel's serving_default signature."""
    tf.saved_model.save(model, str(directory), signatures={"serving_default": model.translate})


def source_tokens(config: DecoderConfig, batch: int, length: int, seed: int = 0) -> np.ndarray:
    """Random source ids (no PAD, START or END) [batch, length]."""
    return np.random.default_rng(seed).integers(3, config.vocabulary, (batch, length)).astype(np.int32)
