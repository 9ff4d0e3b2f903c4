"""tf_dietcode: fast dynamic-shape Transformer inference in TensorFlow.

Fused matmul ops run DietCode-tuned micro-kernels for any sequence length in a
tuned range, and a generic kernel for every other shape.

TensorFlow is imported on first use of `ops`, `keras` or `load_op_library`, so
the tuner (`tf_dietcode.tuning`) and its measurement workers start without it.
"""

import importlib

__version__ = "0.1.0"
__all__ = ["Converter", "keras", "load_op_library", "ops", "optimize"]


def __getattr__(name):
    if name in ("ops", "keras"):
        return importlib.import_module(f"tf_dietcode.{name}")
    if name in ("optimize", "Converter"):
        return getattr(importlib.import_module("tf_dietcode.optimizer"), name)
    if name == "load_op_library":
        return importlib.import_module("tf_dietcode.op_library").load_op_library
    raise AttributeError(f"module 'tf_dietcode' has no attribute {name!r}")
