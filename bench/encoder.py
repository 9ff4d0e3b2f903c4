"""BERT-style encoders built with Keras 3 layers as users write them, and the
interleaved timing both end-to-end benchmarks use.

Token and position embeddings, then per layer MultiHeadAttention, a residual
LayerNorm, a GELU feed-forward block and another residual LayerNorm; the
sequence length (and batch) stay dynamic in the exported signature.
"""

import dataclasses
import random
import statistics
import time
from collections.abc import Callable

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


def median_seconds(calls: dict[str, Callable[[], object]], repeats: int = 41,
                   budget_seconds: float | None = None,
                   check: Callable[[dict[str, object]], None] | None = None) -> dict[str, float]:
    """Median seconds of each call, the calls interleaved so drift on a noisy machine hits all alike."""
    samples = interleaved_seconds(calls, repeats, budget_seconds, check)
    return {name: statistics.median(values) for name, values in samples.items()}


def interleaved_seconds(calls: dict[str, Callable[[], object]], repeats: int = 41,
                        budget_seconds: float | None = None,
                        check: Callable[[dict[str, object]], None] | None = None,
                        shuffle: random.Random | None = None) -> dict[str, list[float]]:
    """Seconds of each call per round, every round calling each once (in a fresh order with `shuffle`).

    With a budget, fewer repeats (at least 3) when the first timed round takes
    long (sized after the warm-up, which may compile: XLA's first call at a
    shape). `check` gets the warm-up round's outputs by name, so checking
    results costs no call of its own (a BERT-base call at batch 16 takes
    seconds here). Round i of every call lists at index i, so ratios can be
    paired by round.
    """
    samples = {name: [] for name in calls}

    def timed_round() -> float:
        names = list(calls)
        if shuffle is not None:
            shuffle.shuffle(names)
        for name in names:
            start = time.perf_counter()
            calls[name]()
            samples[name].append(time.perf_counter() - start)
        return sum(values[-1] for values in samples.values())

    outputs = {name: call() for name, call in calls.items()}  # warm up
    if check is not None:
        check(outputs)
    first_round = timed_round()
    if budget_seconds is not None:
        repeats = max(3, min(repeats, int(budget_seconds / max(first_round, 1e-6))))
    for _ in range(repeats - 1):
        timed_round()
    return samples
