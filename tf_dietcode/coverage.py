"""Coverage: the share of a model's matrix-product FLOPs that its fused ops compute.

Counted at reference inputs (Converter: zero inputs at the middle of the shape
ranges, or input_fn's inputs): the original signature runs on them with every
product node its outputs depend on fetched. A product's FLOPs are 2 x its
output's elements x its contracted size (a multiply and an add per term), and
it counts as fused where the rewritten signature's outputs no longer depend on
it (a fused op computes it instead). Products inside loops' and conds' bodies
cannot be fetched: tf_dietcode.control_flow counts them with recorders inside
the bodies. Those inside functions XLA compiles run as the graph's call nodes:
they are not counted, and the coverage names those calls (and a signature that
fails on the reference inputs, which is not counted either).
"""

import collections
import dataclasses
import math

import tensorflow as tf

from tf_dietcode.graph_rewrite.analysis import shape_ranges
from tf_dietcode.graph_rewrite.analysis.graph_index import ancestors, tensor_name
from tf_dietcode.graph_rewrite.analysis.signature_graph import SignatureGraph

PRODUCTS = frozenset({"MatMul", "BatchMatMul", "BatchMatMulV2", "BatchMatMulV3", "Einsum"})


@dataclasses.dataclass
class Coverage:
    reference: str                   # the inputs the FLOPs are counted at
    fused_flops: int = 0
    total_flops: int = 0
    not_counted: list[str] = dataclasses.field(default_factory=list)  # calls left running, failed computations

    @property
    def share(self) -> float | None:
        """Fused FLOPs over all counted product FLOPs; None where the model has none."""
        return self.fused_flops / self.total_flops if self.total_flops else None

    def add(self, original: SignatureGraph, rewritten: SignatureGraph, inputs: list[list[tf.Tensor]]) -> None:
        """Counts one computation's products on each of `inputs` (in the signature's flat order)."""
        kept = ancestors(rewritten.graph_def, rewritten.output_tensors.values())
        try:
            counted = product_flops(original, inputs)
        except tf.errors.OpError as error:  # ranges reaching beyond what the model accepts
            self.not_counted.append(f"{original.key}: the model fails on the reference inputs "
                                    f"({shape_ranges.op_error_summary(error)})")
            return
        for node, flops in counted.items():
            self.total_flops += flops
            self.fused_flops += flops if node not in kept else 0

    def to_json(self) -> dict:
        return {"reference": self.reference, "share": self.share, "fused_flops": self.fused_flops,
                "total_flops": self.total_flops, "not_counted": self.not_counted}


def product_flops(graph: SignatureGraph, inputs: list[list[tf.Tensor]]) -> dict[str, int]:
    """FLOPs of every product node the signature's outputs depend on, summed over runs on `inputs`."""
    needed = ancestors(graph.graph_def, graph.output_tensors.values())
    products = [node for node in graph.graph_def.node if node.op in PRODUCTS and node.name in needed]
    if not products:
        return {}
    fetched = {}
    for i, node in enumerate(products):
        fetched[f"out_{i}"] = f"{node.name}:0"
        fetched.update({f"in_{i}_{j}": tensor_name(t) for j, t in enumerate(node.input) if not t.startswith("^")})
    function = dataclasses.replace(graph, output_tensors=fetched).function()
    flops = collections.Counter()
    for run in inputs:
        shapes = {name: tensor.shape.as_list() for name, tensor in function(*run).items()}
        for i, node in enumerate(products):
            operands = [shapes[f"in_{i}_{j}"] for j in range(len(node.input)) if f"in_{i}_{j}" in shapes]
            flops[node.name] += 2 * math.prod(shapes[f"out_{i}"]) * _contracted(node, operands)
    return dict(flops)


def _contracted(node, operands: list[list[int]]) -> int:
    """How many terms each output element of a product node sums."""
    if node.op == "MatMul":
        return operands[0][0 if node.attr["transpose_a"].b else 1]
    if node.op != "Einsum":
        return operands[0][-2 if node.attr["adj_x"].b else -1]
    terms, _, output = node.attr["equation"].s.decode().replace(" ", "").partition("->")
    sizes = {}
    for term, shape in zip(terms.split(","), operands):
        head, _, tail = term.partition("...")
        sizes.update(zip(head, shape))
        sizes.update(zip(tail, shape[len(shape) - len(tail):]))
    return math.prod(size for label, size in sizes.items() if label not in output)
