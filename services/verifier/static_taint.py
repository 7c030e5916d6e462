"""Taint evaluation of expressions on the forward path: which values derive from the inputs, and how.

A taint is a set of (kind, source) pairs, source being a forward parameter name. Kinds:
T  tensor data derived from an input          A  aliases an input's storage (a view of it)
M  metadata of an input (shape, dtype, size)  I  identity of an input (data_ptr, id, _version, storage)
V  a host value read from input data (.item())
"""

from __future__ import annotations

import ast
from typing import TYPE_CHECKING

from stitchcuda.verifier.static_names import const_str, line
from stitchcuda.verifier.static_vocab import (
    BUILTIN_COMPUTE,
    BUILTIN_HOST,
    CONTAINER_READ,
    CONTAINER_WRITE,
    COPY_METHODS,
    EXPAND_METHODS,
    HOST_METHODS,
    ID_ATTRS,
    ID_METHODS,
    INPLACE_FILL,
    LOW_METHODS,
    META_ATTRS,
    META_METHODS,
    NEW_METHODS,
    RANDOM_METHODS,
    TENSOR_METHODS,
    TORCH_ALLOC,
    TORCH_CODEGEN,
    TORCH_NEUTRAL_PREFIXES,
    TORCH_RANDOM,
    TORCH_VIEW,
    VIEW_METHODS,
)

if TYPE_CHECKING:
    from stitchcuda.verifier.static_graph import Func, Program
    from stitchcuda.verifier.static_names import Names

Taint = frozenset[tuple[str, str]]
EMPTY: Taint = frozenset()
DATA = ("T", "A", "V")
BUILTIN_NEUTRAL = frozenset(
    {"isinstance", "issubclass", "type", "hasattr", "callable", "print", "super", "repr", "str", "format"}
)
ATEN_NAMESPACES = frozenset(
    {"aten", "prims", "quantized", "_c10d_functional", "c10d", "profiler", "_quantized"}
)


def union(*ts: Taint) -> Taint:
    out: set[tuple[str, str]] = set()
    for t in ts:
        out |= t
    return frozenset(out)


def has(t: Taint, *kinds: str) -> bool:
    return any(k in kinds for k, _ in t)


def data(t: Taint) -> Taint:
    return frozenset(p for p in t if p[0] in DATA)


def retag(t: Taint, kind: str, only: tuple[str, ...] = ("T", "A", "V", "M", "I")) -> Taint:
    return frozenset((kind, s) for k, s in t if k in only)


def no_alias(t: Taint) -> Taint:
    """The same dependence without the storage alias: the value is a fresh tensor."""
    return frozenset(("T", s) if k == "A" else (k, s) for k, s in t)


def sources(t: Taint) -> set[str]:
    return {s for _, s in t}


def _strided(node: ast.AST) -> bool:
    slices = node.elts if isinstance(node, ast.Tuple) else [node]
    for s in slices:
        if isinstance(s, ast.Slice) and s.step is not None:
            step = s.step
            if not (isinstance(step, ast.Constant) and step.value in (1, None)):
                return True
    return False


def big_int_literal(node: ast.AST) -> bool:
    """An integer literal (or a tuple/list of them) that looks like a problem size."""
    if isinstance(node, ast.Constant) and isinstance(node.value, int) and not isinstance(node.value, bool):
        return node.value >= 16
    if isinstance(node, ast.Tuple | ast.List):
        return any(big_int_literal(e) for e in node.elts)
    return False


class Evaluator:
    """Expression evaluation; Flow (static_flow.py) adds statements, state and the rules."""

    program: Program
    names: Names
    fn: Func
    self_cls: str | None
    state: dict[str, Taint]
    triton: set[str]
    path: str

    # Implemented by Flow.
    def hit(self, rule: str, detail: str, node: ast.AST | None) -> None:
        raise NotImplementedError

    def lookup(self, name: str) -> Taint:
        raise NotImplementedError

    def bind(self, target: ast.expr, t: Taint, value: ast.expr | None) -> None:
        raise NotImplementedError

    def test(self, node: ast.expr) -> None:
        raise NotImplementedError

    def is_self(self, node: ast.AST) -> bool:
        raise NotImplementedError

    def is_state(self, node: ast.AST) -> bool:
        raise NotImplementedError

    def state_type(self, node: ast.AST) -> str | None:
        raise NotImplementedError

    def mentions_counter(self, node: ast.AST) -> bool:
        raise NotImplementedError

    def custom(self, node: ast.Call, allt: Taint, what: str) -> Taint:
        raise NotImplementedError

    def local_call(self, node: ast.Call, targets: list[Func], args: list[Taint], allt: Taint) -> Taint:
        raise NotImplementedError

    def store_state(self, node: ast.AST, what: str, t: Taint) -> None:
        raise NotImplementedError

    def write_into(self, target: ast.AST, t: Taint) -> None:
        raise NotImplementedError

    def ev(self, node: ast.AST | None) -> Taint:
        if node is None or isinstance(node, ast.Constant | ast.Lambda):
            return EMPTY
        if isinstance(node, ast.Name):
            return self.lookup(node.id)
        if isinstance(node, ast.Attribute):
            return self.ev_attribute(node)
        if isinstance(node, ast.Subscript):
            return self.ev_subscript(node)
        if isinstance(node, ast.Call):
            return self.ev_call(node)
        if isinstance(node, ast.BinOp):
            return self.binop(node, self.ev(node.left), node.op, self.ev(node.right))
        if isinstance(node, ast.UnaryOp):
            t = self.ev(node.operand)
            if has(t, "T", "A") and not isinstance(node.op, ast.Not):
                self.hit("D11.torch-op", f"unary {type(node.op).__name__} on input-derived tensors", node)
                return no_alias(data(t))
            return retag(t, "M") if isinstance(node.op, ast.Not) else t
        if isinstance(node, ast.Compare):
            return self.ev_compare(node)
        if isinstance(node, ast.BoolOp):
            return union(*(self.ev(v) for v in node.values))
        if isinstance(node, ast.IfExp):
            self.test(node.test)
            return union(self.ev(node.body), self.ev(node.orelse))
        if isinstance(node, ast.Tuple | ast.List | ast.Set):
            return union(*(self.ev(e) for e in node.elts))
        if isinstance(node, ast.Dict):
            for k in node.keys:
                if k is not None and has(self.ev(k), "I"):
                    self.hit(
                        "D11.identity-key", "an input's identity (data_ptr/id/_version) is a dict key", k
                    )
            return union(*(self.ev(v) for v in node.values))
        if isinstance(node, ast.ListComp | ast.SetComp | ast.GeneratorExp | ast.DictComp):
            for gen in node.generators:
                self.bind(gen.target, self.ev(gen.iter), None)
                for cond in gen.ifs:
                    self.ev(cond)
            if isinstance(node, ast.DictComp):
                return union(self.ev(node.key), self.ev(node.value))
            return self.ev(node.elt)
        if isinstance(node, ast.NamedExpr):
            t = self.ev(node.value)
            self.bind(node.target, t, None)
            return t
        if isinstance(node, ast.Starred | ast.Await | ast.FormattedValue):
            return self.ev(node.value)
        if isinstance(node, ast.JoinedStr):
            return retag(union(*(self.ev(v) for v in node.values)), "M")
        return EMPTY

    def ev_attribute(self, node: ast.Attribute) -> Taint:
        if self.is_self(node.value):
            return self.state.get(node.attr, EMPTY)
        if self.names.qualname(node) is not None:
            return EMPTY
        base = self.ev(node.value)
        if node.attr in META_ATTRS:
            return retag(base, "M")
        if node.attr in ID_ATTRS:
            return retag(base, "I", ("T", "A", "I"))
        if node.attr in {"T", "mT", "H", "mH", "real", "imag", "data"}:
            return base
        return no_alias(base)

    def ev_subscript(self, node: ast.Subscript) -> Taint:
        base = self.ev(node.value)
        idx = self.ev(node.slice)
        if has(idx, "I"):
            self.hit(
                "D11.identity-key",
                "an input's identity (data_ptr/id/_version) is used as an index or key",
                node,
            )
        if self.mentions_counter(node.slice):
            self.hit("D11.call-counter", "a call counter bumped in forward selects a stored result", node)
        if has(base, "T", "A") and _strided(node.slice):
            self.hit(
                "D11.subsample", f"strided slice of an input-derived tensor: {ast.unparse(node)[:80]}", node
            )
        return base

    def binop(self, node: ast.AST, left: Taint, op: ast.operator, right: Taint) -> Taint:
        both = union(left, right)
        if has(both, "T", "A"):
            what = "@ (matmul)" if isinstance(op, ast.MatMult) else f"arithmetic ({type(op).__name__})"
            self.hit("D11.torch-op", f"{what} on input-derived tensors", node)
            return no_alias(data(both))
        if has(both, "V"):
            return retag(both, "V")
        if has(both, "I"):
            return retag(both, "M") if isinstance(op, ast.Mod | ast.BitAnd) else retag(both, "I")
        return both

    def ev_compare(self, node: ast.Compare) -> Taint:
        parts = [node.left, *node.comparators]
        taints = [self.ev(p) for p in parts]
        allt = union(*taints)
        identity = all(isinstance(op, ast.Is | ast.IsNot) for op in node.ops)
        membership = all(isinstance(op, ast.In | ast.NotIn | ast.Is | ast.IsNot) for op in node.ops)
        if has(allt, "I") and not identity:
            self.hit(
                "D11.identity-key", "an input's identity (data_ptr/id/_version/storage) is compared", node
            )
        if self.mentions_counter(node):
            self.hit(
                "D11.call-counter", "a call counter bumped in forward is compared (phase detection)", node
            )
        if has(allt, "T", "A") and not membership:
            self.hit("D11.torch-op", "elementwise comparison of input-derived tensors", node)
            return no_alias(data(allt))
        for p, t in zip(parts, taints, strict=True):
            if has(t, "M"):
                others = [q for q in parts if q is not p]
                if any(big_int_literal(q) for q in others):
                    self.hit(
                        "D11.shape-gate",
                        f"input shape compared with literal sizes: {ast.unparse(node)[:80]}",
                        node,
                    )
                    break
        return retag(allt, "M")

    # -- calls --------------------------------------------------------------------------------------
    def ev_call(self, node: ast.Call) -> Taint:
        args = [self.ev(a) for a in node.args]
        kwargs = [self.ev(k.value) for k in node.keywords]
        allt = union(*args, *kwargs)
        func = node.func
        if (
            isinstance(func, ast.Subscript)
            and isinstance(func.value, ast.Name)
            and func.value.id in self.triton
        ):
            return self.custom(node, allt, f"Triton kernel {func.value.id}")
        targets = self.program.referenced(func, self.self_cls, self.fn.self_name)
        if targets:
            return self.local_call(node, targets, args, allt)
        if isinstance(func, ast.Attribute) and self.is_self(func.value):
            kind = self.program.attr_type(self.self_cls, func.attr) if self.self_cls else None
            if kind and kind.startswith("torch.nn.") and kind.rsplit(".", 1)[-1][:1].isupper():
                return self.layer_call(node, kind, allt)
            value = self.program.attr_value(self.self_cls, func.attr) if self.self_cls else None
            if value is not None and (q := self.names.qualname(value)) is not None:
                return self.qualified_call(node, q, args, allt)
        if isinstance(func, ast.Call) and self.names.qualname(func.func) == "builtins.getattr" and func.args:
            name = const_str(func.args[1]) if len(func.args) > 1 else None
            obj = self.ev(func.args[0])
            if name is not None and self.names.qualname(func.args[0]) is None:
                return self.tensor_method(node, name, obj, allt, func.args[0])
            if name is None and has(obj, "T", "A"):
                self.hit("D11.dynamic-code", "computed getattr on an input-derived tensor", node)
        if isinstance(func, ast.Call):
            inner = self.names.qualname(func.func)
            if inner and inner.startswith("torch.nn.") and inner.rsplit(".", 1)[-1][:1].isupper():
                return self.layer_call(node, inner, allt)
            if inner in TORCH_CODEGEN:
                self.hit("D11.torch-op", f"{inner}(...) compiles PyTorch code on the forward path", node)
            return union(self.ev(func), allt)
        q = self.names.qualname(func) or self.self_qualname(func)
        if q is not None:
            return self.qualified_call(node, q, args, allt)
        if isinstance(func, ast.Attribute):
            return self.method_call(node, func, allt)
        return no_alias(union(self.ev(func), allt))

    def qualified_call(self, node: ast.Call, q: str, args: list[Taint], allt: Taint) -> Taint:
        if self.names.is_ext(q):
            return self.custom(node, allt, q)
        if q.startswith("torch.ops."):
            ns = q.split(".")[2] if q.count(".") >= 2 else ""
            if ns and ns not in ATEN_NAMESPACES:
                return self.custom(node, allt, q)
        if q.startswith("builtins."):
            return self.builtin_call(node, q[9:], args, allt)
        if q.startswith("torch.Tensor.") and args:
            return self.tensor_method(node, q.rsplit(".", 1)[-1], args[0], union(*args[1:]), None)
        if q.startswith("torch."):
            last = q.rsplit(".", 1)[-1]
            top = q == "torch." + last or q.startswith(("torch.functional.", "torch.special."))
            if q in TORCH_CODEGEN:
                self.hit("D11.torch-op", f"{q}(...) compiles PyTorch code on the forward path", node)
                return data(allt)
            if top and last in TORCH_ALLOC:
                return EMPTY
            if top and last in TORCH_VIEW:
                first = args[0] if args else EMPTY
                if last in {"as_strided", "broadcast_to"} and has(first, "T", "A"):
                    self.hit("D11.expand-output", f"{q} of an input-derived tensor (stride-0 output?)", node)
                return first if last not in {"cat", "concat", "stack", "clone"} else no_alias(allt)
            if top and last in TORCH_RANDOM:
                # A random reference's numbers drawn again (the Verifier seeds every call alike); a draw
                # the reference does not make fails the comparison.
                self.hit("D11.random-draw", f"{q}(...) draws from torch's random generator", node)
                return EMPTY
            if q.startswith(TORCH_NEUTRAL_PREFIXES) or (last[:1].isupper() and q.startswith("torch.nn.")):
                return EMPTY
            return self.compute(node, q, allt)
        if q.startswith(("numpy.", "operator.", "scipy.")) and has(allt, "T", "A"):
            self.hit("D11.torch-op", f"{q} on input-derived tensors", node)
            return no_alias(data(allt))
        return no_alias(allt)

    def builtin_call(self, node: ast.Call, name: str, args: list[Taint], allt: Taint) -> Taint:
        if name == "len":
            return retag(allt, "M")
        if name in {"id", "hash"}:
            return retag(allt, "I", ("T", "A", "I"))
        if name in BUILTIN_HOST:
            if has(allt, "T", "A"):
                self.hit("D11.host-read", f"{name}() reads input-derived data on the host", node)
                return retag(allt, "V", ("T", "A", "V"))
            return allt
        if name in BUILTIN_COMPUTE and has(allt, "T", "A"):
            self.hit("D11.torch-op", f"builtin {name}() on input-derived tensors", node)
            return no_alias(data(allt))
        if name == "setattr" and len(node.args) >= 3 and self.is_self(node.args[0]):
            self.store_state(node, "setattr(self, ...)", args[2])
            return EMPTY
        if name == "getattr" and node.args and self.is_self(node.args[0]):
            key = const_str(node.args[1]) if len(node.args) > 1 else None
            return self.state.get(key, EMPTY) if key else union(*self.state.values())
        if name in BUILTIN_NEUTRAL:
            return EMPTY
        return allt

    def method_call(self, node: ast.Call, func: ast.Attribute, allt: Taint) -> Taint:
        m = func.attr
        recv = func.value
        if self.is_self(recv) and m in {"register_buffer", "register_parameter", "__setattr__", "add_module"}:
            self.store_state(node, f"self.{m}(...)", allt)
            return EMPTY
        if self.is_state(recv):
            if m in CONTAINER_WRITE:
                self.store_state(node, f"{ast.unparse(recv)[:40]}.{m}(...)", allt)
                return EMPTY
            if m in CONTAINER_READ:
                if has(allt, "I"):
                    self.hit(
                        "D11.identity-key", f"an input's identity is a key of {ast.unparse(recv)[:40]}", node
                    )
                return self.ev(recv)
            kind = self.state_type(recv)
            if kind and kind.startswith("torch.nn.") and m in {"forward", "__call__"}:
                return self.layer_call(node, kind, allt)
        if m == "replay":
            return self.custom(node, union(allt, *self.state.values()), "CUDA graph replay")
        return self.tensor_method(node, m, self.ev(recv), allt, recv)

    def tensor_method(self, node: ast.Call, m: str, r: Taint, allt: Taint, recv: ast.AST | None) -> Taint:
        both = union(r, allt)
        if m in META_METHODS:
            return retag(r, "M")
        if m in ID_METHODS:
            return retag(r, "I", ("T", "A", "I"))
        if m in HOST_METHODS:
            if has(r, "T", "A"):
                self.hit("D11.host-read", f".{m}() reads input-derived data on the host", node)
            return retag(r, "V", ("T", "A", "V"))
        if m in NEW_METHODS:
            return EMPTY
        if m in RANDOM_METHODS:
            self.hit("D11.random-draw", f".{m}() fills a tensor from torch's random generator", node)
            return EMPTY
        if m in LOW_METHODS:
            return no_alias(r)
        if m in VIEW_METHODS:
            if m in EXPAND_METHODS and has(r, "T", "A"):
                self.hit("D11.expand-output", f".{m}() of an input-derived tensor (stride-0 output?)", node)
            return no_alias(r) if m in COPY_METHODS and m != "to" else union(r, retag(allt, "M"))
        if m in INPLACE_FILL:
            if has(r, "A"):
                self.hit("D11.input-mutation", f".{m}() writes into an input tensor", node)
            if m == "copy_" and recv is not None:
                self.write_into(recv, no_alias(data(allt)))
            return r
        if m in TENSOR_METHODS:
            if m.endswith("_") and has(r, "A"):
                self.hit("D11.input-mutation", f".{m}() modifies an input tensor in place", node)
            if has(both, "T", "A", "V"):
                self.hit("D11.torch-op", f"tensor method .{m}() on input-derived tensors", node)
            elif recv is not None and self.is_state(recv):
                self.hit("D11.param-op", f".{m}() on parameters (weight preparation)", node)
            return no_alias(data(both))
        return no_alias(both)

    def compute(self, node: ast.Call, q: str, allt: Taint) -> Taint:
        if has(allt, "T", "A", "V"):
            self.hit("D11.torch-op", f"{q} on input-derived tensors", node)
        else:
            self.hit("D11.param-op", f"{q} on parameters or constants only", node)
        return no_alias(data(allt))

    def layer_call(self, node: ast.Call, kind: str, allt: Taint) -> Taint:
        if kind.rsplit(".", 1)[-1] in {"Identity", "Flatten", "Unflatten"}:
            return allt
        if has(allt, "T", "A", "V"):
            self.hit("D11.torch-op", f"nn layer {kind} called on input-derived tensors", node)
        else:
            self.hit("D11.param-op", f"nn layer {kind} called on constants", node)
        return no_alias(data(allt))

    def self_qualname(self, node: ast.AST) -> str | None:
        """self.X.Y... where __init__ bound self.X to a module or function (self.ext = ext)."""
        parts: list[str] = []
        while isinstance(node, ast.Attribute) and not self.is_self(node.value):
            parts.insert(0, node.attr)
            node = node.value
        if not (isinstance(node, ast.Attribute) and self.is_self(node.value) and self.self_cls):
            return None
        value = self.program.attr_value(self.self_cls, node.attr)
        base = self.names.qualname(value) if value is not None else None
        return ".".join([base, *parts]) if base is not None else None

    def where(self, node: ast.AST | None) -> str:
        return f"{self.path}:{line(node) if node is not None else 0}"
