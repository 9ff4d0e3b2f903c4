"""The paper's and the seeds' kernel workloads at sequence length T.

Each workload names its inputs' shapes, its FLOP count, and the same
computation written two ways: with a tf_dietcode fused op and with the standard
TF ops a model would contain (which Grappler and oneDNN then optimize).
"""

import dataclasses
from collections.abc import Callable

import numpy as np
import tensorflow as tf

import tf_dietcode
from tf_dietcode import reference

SEQUENCE_LENGTHS = (1, 5, 17, 24, 43, 62, 81, 100, 119, 128)
QUICK_SEQUENCE_LENGTHS = (1, 17, 62, 128)


@dataclasses.dataclass(frozen=True)
class Workload:
    name: str
    shapes: Callable[[int], list[tuple[int, ...]]]
    flops: Callable[[int], float]
    dietcode: Callable[..., tf.Tensor]
    tensorflow: Callable[..., tf.Tensor]

    def inputs(self, t: int, seed: int = 0) -> list[tf.Tensor]:
        rng = np.random.default_rng(seed)
        return [tf.constant(rng.standard_normal(s, dtype=np.float32)) for s in self.shapes(t)]


def dense_name(batch: int, n: int, k: int) -> str:
    """e.g. dense_b16_[16T,768]x[2304,768]^T: X [batch*T, k] times W [n, k] transposed."""
    rows = "T" if batch == 1 else f"{batch}T"
    return f"dense_b{batch}_[{rows},{k}]x[{n},{k}]^T"


BMM_NT = "bmm_nt_[192,T,64]x[192,T,64]^T"
BMM_NN = "bmm_nn_[192,T,T]x[192,T,64]"


def tf_dense(a: tf.Tensor, w: tf.Tensor, bias: tf.Tensor) -> tf.Tensor:
    """TF's MatMul + BiasAdd with the weight stored [K, N], as Keras' Dense stores it.

    The paper writes the product X W^T; given W as [N, K] with transpose_b, TF's
    MatMul ran 11x slower at M = 1, 7x at M = 5, 1.9x at M = 17 and 1.15-1.28x
    at M = 62-128 on a 2-core Zen 1 (interleaved, in-graph), which flattered
    every kernel compared with it.
    """
    return reference.fused_matmul(a, w, bias)


def _dense(batch: int, n: int = 2304, k: int = 768) -> Workload:
    """X [batch*T, k] times the weight, stored [k, n] (tf_dense says why)."""
    return Workload(
        name=dense_name(batch, n, k),
        shapes=lambda t: [(batch * t, k), (k, n), (n,)],
        flops=lambda t: 2.0 * batch * t * n * k,
        dietcode=lambda a, w, bias: tf_dietcode.ops.fused_matmul(a, w, bias),
        tensorflow=tf_dense,
    )


def _batch_matmul(name, x_shape, y_shape, adj_y, flops) -> Workload:
    """A plain batch matmul: the transpose op with the identity permutation."""
    return Workload(
        name=name,
        shapes=lambda t: [x_shape(t), y_shape(t)],
        flops=flops,
        dietcode=lambda x, y: tf_dietcode.ops.fused_batch_matmul_transpose(x, y, [0, 1, 2], adj_y=adj_y),
        tensorflow=lambda x, y: tf.linalg.matmul(x, y, adjoint_b=adj_y),
    )


def _attention_scores(batch, heads, m, n, k, name) -> Workload:
    """q @ k^T + mask, the mask broadcast over heads and query positions."""
    return Workload(
        name=name,
        shapes=lambda t: [(batch, heads, m(t), k), (batch, heads, n(t), k), (batch, 1, 1, n(t))],
        flops=lambda t: 2.0 * batch * heads * m(t) * n(t) * k,
        dietcode=lambda q, kk, mask: tf_dietcode.ops.fused_batch_matmul_add(q, kk, mask, adj_y=True),
        tensorflow=lambda q, kk, mask: reference.fused_batch_matmul_add(q, kk, mask, adj_y=True),
    )


def _attention_context(batch, heads, m, k, n, name) -> Workload:
    """probs @ v, transposed back to [batch, time, heads, depth]."""
    return Workload(
        name=name,
        shapes=lambda t: [(batch, heads, m(t), k(t)), (batch, heads, k(t), n)],
        flops=lambda t: 2.0 * batch * heads * m(t) * n * k(t),
        dietcode=lambda p, v: tf_dietcode.ops.fused_batch_matmul_transpose(p, v, [0, 2, 1, 3]),
        tensorflow=lambda p, v: reference.fused_batch_matmul_transpose(p, v, perm=[0, 2, 1, 3]),
    )


def _same(t):
    return t


WORKLOADS = [
    _dense(16),
    _dense(1),
    # BERT-base's other dense layers at batch 16: attention output, FFN in and out.
    _dense(16, 768, 768),
    _dense(16, 3072, 768),
    _dense(16, 768, 3072),
    _batch_matmul(BMM_NT, lambda t: (192, t, 64), lambda t: (192, t, 64), True,
                  lambda t: 2.0 * 192 * t * t * 64),
    _batch_matmul(BMM_NN, lambda t: (192, t, t), lambda t: (192, t, 64), False,
                  lambda t: 2.0 * 192 * t * t * 64),
    _attention_scores(16, 12, _same, _same, 64, "bmm_add_16x12xTx64"),
    _attention_context(16, 12, _same, _same, 64, "bmm_transpose_16x12xTxT"),
    # The seeds' fused-op shape: batch 64, 8 heads, M=1, N=17, K=128 (T unused).
    _attention_scores(64, 8, lambda t: 1, lambda t: 17, 128, "seed_bmm_add_64x8x1x17x128"),
    _attention_context(64, 8, lambda t: 1, lambda t: 17, 128, "seed_bmm_transpose_64x8x1x17x128"),
]
