"""BERT's forward pass in float64 numpy, written from Hugging Face's BertModel and its weight names alone
(torch's layouts): the reference for the models bench/hf_bert.py builds (all-MiniLM-L6-v2, the exported
encoder family)."""

import numpy as np
from scipy.special import erf

from bench.hf_bert import Config

MASKED = -10000.0  # BertModel's bias at a padded key: exp(MASKED) is 0 in float64, as Keras' masking gives


def forward(w: dict[str, np.ndarray], config: Config, input_ids: np.ndarray, token_type_ids: np.ndarray,
            attention_mask: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
    """(sequence output [batch, T, hidden], pooled output [batch, hidden] or None where `w` has no pooler)
    from float64 weights `w` by Hugging Face's names; the inputs are [batch, T]."""
    eps, heads = config.layer_norm_eps, config.num_attention_heads

    def linear(x, name):  # torch.nn.Linear: x @ weight.T + bias
        return x @ w[f"{name}.weight"].T + w[f"{name}.bias"]

    def layer_norm(x, name):
        mean = x.mean(-1, keepdims=True)
        variance = ((x - mean) ** 2).mean(-1, keepdims=True)
        return (x - mean) / np.sqrt(variance + eps) * w[f"{name}.weight"] + w[f"{name}.bias"]

    def split_heads(x):  # [batch, T, hidden] -> [batch, heads, T, size]
        return x.reshape(*x.shape[:2], heads, -1).transpose(0, 2, 1, 3)

    batch, t = input_ids.shape
    bias = (1.0 - attention_mask[:, None, None, :].astype(np.float64)) * MASKED
    x = layer_norm(w["embeddings.word_embeddings.weight"][input_ids]
                   + w["embeddings.position_embeddings.weight"][np.arange(t)][None]
                   + w["embeddings.token_type_embeddings.weight"][token_type_ids], "embeddings.LayerNorm")
    for i in range(config.num_hidden_layers):
        p = f"encoder.layer.{i}"
        q, k, v = (split_heads(linear(x, f"{p}.attention.self.{n}")) for n in ("query", "key", "value"))
        scores = q @ k.transpose(0, 1, 3, 2) / np.sqrt(q.shape[-1]) + bias
        probabilities = np.exp(scores - scores.max(-1, keepdims=True))
        probabilities /= probabilities.sum(-1, keepdims=True)
        context = (probabilities @ v).transpose(0, 2, 1, 3).reshape(batch, t, -1)
        x = layer_norm(x + linear(context, f"{p}.attention.output.dense"), f"{p}.attention.output.LayerNorm")
        inner = linear(x, f"{p}.intermediate.dense")
        inner = 0.5 * inner * (1.0 + erf(inner / np.sqrt(2.0)))
        x = layer_norm(x + linear(inner, f"{p}.output.dense"), f"{p}.output.LayerNorm")
    pooled = np.tanh(linear(x[:, 0], "pooler.dense")) if "pooler.dense.weight" in w else None
    return x, pooled
