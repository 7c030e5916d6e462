"""The captured graph as the Planner reasons about it: canonical op names, kinds, data producers and users."""

from __future__ import annotations

import builtins
import operator
from dataclasses import dataclass, field
from typing import Any

from stitchcuda.planner.analysis import Analysis, NodeInfo, TensorInfo
from stitchcuda.shared import ops

# Ops the shared vocabulary does not name yet, classified here so they are not taken for opaque
# compute. torch.export graphs bring ATen names; fx graphs bring comparisons, masks and creation ops.
EXTRA_KINDS: dict[str, str] = {
    **dict.fromkeys(
        ("masked_fill", "addcmul", "addcdiv", "lerp", "rsub", "eq", "ne", "lt", "gt", "le", "ge", "isnan",
         "nan_to_num", "log2", "exp2", "log10", "tan", "atan", "asin", "acos", "sinh", "cosh", "erfc",
         "trunc",
         "frac", "threshold", "hardshrink", "softshrink", "logical_and", "logical_or", "logical_not",
         "bitwise_and", "bitwise_or", "tril", "triu", "glu", "xlogy", "sigmoid_", "leaky_relu_", "square_",
         "_to_copy", "type", "half", "bfloat16", "double", "int", "long", "bool", "true_divide",
         "floor_divide"),
        "elementwise",
    ),
    **dict.fromkeys(("all", "any", "count_nonzero", "aminmax", "nansum", "nanmean"), "reduction"),
    **dict.fromkeys(("softmin",), "softmax"),
    **dict.fromkeys(("mv", "dot", "outer", "addmv", "addbmm", "tensordot", "inner", "kron"), "gemm"),
    **dict.fromkeys(
        ("select", "slice", "alias", "detach", "zeros", "ones", "full", "empty", "arange", "lift_fresh_copy",
         "new_zeros", "new_ones", "new_empty", "new_full", "scalar_tensor", "empty_like", "full_like", "rand",
         "randn", "rand_like", "randn_like", "split_with_sizes", "unbind", "as_strided", "movedim",
         "swapaxes",
         "index_select", "gather", "masked_select", "tile", "broadcast_to", "item", "tolist"),
        "layout",
    ),
}  # fmt: skip

# ATen names (torch.export captures) that have a name in the shared vocabulary.
ATEN_ALIASES = {
    "_softmax": "softmax", "_log_softmax": "log_softmax", "native_layer_norm": "layer_norm",
    "_native_batch_norm_legit_no_training": "batch_norm", "native_batch_norm": "batch_norm",
    "max_pool2d_with_indices": "max_pool2d", "max_pool3d_with_indices": "max_pool3d", "_unsafe_view": "view",
    "_scaled_dot_product_flash_attention": "scaled_dot_product_attention",
    "_scaled_dot_product_efficient_attention": "scaled_dot_product_attention",
    "_scaled_dot_product_flash_attention_for_cpu": "scaled_dot_product_attention", "_to_copy": "to",
}  # fmt: skip

# Kinds whose nodes do arithmetic; every such node must be in exactly one subtask.
COMPUTE_KINDS = frozenset(
    {"elementwise", "reduction", "softmax", "norm", "gemm", "conv", "pool", "attention", "rnn", "opaque"}
)
# Layout ops that materialise a new tensor (a copy), unlike views.
MATERIALIZING = frozenset(
    {"cat", "stack", "repeat", "contiguous", "clone", "pad", "embedding", "flip", "roll", "index_select",
     "gather", "tile", "masked_select"}
)  # fmt: skip
OUTPUT = "<output>"


class _Named:
    """A stand-in target carrying only a name (what canonical_name reads from functions)."""

    def __init__(self, name: str) -> None:
        self.__name__ = name


def _target_object(info: NodeInfo) -> Any:
    """What canonical_name expects as `target`: the real object for operators, else a named stand-in."""
    ref = info.target
    if info.op != "call_function":
        return ref.name
    if ref.module in ("_operator", "operator") and hasattr(operator, ref.name):
        return getattr(operator, ref.name)
    if ref.module == "builtins" and ref.name == "getattr":
        return builtins.getattr
    return _Named(ref.name)


def canonical(info: NodeInfo) -> str:
    module_class = info.module.class_ if info.module else ""
    if info.op == "call_function" and info.target.module == "aten":
        name = ATEN_ALIASES.get(info.target.name, info.target.name)
        if name == "convolution":
            rank = max((len(t.shape) for t in info.outputs), default=4)
            name = f"conv{max(rank - 2, 1)}d"
        return ops.canonical_name("call_function", _Named(name))
    return ops.canonical_name(info.op, _target_object(info), module_class)


def classify(info: NodeInfo, name: str) -> str:
    if info.op == "placeholder":
        return "input"
    if info.op == "output":
        return "output"
    if info.op == "get_attr":
        return "param"
    base = ops.kind(name)
    if base == "opaque":
        base = EXTRA_KINDS.get(name, EXTRA_KINDS.get(name.rstrip("_"), "opaque"))
    if not any(t.is_tensor for t in info.outputs):
        return "host"  # shape arithmetic and Python scalars: no device work
    return base


@dataclass
class Node:
    info: NodeInfo
    target: str
    kind: str
    index: int
    flops: float = 0.0
    bytes: float = 0.0

    @property
    def name(self) -> str:
        return self.info.name

    @property
    def compute(self) -> bool:
        return self.kind in COMPUTE_KINDS

    @property
    def outputs(self) -> list[TensorInfo]:
        return [t for t in self.info.outputs if t.is_tensor]


@dataclass
class Graph:
    """Nodes in topological order with the data edges that matter for fusion."""

    nodes: list[Node]
    by_name: dict[str, Node] = field(default_factory=dict)

    @classmethod
    def from_analysis(cls, analysis: Analysis) -> Graph:
        nodes = []
        for i, info in enumerate(analysis.nodes):
            name = canonical(info)
            nodes.append(Node(info=info, target=name, kind=classify(info, name), index=i))
        graph = cls(nodes=nodes)
        graph.by_name = {n.name: n for n in nodes}
        return graph

    def node(self, name: str) -> Node:
        return self.by_name[name]

    def compute_nodes(self) -> list[Node]:
        return [n for n in self.nodes if n.compute]

    def inputs_of(self, node: Node) -> list[Node]:
        return [self.by_name[i] for i in node.info.inputs if i in self.by_name]

    def users_of(self, node: Node) -> list[Node]:
        return [self.by_name[u] for u in node.info.users if u in self.by_name]

    def producers(self, node: Node) -> list[Node]:
        """The compute nodes whose data `node` reads, looking through layout ops (not shape queries)."""
        found: list[Node] = []
        stack = list(reversed(self.inputs_of(node)))
        seen: set[str] = set()
        while stack:
            p = stack.pop()
            if p.name in seen:
                continue
            seen.add(p.name)
            if p.compute:
                found.append(p)
            elif p.kind == "layout":
                stack.extend(reversed(self.inputs_of(p)))
        return found

    def consumers(self, node: Node) -> set[str]:
        """Names of the compute nodes that read `node`'s data (OUTPUT when the program returns it)."""
        found: set[str] = set()
        stack = self.users_of(node)
        seen: set[str] = set()
        while stack:
            u = stack.pop()
            if u.name in seen:
                continue
            seen.add(u.name)
            if u.compute:
                found.add(u.name)
            elif u.kind == "output":
                found.add(OUTPUT)
            elif u.kind == "layout":
                stack.extend(self.users_of(u))
        return found

    def tensor_inputs(self, node: Node) -> list[TensorInfo]:
        """The tensors a node reads, one per producing node (a getitem reads only its element)."""
        specs: list[TensorInfo] = []
        for p in self.inputs_of(node):
            outs = p.outputs
            if node.target == "getitem" and len(outs) > 1:
                continue
            specs.extend(outs)
        return specs
