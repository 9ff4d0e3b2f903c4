"""The precision modes optimize(precision=...) and DietDense(precision=...) take, by name.

PRECISIONS is the one registry (contract.Precision says what a mode is):
adding one is its module and its line here.
"""

from tf_dietcode.precision.bf16_dense import Bfloat16
from tf_dietcode.precision.contract import Precision
from tf_dietcode.precision.float32_dense import Float32
from tf_dietcode.precision.int8_dense import Int8

PRECISIONS: dict[str, Precision] = {"float32": Float32(), "bfloat16": Bfloat16(), "int8": Int8()}
FLOAT32 = PRECISIONS["float32"]


def get(name: str) -> Precision:
    """The mode of that name; ValueError naming the choices for any other."""
    if name not in PRECISIONS:
        raise ValueError(f"unknown precision {name!r}: give one of {list(PRECISIONS)}")
    return PRECISIONS[name]
