"""Elementwise ops: their operands and scalar parameters, and the C++ expression each one lowers to.

The expressions are shared by the CPU and CUDA back ends; the helper functions they call (st_*) are
defined in the generated runtime header (runtime.py), written to match PyTorch's float32 semantics
(NaN propagation of relu/clamp/max, exact special cases of pow, floor division, ...).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass(frozen=True)
class EwSpec:
    # Operands that may be tensors (the rest of the arguments are scalar parameters).
    operands: int
    # Scalar parameters after the operands: (keyword name, default).
    params: tuple[tuple[str, float | int | bool | str | None], ...] = ()
    # Builds the expression from operand expressions followed by parameter expressions.
    emit: Callable[[list[str]], str] = field(default=lambda a: a[0])
    # "float" or "bool" result.
    result: str = "float"


def _f(name: str) -> Callable[[list[str]], str]:
    return lambda a: f"{name}({', '.join(a)})"


EW: dict[str, EwSpec] = {
    "identity": EwSpec(1, emit=lambda a: a[0]),
    "relu": EwSpec(1, emit=_f("st_relu")),
    "relu6": EwSpec(1, emit=lambda a: f"st_clamp({a[0]}, 0.f, 6.f)"),
    "leaky_relu": EwSpec(1, (("negative_slope", 0.01),), _f("st_leaky_relu")),
    "gelu": EwSpec(1, emit=_f("st_gelu")),
    "gelu_tanh": EwSpec(1, emit=_f("st_gelu_tanh")),
    "silu": EwSpec(1, emit=_f("st_silu")),
    "sigmoid": EwSpec(1, emit=_f("st_sigmoid")),
    "tanh": EwSpec(1, emit=_f("st_tanhf")),
    "softplus": EwSpec(1, (("beta", 1.0), ("threshold", 20.0)), _f("st_softplus")),
    "mish": EwSpec(1, emit=_f("st_mish")),
    "hardswish": EwSpec(1, emit=_f("st_hardswish")),
    "hardsigmoid": EwSpec(1, emit=_f("st_hardsigmoid")),
    "hardtanh": EwSpec(1, (("min_val", -1.0), ("max_val", 1.0)), _f("st_clamp")),
    "elu": EwSpec(1, (("alpha", 1.0),), _f("st_elu")),
    "selu": EwSpec(1, emit=_f("st_selu")),
    "celu": EwSpec(1, (("alpha", 1.0),), _f("st_celu")),
    "clamp": EwSpec(3, emit=_f("st_clamp")),
    "clamp_min": EwSpec(2, emit=_f("st_clamp_min")),
    "clamp_max": EwSpec(2, emit=_f("st_clamp_max")),
    "exp": EwSpec(1, emit=_f("st_expf")),
    "exp2": EwSpec(1, emit=_f("exp2f")),
    "log": EwSpec(1, emit=_f("logf")),
    "log2": EwSpec(1, emit=_f("log2f")),
    "log10": EwSpec(1, emit=_f("log10f")),
    "log1p": EwSpec(1, emit=_f("log1pf")),
    "expm1": EwSpec(1, emit=_f("expm1f")),
    "sqrt": EwSpec(1, emit=_f("sqrtf")),
    "rsqrt": EwSpec(1, emit=lambda a: f"(1.f / sqrtf({a[0]}))"),
    "abs": EwSpec(1, emit=_f("fabsf")),
    "neg": EwSpec(1, emit=lambda a: f"(-{a[0]})"),
    "sin": EwSpec(1, emit=_f("sinf")),
    "cos": EwSpec(1, emit=_f("cosf")),
    "tan": EwSpec(1, emit=_f("tanf")),
    "sinh": EwSpec(1, emit=_f("sinhf")),
    "cosh": EwSpec(1, emit=_f("coshf")),
    "asin": EwSpec(1, emit=_f("asinf")),
    "acos": EwSpec(1, emit=_f("acosf")),
    "atan": EwSpec(1, emit=_f("atanf")),
    "reciprocal": EwSpec(1, emit=lambda a: f"(1.f / {a[0]})"),
    "square": EwSpec(1, emit=lambda a: f"({a[0]} * {a[0]})"),
    "erf": EwSpec(1, emit=_f("erff")),
    "erfc": EwSpec(1, emit=_f("erfcf")),
    "sign": EwSpec(1, emit=_f("st_sign")),
    "floor": EwSpec(1, emit=_f("floorf")),
    "ceil": EwSpec(1, emit=_f("ceilf")),
    "round": EwSpec(1, emit=_f("nearbyintf")),
    "trunc": EwSpec(1, emit=_f("truncf")),
    "frac": EwSpec(1, emit=lambda a: f"({a[0]} - truncf({a[0]}))"),
    "softsign": EwSpec(1, emit=lambda a: f"({a[0]} / (1.f + fabsf({a[0]})))"),
    "tanhshrink": EwSpec(1, emit=lambda a: f"({a[0]} - st_tanhf({a[0]}))"),
    "logsigmoid": EwSpec(1, emit=_f("st_logsigmoid")),
    "add": EwSpec(2, emit=lambda a: f"({a[0]} + {a[1]})"),
    "sub": EwSpec(2, emit=lambda a: f"({a[0]} - {a[1]})"),
    "mul": EwSpec(2, emit=lambda a: f"({a[0]} * {a[1]})"),
    "div": EwSpec(2, emit=lambda a: f"({a[0]} / {a[1]})"),
    "div_trunc": EwSpec(2, emit=lambda a: f"truncf({a[0]} / {a[1]})"),
    "div_floor": EwSpec(2, emit=_f("st_div_floor")),
    "pow": EwSpec(2, emit=_f("powf")),
    "maximum": EwSpec(2, emit=_f("st_maximum")),
    "minimum": EwSpec(2, emit=_f("st_minimum")),
    "fmod": EwSpec(2, emit=_f("fmodf")),
    "remainder": EwSpec(2, emit=_f("st_remainder")),
    "atan2": EwSpec(2, emit=_f("atan2f")),
    "where": EwSpec(3, emit=lambda a: f"({a[0]} ? {a[1]} : {a[2]})"),
    "gt": EwSpec(2, emit=lambda a: f"({a[0]} > {a[1]})", result="bool"),
    "lt": EwSpec(2, emit=lambda a: f"({a[0]} < {a[1]})", result="bool"),
    "ge": EwSpec(2, emit=lambda a: f"({a[0]} >= {a[1]})", result="bool"),
    "le": EwSpec(2, emit=lambda a: f"({a[0]} <= {a[1]})", result="bool"),
    "eq": EwSpec(2, emit=lambda a: f"({a[0]} == {a[1]})", result="bool"),
    "ne": EwSpec(2, emit=lambda a: f"({a[0]} != {a[1]})", result="bool"),
    "logical_and": EwSpec(2, emit=lambda a: f"(({a[0]}) && ({a[1]}))", result="bool"),
    "logical_or": EwSpec(2, emit=lambda a: f"(({a[0]}) || ({a[1]}))", result="bool"),
    "logical_not": EwSpec(1, emit=lambda a: f"(!({a[0]}))", result="bool"),
    "isinf": EwSpec(1, emit=lambda a: f"(fabsf({a[0]}) == INFINITY)", result="bool"),
    "isnan": EwSpec(1, emit=lambda a: f"({a[0]} != {a[0]})", result="bool"),
}

# fx / torch names that map onto the table above.
ALIASES = {
    "swish": "silu",
    "clip": "clamp",
    "true_divide": "div",
    "truediv": "div",
    "divide": "div",
    "multiply": "mul",
    "subtract": "sub",
    "negative": "neg",
    "max_elementwise": "maximum",
    "min_elementwise": "minimum",
    "greater": "gt",
    "less": "lt",
    "greater_equal": "ge",
    "less_equal": "le",
    "not_equal": "ne",
    "absolute": "abs",
    "arctan": "atan",
    "float_power": "pow",
    # `~mask`: every tensor the synthesizer lowers is float or bool, and torch refuses `~` on floats.
    "invert": "logical_not",
    "bitwise_not": "logical_not",
}


def float_literal(value: float) -> str:
    """A float32 C++ literal that round-trips the Python value (after rounding to float32)."""
    if math.isnan(value):
        return "NAN"
    if math.isinf(value):
        return "INFINITY" if value > 0 else "(-INFINITY)"
    text = repr(float(value))
    if "e" not in text and "." not in text:
        text += ".0"
    return f"{text}f"


def pow_const(base: str, exponent: float) -> str:
    """PyTorch's exact fast paths for a constant exponent, then powf."""
    if exponent == 2:
        return f"({base} * {base})"
    if exponent == 3:
        return f"({base} * {base} * {base})"
    if exponent == 0.5:
        return f"sqrtf({base})"
    if exponent == -0.5:
        return f"(1.f / sqrtf({base}))"
    if exponent == -1:
        return f"(1.f / {base})"
    if exponent == -2:
        return f"(1.f / ({base} * {base}))"
    if exponent == 1:
        return base
    if exponent == 0:
        return "1.f"
    return f"powf({base}, {float_literal(exponent)})"
