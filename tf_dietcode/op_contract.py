"""What the op library and the Python side must agree on, read from op_contract.json.

ops/op_contract.json is the one definition: the op library compiles it in as
op_contract.h, and it ships here as package data (in the source tree
tf_dietcode/op_contract.json links to it). Plain Python with no TensorFlow, so
the tuner and its workers read it cheaply.
"""

import importlib.resources
import json

_CONTRACT = json.loads(importlib.resources.files(__package__).joinpath("op_contract.json").read_text())

# The fused ops' activations ("none" first, the op's default).
ACTIVATIONS: tuple[str, ...] = tuple(_CONTRACT["activations"])
# The kernel-bundle manifest format the op library reads and tuning.bundle writes.
BUNDLE_FORMAT: int = _CONTRACT["bundle_format"]
# How the int8 and bfloat16 dense ops' weights are packed: blocks of LOW_PRECISION_BLOCK_COLUMNS output
# columns, K in groups of LOW_PRECISION_GROUP_BYTES bytes within a block (4 int8 or 2 bfloat16 values).
LOW_PRECISION_BLOCK_COLUMNS: int = _CONTRACT["low_precision_layout"]["block_columns"]
LOW_PRECISION_GROUP_BYTES: int = _CONTRACT["low_precision_layout"]["group_bytes"]
