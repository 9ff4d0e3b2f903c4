"""Activations as TE expressions, matching tf_dietcode.reference.ACTIVATIONS."""

import math

from tvm import te, tirx

# erf(x) ~ x * P(x^2) / Q(x^2) on [-4, 4] (+-1 outside in float32): the
# rational approximation Eigen (and so TF's own Erf kernel) uses, max error
# ~1e-7. TVM lowers te.erf to a scalar libm call per element, which made an
# exact-GELU write-back cost more than the product it follows.
_ERF_NUMERATOR = (-1.60960333262415e-02, -2.95459980854025e-03, -7.34990630326855e-04,
                  -5.69250639462346e-05, -2.10102402082508e-06, 2.77068142495902e-08,
                  -2.72614225801306e-10)
_ERF_DENOMINATOR = (-1.42647390514189e-02, -7.37332916720468e-03, -1.68282697438203e-03,
                    -2.13374055278905e-04, -1.45660718464996e-05)
# tanh(x) ~ x * P(x^2) / Q(x^2) on [-9, 9] (+-1 outside in float32): Eigen's
# 13/6 rational form (TF's Tanh kernel), a couple of ulp. te.tanh lowers to a
# scalar expf call per element, which halved a GELU-tanh layer's throughput.
_TANH_NUMERATOR = (4.89352455891786e-03, 6.37261928875436e-04, 1.48572235717979e-05,
                   5.12229709037114e-08, -8.60467152213735e-11, 2.00018790482477e-13,
                   -2.76076847742355e-16)
_TANH_DENOMINATOR = (4.89352518554385e-03, 2.26843463243900e-03, 1.18534705686654e-04,
                     1.19825839466702e-06)


def _polynomial(coefficients, x):
    """sum(c_i * x^i) by Horner's rule."""
    value = tirx.const(coefficients[-1], "float32")
    for c in reversed(coefficients[:-1]):
        value = value * x + tirx.const(c, "float32")
    return value


def _odd_rational(x, limit: float, numerator, denominator):
    """Vectorizable x * P(x^2) / Q(x^2) with x clamped to [-limit, limit]; NaN stays NaN
    (the clamp alone would turn it into a bound)."""
    clamped = te.max(te.min(x, tirx.const(limit, "float32")), tirx.const(-limit, "float32"))
    square = clamped * clamped
    value = clamped * _polynomial(numerator, square) / _polynomial(denominator, square)
    return tirx.Select(tirx.isnan(x), x, value)


def erf(x):
    """Vectorizable float32 erf (see _ERF_NUMERATOR)."""
    return _odd_rational(x, 4.0, _ERF_NUMERATOR, _ERF_DENOMINATOR)


def tanh(x):
    """Vectorizable float32 tanh (see _TANH_NUMERATOR)."""
    return _odd_rational(x, 9.0, _TANH_NUMERATOR, _TANH_DENOMINATOR)


def apply(name: str, x):
    if name == "none":
        return x
    if name == "relu":  # as TF's max(x, 0): NaN stays NaN (te.max would make it 0)
        zero = tirx.const(0.0, "float32")
        return tirx.Select(x < zero, zero, x)
    if name == "tanh":
        return tanh(x)
    if name == "sigmoid":
        return te.sigmoid(x)
    if name == "gelu":
        return 0.5 * x * (1.0 + erf(x * (1.0 / math.sqrt(2.0))))
    if name == "gelu_tanh":
        return 0.5 * x * (1.0 + tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x * x * x)))
    if name == "silu":
        return x * te.sigmoid(x)
    raise ValueError(f"unknown activation {name!r}")
