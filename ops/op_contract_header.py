"""Writes op_contract.h, the op library's view of ops/op_contract.json.

The JSON is the one definition of what the op library and tf_dietcode's Python
must agree on; C++ reads it through this generated header, which setup.py and
the BUILD file's genrule write into their build folders. Standard library
only, so either build runs it without the package.

    python3 ops/op_contract_header.py ops/op_contract.json OUT/op_contract.h
"""

import json
import pathlib
import sys


def _enumerator(activation: str) -> str:
    """The C++ enumerator of an activation, e.g. 'gelu_tanh' -> kGeluTanh."""
    return "k" + "".join(part.capitalize() for part in activation.split("_"))


def header(contract: dict) -> str:
    """op_contract.h for a parsed op_contract.json."""
    activations = contract["activations"]
    enumerators = ", ".join(_enumerator(a) for a in activations)
    names = "".join(f'    {{Activation::{_enumerator(a)}, "{a}"}},\n' for a in activations)
    attr = ", ".join(f"'{a}'" for a in activations)
    layout = contract["low_precision_layout"]
    return f"""\
// Generated from ops/op_contract.json by ops/op_contract_header.py: edit the JSON.
#ifndef TF_DIETCODE_OPS_OP_CONTRACT_H_
#define TF_DIETCODE_OPS_OP_CONTRACT_H_

#include <cstdint>

namespace tf_dietcode {{

// The kernel-bundle manifest format this library reads (tuning/bundle.py writes it).
inline constexpr int64_t kBundleFormat = {int(contract["bundle_format"])};

// The fused ops' activations.
enum class Activation {{ {enumerators} }};

struct ActivationName {{
  Activation activation;
  const char* name;
}};
inline constexpr ActivationName kActivationNames[] = {{
{names}}};

// How the int8 and bfloat16 dense ops' weights are packed: blocks of
// kLowPrecisionBlockColumns output columns, K in groups of
// kLowPrecisionGroupBytes bytes within a block.
inline constexpr int64_t kLowPrecisionBlockColumns = {int(layout["block_columns"])};
inline constexpr int64_t kLowPrecisionGroupBytes = {int(layout["group_bytes"])};

// The `activation` attr of the ops that take one.
inline constexpr char kActivationAttr[] =
    "activation: {{{attr}}} = '{activations[0]}'";

}}  // namespace tf_dietcode

#endif  // TF_DIETCODE_OPS_OP_CONTRACT_H_
"""


def write_header(contract_path: pathlib.Path, header_path: pathlib.Path) -> None:
    """Writes the header for the JSON at contract_path (its folder made if need be)."""
    header_path.parent.mkdir(parents=True, exist_ok=True)
    header_path.write_text(header(json.loads(contract_path.read_text())))


if __name__ == "__main__":
    write_header(pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2]))
