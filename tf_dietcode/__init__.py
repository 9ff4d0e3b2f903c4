"""tf_dietcode: fast dynamic-shape Transformer inference in TensorFlow.

Fused matmul ops run DietCode-tuned micro-kernels for any sequence length in a
tuned range, and a generic kernel for every other shape.
"""

from tf_dietcode import ops
from tf_dietcode.op_library import load_op_library

__version__ = "0.1.0"
__all__ = ["load_op_library", "ops"]
