"""The op vocabulary the Planner writes and the Coder reads: canonical names for torch.fx nodes.

Both sides trace the reference with `torch.fx.symbolic_trace(Model(*get_init_inputs()))`; a plan's
OpNode.name is the fx node name and OpNode.target the canonical name given here, so the Coder can
find each planned op in its own trace and the Verifier can check that the plan covers the graph.
"""

from __future__ import annotations

import operator
from typing import Any

UNARY = frozenset(
    {
        "relu", "relu6", "leaky_relu", "gelu", "silu", "sigmoid", "tanh", "softplus", "mish", "hardswish",
        "hardsigmoid", "hardtanh", "elu", "selu", "celu", "clamp", "exp", "log", "log1p", "expm1", "sqrt",
        "rsqrt", "abs", "neg", "sin", "cos", "reciprocal", "square", "erf", "sign", "floor", "ceil", "round",
        "softsign", "tanhshrink", "logsigmoid", "dropout", "identity", "to", "float",
    }
)  # fmt: skip
BINARY = frozenset({"add", "sub", "mul", "div", "pow", "maximum", "minimum", "where", "fmod", "remainder"})
REDUCTION = frozenset(
    {"sum", "mean", "amax", "amin", "max", "min", "argmax", "argmin", "prod", "var", "std", "logsumexp",
     "norm", "cumsum"}
)  # fmt: skip
SOFTMAX = frozenset({"softmax", "log_softmax"})
NORM = frozenset({"layer_norm", "rms_norm", "group_norm", "instance_norm", "batch_norm", "normalize"})
GEMM = frozenset({"linear", "matmul", "mm", "bmm", "addmm", "baddbmm", "einsum", "bilinear"})
CONV = frozenset(
    {"conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d"}
)  # fmt: skip
POOL = frozenset(
    {"max_pool1d", "max_pool2d", "max_pool3d", "avg_pool1d", "avg_pool2d", "avg_pool3d",
     "adaptive_avg_pool1d", "adaptive_avg_pool2d", "adaptive_avg_pool3d", "adaptive_max_pool2d"}
)  # fmt: skip
ATTENTION = frozenset({"scaled_dot_product_attention", "multihead_attention"})
RNN = frozenset({"lstm", "gru", "rnn"})
# Layout and bookkeeping ops: they move no arithmetic (views, shape queries, copies).
LAYOUT = frozenset(
    {"view", "reshape", "flatten", "transpose", "permute", "unsqueeze", "squeeze", "expand", "contiguous",
     "getitem", "size", "getattr", "chunk", "split", "cat", "stack", "t", "unflatten", "repeat", "embedding",
     "pad", "narrow", "clone", "type_as", "expand_as", "view_as", "flip", "roll", "zeros_like", "ones_like",
     "dim", "numel", "output", "placeholder", "get_attr"}
)  # fmt: skip

KIND_BY_NAME: dict[str, str] = {}
for _kind, _names in (
    ("elementwise", UNARY | BINARY),
    ("reduction", REDUCTION),
    ("softmax", SOFTMAX),
    ("norm", NORM),
    ("gemm", GEMM),
    ("conv", CONV),
    ("pool", POOL),
    ("attention", ATTENTION),
    ("rnn", RNN),
    ("layout", LAYOUT),
):
    for _name in _names:
        KIND_BY_NAME[_name] = _kind

_OPERATORS: dict[Any, str] = {
    operator.add: "add", operator.iadd: "add", operator.sub: "sub", operator.isub: "sub",
    operator.mul: "mul", operator.imul: "mul", operator.truediv: "div", operator.itruediv: "div",
    operator.floordiv: "div", operator.pow: "pow", operator.matmul: "matmul", operator.neg: "neg",
    operator.getitem: "getitem", operator.abs: "abs", getattr: "getattr",
}  # fmt: skip

_ALIASES = {
    "clip": "clamp", "clamp_min": "clamp", "clamp_max": "clamp", "true_divide": "div", "divide": "div",
    "multiply": "mul", "subtract": "sub", "negative": "neg", "relu_": "relu", "add_": "add", "mul_": "mul",
    "linear": "linear", "conv2d": "conv2d", "swish": "silu", "hardtanh_": "hardtanh", "sigmoid_": "sigmoid",
    "tanh_": "tanh", "exp_": "exp", "div_": "div", "sub_": "sub", "clamp_": "clamp", "pow_": "pow",
}  # fmt: skip

_MODULES = {
    "Linear": "linear", "Bilinear": "bilinear", "LazyLinear": "linear",
    "Conv1d": "conv1d", "Conv2d": "conv2d", "Conv3d": "conv3d",
    "ConvTranspose1d": "conv_transpose1d", "ConvTranspose2d": "conv_transpose2d",
    "ConvTranspose3d": "conv_transpose3d",
    "LayerNorm": "layer_norm", "RMSNorm": "rms_norm", "GroupNorm": "group_norm",
    "BatchNorm1d": "batch_norm", "BatchNorm2d": "batch_norm", "BatchNorm3d": "batch_norm",
    "InstanceNorm1d": "instance_norm", "InstanceNorm2d": "instance_norm", "InstanceNorm3d": "instance_norm",
    "ReLU": "relu", "ReLU6": "relu6", "LeakyReLU": "leaky_relu", "GELU": "gelu", "SiLU": "silu",
    "Sigmoid": "sigmoid", "Tanh": "tanh", "Softplus": "softplus", "Mish": "mish", "Hardswish": "hardswish",
    "Hardsigmoid": "hardsigmoid", "Hardtanh": "hardtanh", "ELU": "elu", "SELU": "selu", "CELU": "celu",
    "Softsign": "softsign", "Tanhshrink": "tanhshrink", "LogSigmoid": "logsigmoid",
    "Softmax": "softmax", "LogSoftmax": "log_softmax", "Dropout": "dropout", "Identity": "identity",
    "MaxPool1d": "max_pool1d", "MaxPool2d": "max_pool2d", "MaxPool3d": "max_pool3d",
    "AvgPool1d": "avg_pool1d", "AvgPool2d": "avg_pool2d", "AvgPool3d": "avg_pool3d",
    "AdaptiveAvgPool1d": "adaptive_avg_pool1d", "AdaptiveAvgPool2d": "adaptive_avg_pool2d",
    "AdaptiveAvgPool3d": "adaptive_avg_pool3d", "AdaptiveMaxPool2d": "adaptive_max_pool2d",
    "MultiheadAttention": "multihead_attention", "LSTM": "lstm", "GRU": "gru", "RNN": "rnn",
    "Embedding": "embedding", "Flatten": "flatten", "Unflatten": "unflatten",
}  # fmt: skip


def canonical_name(op: str, target: Any, module_class: str = "") -> str:
    """The canonical name of an fx node given its `op`, `target` and, for call_module, the module class."""
    if op == "call_module":
        return _MODULES.get(module_class, module_class.lower() or "module")
    if op in ("placeholder", "output", "get_attr"):
        return op
    if op == "call_method":
        name = str(target)
    elif target in _OPERATORS:
        return _OPERATORS[target]
    else:
        name = getattr(target, "__name__", str(target)).rsplit(".", 1)[-1]
    name = _ALIASES.get(name, name)
    return name


def kind(name: str) -> str:
    """elementwise | reduction | softmax | norm | gemm | conv | pool | attention | rnn | layout | opaque."""
    return KIND_BY_NAME.get(name, "opaque")


def is_compute(name: str) -> bool:
    return kind(name) != "layout"
