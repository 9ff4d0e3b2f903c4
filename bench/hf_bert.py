"""BERT in Hugging Face's terms, from Keras 3 layers: what the all-MiniLM-L6-v2 port (bench/minilm.py)
and the exported-encoder family (bench/exported_bert.py) share.

A Config holds the fields of a BERT config.json; weights go by the names of Hugging Face's checkpoints
in torch's layouts ([out, in] for a Linear); `targets` maps every Keras variable of a model built here
to the weight it holds, so one loader places pretrained and random weights alike. The models name
their layers alike: "embeddings", per layer i "layer{i}_attention" (with query_dense, key_dense,
value_dense and output_dense, as Keras' MultiHeadAttention has them), "layer{i}_attention_norm",
"layer{i}_intermediate", "layer{i}_output", "layer{i}_output_norm", and "pooler" where there is one.
"""

import dataclasses
import json
import math
import pathlib
from collections.abc import Callable

import keras
import numpy as np


@dataclasses.dataclass(frozen=True)
class Config:
    """The fields of a BERT config.json this port reads (Hugging Face's names)."""
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
    def from_file(cls, path: pathlib.Path) -> "Config":
        values = json.loads(path.read_text())
        if values.get("model_type") != "bert" or values.get("position_embedding_type", "absolute") != "absolute":
            raise ValueError(f"{path}: not a BERT with absolute position embeddings")
        if values["hidden_act"] != "gelu":
            raise ValueError(f"{path}: hidden_act {values['hidden_act']!r}, this port computes BERT's exact "
                             "(erf) GELU")
        return cls(**{field.name: values[field.name] for field in dataclasses.fields(cls)})

    @property
    def head_size(self) -> int:
        return self.hidden_size // self.num_attention_heads


class BertEmbeddings(keras.layers.Layer):
    """BERT's input: word + position + token-type embeddings, then LayerNormalization. Without
    token_type_ids every token is of type 0 (one sentence)."""

    def __init__(self, config: Config, **kwargs):
        super().__init__(**kwargs)
        self.word = keras.layers.Embedding(config.vocab_size, config.hidden_size, name="word")
        self.position = keras.layers.Embedding(config.max_position_embeddings, config.hidden_size, name="position")
        self.token_type = keras.layers.Embedding(config.type_vocab_size, config.hidden_size, name="token_type")
        self.norm = keras.layers.LayerNormalization(epsilon=config.layer_norm_eps, name="norm")

    def call(self, ids, token_type_ids=None):
        positions = keras.ops.arange(keras.ops.shape(ids)[1])
        types = keras.ops.zeros_like(ids) if token_type_ids is None else token_type_ids
        return self.norm(self.word(ids) + self.position(positions)[None] + self.token_type(types))


# attend(i, hidden) -> layer i's attention output (after its output projection), from a layer named
# "layer{i}_attention"
Attend = Callable[[int, keras.KerasTensor], keras.KerasTensor]


def encoder_layers(config: Config, hidden: keras.KerasTensor, attend: Attend) -> keras.KerasTensor:
    """BERT's layers on the embeddings: per layer attention, a residual LayerNormalization, the GELU
    feed-forward block and another residual LayerNormalization."""
    for i in range(config.num_hidden_layers):
        hidden = keras.layers.LayerNormalization(epsilon=config.layer_norm_eps,
                                                 name=f"layer{i}_attention_norm")(hidden + attend(i, hidden))
        inner = keras.layers.Dense(config.intermediate_size, activation="gelu", name=f"layer{i}_intermediate")(hidden)
        hidden = keras.layers.LayerNormalization(epsilon=config.layer_norm_eps, name=f"layer{i}_output_norm")(
            hidden + keras.layers.Dense(config.hidden_size, name=f"layer{i}_output")(inner))
    return hidden


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
        # every kernel axis but the last is the input's ([hidden, out] or [heads, size, out])
        linear(f"{prefix}.attention.output.dense", attention.output_dense,
               input_axes=len(attention.output_dense.kernel.shape) - 1)
        norm(f"{prefix}.attention.output.LayerNorm", model.get_layer(f"layer{i}_attention_norm"))
        linear(f"{prefix}.intermediate.dense", model.get_layer(f"layer{i}_intermediate"))
        linear(f"{prefix}.output.dense", model.get_layer(f"layer{i}_output"))
        norm(f"{prefix}.output.LayerNorm", model.get_layer(f"layer{i}_output_norm"))
    if any(layer.name == "pooler" for layer in model.layers):
        linear("pooler.dense", model.get_layer("pooler"))
    return result


def load_weights(model: keras.Model, config: Config, weights: dict[str, np.ndarray],
                 unused: tuple[str, ...] = ()) -> None:
    """Assigns every weight to its variable; a weight left over (other than those named `unused`), a
    variable left unfilled or a shape that does not fit is a ValueError naming them (nothing is
    assigned then)."""
    wanted = targets(model, config)
    problems = []
    missing = sorted(set(wanted) - set(weights))
    unknown = sorted(set(weights) - set(wanted) - set(unused))
    if missing:
        problems.append(f"weights the model needs are missing: {missing}")
    if unknown:
        problems.append(f"weights this port does not place: {unknown}")
    if set(map(id, (t.variable for t in wanted.values()))) != set(map(id, model.weights)):
        problems.append("some of the model's variables have no weight")
    if "embeddings.position_ids" in weights and not np.array_equal(
            weights["embeddings.position_ids"].reshape(-1), np.arange(config.max_position_embeddings)):
        problems.append("embeddings.position_ids is not 0..max_position_embeddings-1 (positions this port "
                        "does not compute)")
    for name, target in wanted.items():
        if name in weights and weights[name].shape != target.source_shape:
            problems.append(f"{name}: shape {weights[name].shape}, {target.variable.path} "
                            f"{tuple(target.variable.shape)} wants {target.source_shape}")
    if problems:
        raise ValueError("the weights do not fit the model: " + "; ".join(problems))
    for name, target in wanted.items():
        target.variable.assign(target.convert(weights[name]).astype(np.float32))


def export(model: keras.Model, path: pathlib.Path | str) -> None:
    """A model built here as a SavedModel: serving_default takes its inputs (int32 [batch, T], by their
    names, batch and T dynamic) and returns its dict of outputs."""
    import tensorflow as tf

    archive = keras.export.ExportArchive()
    archive.track(model)
    spec = {t.name: tf.TensorSpec([None, None], tf.int32, name=t.name) for t in model.inputs}
    archive.add_endpoint("serve", lambda inputs: model(inputs, training=False), input_signature=[spec])
    archive.write_out(str(path), verbose=False)
