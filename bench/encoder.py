"""BERT-style encoders built with Keras 3 layers as users write them (the end-to-end benchmarks' models).

Token and position embeddings, then per layer MultiHeadAttention, a residual
LayerNorm, a GELU feed-forward block and another residual LayerNorm; the
sequence length (and batch) stay dynamic in the exported signature.
"""

import dataclasses

import keras


@dataclasses.dataclass(frozen=True)
class EncoderConfig:
    name: str
    layers: int
    hidden: int
    heads: int
    ffn: int
    vocabulary: int = 1000
    max_length: int = 128
    gelu_approximate: bool = False  # the tanh form, as TF Model Garden's BERT (and tf2onnx can convert it)


DEMO = EncoderConfig("encoder_2x256", layers=2, hidden=256, heads=4, ffn=1024)
BERT_BASE = EncoderConfig("bert_base", layers=12, hidden=768, heads=12, ffn=3072, vocabulary=30522,
                          gelu_approximate=True)


class PositionEmbedding(keras.layers.Layer):
    """Adds a learned embedding of each position (BERT's)."""

    def __init__(self, max_length: int, **kwargs):
        super().__init__(**kwargs)
        self.max_length = max_length

    def build(self, input_shape):
        self.table = self.add_weight(shape=(self.max_length, input_shape[-1]), initializer="random_normal")

    def call(self, tokens):
        return tokens + self.table[: keras.ops.shape(tokens)[1]]


def build(config: EncoderConfig, seed: int = 0) -> keras.Model:
    keras.utils.set_random_seed(seed)

    def gelu(v):
        return keras.activations.gelu(v, approximate=config.gelu_approximate)

    ids = keras.Input((None,), dtype="int32", name="input_ids")
    hidden = PositionEmbedding(config.max_length)(keras.layers.Embedding(config.vocabulary, config.hidden)(ids))
    for _ in range(config.layers):
        attended = keras.layers.MultiHeadAttention(config.heads, config.hidden // config.heads)(hidden, hidden)
        hidden = keras.layers.LayerNormalization()(hidden + attended)
        inner = keras.layers.Dense(config.ffn, activation=gelu)(hidden)
        hidden = keras.layers.LayerNormalization()(hidden + keras.layers.Dense(config.hidden)(inner))
    return keras.Model(ids, hidden)
