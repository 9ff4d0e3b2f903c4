"""Dense layers in a graph, in every form TF and Keras emit them.

A dense layer is  act(x @ W + b)  contracting x's trailing dims with a weight
fixed at optimize time. The forms:

  MatMul(x, W) [transpose_b: W stored [N, K]]           Keras Dense on 2-D input
  Reshape(MatMul(Reshape(...), W), shape)               Keras Dense on N-D input (tensordot, matmul)
  BatchMatMulV2(x, W) [adj_y: W stored [N, K]]          tf.matmul of an N-D input by a matrix
  Einsum 'abc,cde->abde', 'abcd,cde->abe', ...           EinsumDense (attention projections)

then optionally BiasAdd/Add/AddV2 of a fixed bias, then optionally Relu,
Tanh, Sigmoid, GELU or SiLU in the forms TF emits (activation_patterns).
A step is only taken while the previous result has no other reader.
"""

import dataclasses
import math

import numpy as np

from tf_dietcode.graph_rewrite.analysis.graph_index import GraphIndex, tensor_name
from tf_dietcode.graph_rewrite.fusions import activation_patterns
from tf_dietcode.graph_rewrite.fusions.contract import LeftAlone

SIMPLE_ACTIVATIONS = {"Relu": "relu", "Tanh": "tanh", "Sigmoid": "sigmoid"}


class WeightDims:
    """K and N of a dense layer (or group) from its [K, N] `weight`."""
    weight: np.ndarray

    @property
    def k(self) -> int:
        return self.weight.shape[0]

    @property
    def n(self) -> int:
        return self.weight.shape[1]


@dataclasses.dataclass
class DenseMatch(WeightDims):
    form: str                 # "matmul", "tensordot" or "einsum"
    core: str                 # the MatMul/Einsum node, naming the match
    x: str                    # the layer's input tensor
    contracted: int           # trailing dims of x contracted (K is their product)
    weight: np.ndarray        # [K, N] float32
    out_dims: list[int]       # the output's trailing dims (N is their product)
    bias: str | None = None   # a tensor holding N values: [N], or shaped as out_dims
    bias_shape: tuple[int, ...] = ()
    activation: str = "none"
    output: str = ""          # the tensor the fused op's result replaces
    out_shape: str | None = None  # a tensor with the output's shape, where the graph computes one the
    #                               rewriter cannot prove is x's rows then out_dims (then x is [M, K])
    source: str = ""          # what x flattens, when the graph flattens it (tensordot); else x

    def __post_init__(self):
        self.source = self.source or self.x


def find(index: GraphIndex) -> tuple[list[DenseMatch], list[LeftAlone]]:
    matches, left = [], []
    for node in index.nodes.values():
        if node.op not in CORES or index.value(f"{node.name}:0") is not None:
            continue  # (a product of weights alone, as LoRA's A @ B, is part of the weight it computes)
        core = CORES[node.op](index, node)
        if isinstance(core, LeftAlone):
            if core.reason:  # an empty reason: not a dense layer at all (e.g. attention's einsums)
                left.append(core)
            continue
        _extend_epilogue(index, core)
        matches.append(core)
    return matches, left


def _float_weight(index: GraphIndex, tensor: str) -> np.ndarray | None:
    value = index.value(tensor)
    return None if value is None or value.dtype != np.float32 else value


def _matmul_core(index: GraphIndex, node) -> DenseMatch | LeftAlone:
    form = "matmul"
    if node.attr["T"].type != 1:  # DT_FLOAT
        return LeftAlone(form, node.name, "not float32")
    weight = _float_weight(index, node.input[1])
    if weight is None:
        return LeftAlone(form, node.name, "")  # both operands computed: not a dense layer
    if node.attr["transpose_a"].b:
        return LeftAlone(form, node.name, "transpose_a")
    weight = weight.T if node.attr["transpose_b"].b else weight
    x, output = tensor_name(node.input[0]), f"{node.name}:0"
    match = DenseMatch(form, node.name, x, 1, np.ascontiguousarray(weight), [weight.shape[1]], output=output)
    unflatten = index.sole_consumer(output)
    if _is_flattened(index, x, node) and unflatten is not None and unflatten.op == "Reshape":
        match.form, match.output, match.source = "tensordot", f"{unflatten.name}:0", _flattened_source(index, x)
        out_shape = tensor_name(unflatten.input[1])
        if _unflattens_rows(index, out_shape, match.source, match):
            match.x = match.source  # the op reads the N-D input itself; the graph's reshapes go
        else:  # the graph's own flattening and unflattening stay; only the product between them is fused
            match.out_shape = out_shape
    elif index.shape(x) is not None and len(index.shape(x)) != 2:
        return LeftAlone(form, node.name, "input is not a matrix")
    return match


def _batch_matmul_core(index: GraphIndex, node) -> DenseMatch | LeftAlone:
    """tf.matmul of an N-D x by a 2-D weight: TF broadcasts the matrix over x's batch dims, so
    it is a dense layer on x's rows."""
    form = "matmul"
    weight = index.value(node.input[1])
    if weight is None or weight.ndim != 2:
        return LeftAlone(form, node.name, "")  # a product of two computed operands, or a batch of weights
    if node.attr["T"].type != 1 or weight.dtype != np.float32:  # DT_FLOAT
        return LeftAlone(form, node.name, "not float32")
    if node.attr["adj_x"].b:
        return LeftAlone(form, node.name, "transpose_a")
    weight = weight.T if node.attr["adj_y"].b else weight
    return DenseMatch(form, node.name, tensor_name(node.input[0]), 1, np.ascontiguousarray(weight),
                      [weight.shape[1]], output=f"{node.name}:0")


def _is_flattened(index: GraphIndex, x: str, matmul) -> bool:
    """x = Reshape(X) or Reshape(Transpose(X)) read only by this MatMul: Keras' tensordot, or its
    matmul of an N-D input by a matrix, which reshape the product back afterwards."""
    flatten = index.producer(x)
    return flatten.op == "Reshape" and index.sole_consumer(flatten.name) is matmul


def _flattened_source(index: GraphIndex, x: str) -> str:
    """The tensor x = Reshape(...) flattens, through tensordot's transpose when it keeps the axes."""
    flattened = tensor_name(index.producer(x).input[0])
    transpose = index.producer(flattened)
    if transpose.op == "Transpose":
        perm = index.value(transpose.input[1])
        if perm is not None and list(perm) == list(range(len(perm))):
            return tensor_name(transpose.input[0])
    return flattened


def _unflattens_rows(index: GraphIndex, out_shape: str, source: str, match: "DenseMatch") -> bool:
    """out_shape is tf.tensordot's concat(gather(shape(source), [0 .. r-2]), [N]) and source's last
    dim is K: the product is source's rows, flattened and restored, so the N-D op computes it alone."""
    concat = index.producer(out_shape)
    shape = index.shape(source)
    if concat.op != "ConcatV2" or len(concat.input) != 3 or not shape or shape[-1] != match.k:
        return False
    gather, columns = index.producer(concat.input[0]), index.value(concat.input[1])
    if gather.op != "GatherV2" or columns is None or list(columns.ravel()) != [match.n]:
        return False
    free, axis = index.value(gather.input[1]), index.value(gather.input[2])
    reads = index.producer(gather.input[0])
    return (reads.op == "Shape" and tensor_name(reads.input[0]) == source and axis is not None
            and int(axis) == 0 and index.value(concat.input[2]) == 0
            and free is not None and list(free.ravel()) == list(range(len(shape) - 1)))


def _einsum_core(index: GraphIndex, node) -> DenseMatch | LeftAlone:
    form = "einsum"
    equation = node.attr["equation"].s.decode()
    if len(node.input) != 2 or "..." in equation or "->" not in equation:
        return LeftAlone(form, node.name, f"equation {equation!r}")
    weight = _float_weight(index, node.input[1])
    if weight is None:
        return LeftAlone(form, node.name, "")  # attention's products: both operands computed
    (lhs, rhs), out = equation.split("->")[0].split(","), equation.split("->")[1]
    contracted = [c for c in lhs if c in rhs and c not in out]
    batch = lhs[: len(lhs) - len(contracted)]
    kept = rhs[len(contracted):]
    if lhs != batch + "".join(contracted) or rhs != "".join(contracted) + kept or out != batch + kept:
        return LeftAlone(form, node.name, f"equation {equation!r} is not x[..., K] @ W[K, N]")
    k = math.prod(weight.shape[: len(contracted)])
    return DenseMatch(form, node.name, tensor_name(node.input[0]), len(contracted),
                      np.ascontiguousarray(weight.reshape(k, -1)), list(weight.shape[len(contracted):]),
                      output=f"{node.name}:0")


def _extend_epilogue(index: GraphIndex, match: DenseMatch) -> None:
    """Takes in a following bias add and activation, each only if it is the sole reader."""
    after = index.sole_consumer(match.output)
    if after is not None and after.op in ("BiasAdd", "Add", "AddV2"):
        inputs = [tensor_name(i) for i in after.input]
        other = inputs[1] if inputs[0] == match.output else inputs[0]
        bias = index.value(other)
        if bias is not None and bias.size == match.n and list(bias.shape) in ([match.n], match.out_dims):
            match.bias, match.bias_shape, match.output = other, bias.shape, f"{after.name}:0"
            after = index.sole_consumer(match.output)
    if after is not None and after.op in SIMPLE_ACTIVATIONS:
        match.activation, match.output = SIMPLE_ACTIVATIONS[after.op], f"{after.name}:0"
        return
    activation = activation_patterns.match(index, match.output)  # several readers: no sole consumer
    if activation is not None:
        match.activation, match.output = activation


CORES = {"MatMul": _matmul_core, "BatchMatMulV2": _batch_matmul_core, "BatchMatMulV3": _batch_matmul_core,
         "Einsum": _einsum_core}
