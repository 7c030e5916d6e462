"""A torch.fx tracer specialised to the reference's own input shapes, for forwards that read them.

torch.fx's symbolic trace keeps every shape symbolic, so a forward that slices a buffer with `x.size(1)`,
loops `for t in range(seq_len)` or branches on `x.device` cannot be traced. This tracer runs every traced
operation on fake tensors (no memory, no FLOPs) made from the reference's inputs, and answers shape,
dtype and device queries with those concrete values: the graph it records is only valid for those
shapes, so the trace says it is specialised and the program checks its inputs against them. A branch
on tensor values is still refused: a fake tensor has none.

Standard library and torch only: the tracing process loads it next to trace_worker.py.
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.fx
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.node import Node, map_aggregate

# Key of a node's meta holding the value the tracer computed for it.
VALUE = "stitch_value"
# Constructors of tensors in the forward: constants (a mask), and random draws (a random initial state),
# which the program makes in turn from torch's generator.
CONSTRUCTORS = ("ones", "zeros", "full", "arange", "eye", "randn", "rand", "tensor")
PYTHON_DTYPES = {bool: torch.bool, int: torch.int64, float: torch.float64, complex: torch.complex128}


# torch.nn containers traced through rather than kept as leaf calls: their forwards are made of modules and
# functions the Coder lowers (MultiheadAttention, Linear, LayerNorm, activations, dropout), and their
# fast-path checks read shapes and flags, which the specialised trace answers.
TRACED_THROUGH = frozenset(
    {
        "TransformerEncoderLayer",
        "TransformerDecoderLayer",
        "TransformerEncoder",
        "TransformerDecoder",
        "Transformer",
    }
)


# torch.fx's own leaf rule, from one tracer kept for it (is_leaf is asked for every module call traced).
_FX_LEAF = torch.fx.Tracer().is_leaf_module


def is_leaf(m: torch.nn.Module, path: str) -> bool:
    """torch.fx's leaf rule (torch.nn modules are leaves), less the containers traced through."""
    if type(m).__name__ in TRACED_THROUGH and type(m).__module__.startswith("torch.nn"):
        return False
    return bool(_FX_LEAF(m, path))


class DataDependent(torch.fx.proxy.TraceError):
    """The forward needs the values of a tensor (not only its shape) while it is traced."""


class Unknown:
    """The value of a node the fake tensors could not compute (the reason is kept for the error)."""

    def __init__(self, reason: str) -> None:
        self.reason = reason


class ShapeProxy(torch.fx.Proxy):
    """A proxy whose shape, dtype and device are known: queries of them return Python values."""

    tracer: ShapeTracer

    def _tensor(self) -> torch.Tensor:
        value = self.tracer.value_of(self)
        if not isinstance(value, torch.Tensor):
            raise torch.fx.proxy.TraceError(f"{self.node.name} is not a tensor: {type(value).__name__}")
        return value

    @property
    def shape(self) -> torch.Size:
        return self._tensor().shape

    def size(self, dim: int | None = None) -> Any:
        return self._tensor().size() if dim is None else self._tensor().size(dim)

    def dim(self) -> int:
        return self._tensor().dim()

    @property
    def ndim(self) -> int:
        return self._tensor().dim()

    def numel(self) -> int:
        return self._tensor().numel()

    @property
    def dtype(self) -> torch.dtype:
        return self._tensor().dtype

    @property
    def device(self) -> torch.device:
        # The device the reference runs on; the program checks its tensors' devices itself.
        return self.tracer.device

    @property
    def is_cuda(self) -> bool:
        return self.tracer.device.type == "cuda"

    # Flags torch.nn's fast-path checks read (TransformerEncoderLayer): answered, not recorded.
    @property
    def is_nested(self) -> bool:
        return self._tensor().is_nested

    @property
    def requires_grad(self) -> bool:
        return self._tensor().requires_grad

    @property
    def is_sparse(self) -> bool:
        return self._tensor().is_sparse

    @property
    def layout(self) -> torch.layout:
        return self._tensor().layout

    def __len__(self) -> int:
        value = self.tracer.value_of(self)
        return int(value.shape[0]) if isinstance(value, torch.Tensor) else len(value)


class ShapeTracer(torch.fx.Tracer):
    """Records the forward like torch.fx, computing each node's value on fake tensors as it goes."""

    # Buffers (a causal mask, ...) become graph attributes rather than constants baked into the graph.
    proxy_buffer_attributes = True

    def __init__(self, inputs: list[Any], fake_mode: FakeTensorMode) -> None:
        super().__init__()
        self.inputs = list(inputs)
        self.fake_mode = fake_mode
        self.device = next((x.device for x in inputs if isinstance(x, torch.Tensor)), torch.device("cpu"))
        self._placeholders = 0
        # While a node's value is computed, module calls and attribute reads are the real ones.
        self._evaluating = False
        self._forward: Callable[..., Any] | None = None

    # ---- values --------------------------------------------------------------------------------
    def value_of(self, proxy: torch.fx.Proxy) -> Any:
        value = proxy.node.meta.get(VALUE)
        if isinstance(value, Unknown):
            raise torch.fx.proxy.TraceError(
                f"cannot compute {proxy.node.name} on fake tensors: {value.reason}"
            )
        return value

    def _concrete(self, a: Any) -> Any:
        return self.value_of(a) if isinstance(a, torch.fx.Proxy) else a

    def evaluate(self, kind: str, target: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if kind == "placeholder":
            index = self._placeholders
            self._placeholders += 1
            if index < len(self.inputs):
                return self.inputs[index]
            return args[0] if args else Unknown("no input for it")  # a defaulted argument's default
        a = map_aggregate(args, self._concrete)
        kw = map_aggregate(kwargs, self._concrete)
        self._evaluating = True
        try:
            if kind == "get_attr":
                value: Any = self.root
                for atom in str(target).split("."):
                    value = getattr(value, atom)
                return value
            with self.fake_mode:
                if kind == "call_function":
                    return target(*a, **kw)
                if kind == "call_method":
                    return getattr(a[0], target)(*a[1:], **kw)
                if kind == "call_module" and self._forward is not None:
                    return self._forward(*a, **kw)
        except torch.fx.proxy.TraceError:
            raise
        except Exception as exc:
            return Unknown(f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
        finally:
            self._evaluating = False
        return Unknown(f"{kind} {target}")

    # ---- fx hooks --------------------------------------------------------------------------------
    def is_leaf_module(self, m: torch.nn.Module, module_qualified_name: str) -> bool:
        return is_leaf(m, module_qualified_name)

    def create_proxy(
        self,
        kind: str,
        target: Any,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        name: str | None = None,
        type_expr: Any | None = None,
        proxy_factory_fn: Callable[[Node], torch.fx.Proxy] | None = None,
    ) -> ShapeProxy:
        proxy = super().create_proxy(
            kind, target, args, kwargs, name, type_expr, lambda node: ShapeProxy(node, self)
        )
        assert isinstance(proxy, ShapeProxy)
        proxy.node.meta[VALUE] = self.evaluate(kind, target, args, kwargs)
        return proxy

    def call_module(
        self, m: torch.nn.Module, forward: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        if self._evaluating:
            # A leaf module's own forward calling its submodules while its value is computed.
            return forward(*args, **kwargs)
        outer, self._forward = self._forward, forward
        try:
            return super().call_module(m, forward, args, kwargs)
        finally:
            self._forward = outer

    def getattr(self, attr: str, attr_val: Any, parameter_proxy_cache: dict[str, Any]) -> Any:
        if self._evaluating:
            return attr_val
        return super().getattr(attr, attr_val, parameter_proxy_cache)

    def create_arg(self, a: Any) -> Any:
        # A tensor computed eagerly while tracing would be baked into the program as a constant.
        tensor = isinstance(a, torch.Tensor) and not isinstance(a, torch.nn.Parameter)
        if tensor and not any(a is b for b in self.root.buffers()):
            raise torch.fx.proxy.TraceError(
                "the forward uses a tensor that is neither an input, a parameter nor a registered buffer "
                "(made from constants alone, e.g. torch.linspace(0, 1, n), or a plain tensor attribute)"
            )
        return super().create_arg(a)

    def trace(self, root: Any, concrete_args: dict[str, Any] | None = None) -> torch.fx.Graph:
        """fx records a torch function only when an argument is a proxy, so `torch.ones(T, T)` in the
        forward would run eagerly and be refused as a baked constant: while tracing, the constructors of
        constant tensors are recorded as nodes like any other call (the program makes them in turn)."""
        saved = {name: getattr(torch, name) for name in CONSTRUCTORS}

        def recorded(original: Callable[..., Any]) -> Callable[..., Any]:
            def constructor(*args: Any, **kwargs: Any) -> Any:
                if self._evaluating:
                    return original(*args, **kwargs)
                if isinstance(kwargs.get("dtype"), type):  # dtype=bool: torch's own spelling for fx
                    kwargs = dict(kwargs, dtype=PYTHON_DTYPES[kwargs["dtype"]])
                return self.create_proxy("call_function", original, args, kwargs)

            return constructor

        for name, original in saved.items():
            setattr(torch, name, recorded(original))
        try:
            return super().trace(root, concrete_args)
        finally:
            for name, original in saved.items():
                setattr(torch, name, original)

    def to_bool(self, obj: torch.fx.Proxy) -> bool:
        value = self.value_of(obj)
        if isinstance(value, torch.Tensor):
            raise DataDependent(
                "the forward branches on the values of a tensor: a traced program can follow shapes, not data"
            )
        return bool(value)

    def iter(self, obj: torch.fx.Proxy) -> Iterator[Any]:
        value = self.value_of(obj)
        count = int(value.shape[0]) if isinstance(value, torch.Tensor) else len(value)
        items: Any = obj
        return iter([items[i] for i in range(count)])


def register_einops() -> None:
    """Lets einops (`rearrange`, `reduce`, `repeat`, `einsum`) take the tracer's proxies when the reference
    imported it: einops finds a backend per tensor type among its backend classes whose framework module is
    loaded, and its torch backend's operations (reshape, permute, unsqueeze, expand, reductions) are calls
    the tracer records like any other. Its recipes need concrete shapes, which these proxies have."""
    backends = sys.modules.get("einops._backends")
    if backends is None or getattr(backends, "_stitch_registered", False):
        return

    class ShapeProxyBackend(backends.TorchBackend):  # type: ignore[misc,name-defined]
        framework_name = __name__

        def is_appropriate_type(self, tensor: Any) -> bool:
            return isinstance(tensor, ShapeProxy)

        def shape(self, x: Any) -> tuple[int, ...]:
            return tuple(x.shape)

    # Kept alive on the module: einops finds the backend among the subclasses, and registers it once.
    setattr(backends, "_stitch_registered", True)  # noqa: B010
    setattr(backends, "_stitch_backend", ShapeProxyBackend)  # noqa: B010


def specialized_trace(model: torch.nn.Module, make_inputs: Callable[[], list[Any]]) -> torch.fx.GraphModule:
    """The forward of `model` traced for the inputs `make_inputs` returns (made as fake tensors where
    it allows). Forward arguments the inputs leave out keep their defaults, as constants of the trace."""
    register_einops()
    fake_mode = FakeTensorMode(allow_non_fake_inputs=True)
    try:
        with fake_mode:
            inputs = list(make_inputs())
    except Exception:  # inputs built from data (.item(), ...): made for real, then faked
        inputs = [fake_mode.from_tensor(x) if isinstance(x, torch.Tensor) else x for x in make_inputs()]
    tracer = ShapeTracer(inputs, fake_mode)
    graph = tracer.trace(model, concrete_args=defaults_left_out(model, len(inputs)) or None)
    drop_defaulted(graph, len(inputs))
    for node in graph.nodes:
        node.meta.pop(VALUE, None)
    return torch.fx.GraphModule(tracer.root, graph, type(model).__name__)


class SymbolicTracer(torch.fx.Tracer):
    """torch.fx's tracer with the specialised trace's leaf rule. A buffer is read as a graph attribute, so
    work on it in the forward (`self.index.view(-1)`) is recorded rather than computed once while tracing
    and baked into the graph as a constant the program does not have."""

    proxy_buffer_attributes = True

    def is_leaf_module(self, m: torch.nn.Module, module_qualified_name: str) -> bool:
        return is_leaf(m, module_qualified_name)


def symbolic_trace(model: torch.nn.Module, count: int) -> torch.fx.GraphModule:
    """torch.fx's symbolic trace of a forward given `count` inputs: the arguments it leaves out are bound
    to their defaults, so `if h0 is None:` takes the branch the reference takes (not a proxy's)."""
    tracer = SymbolicTracer()
    graph = tracer.trace(model, concrete_args=defaults_left_out(model, count) or None)
    drop_defaulted(graph, count)
    return torch.fx.GraphModule(tracer.root, graph, type(model).__name__)


def defaults_left_out(model: torch.nn.Module, count: int) -> dict[str, Any]:
    params = list(inspect.signature(model.forward).parameters.values())[count:]
    return {p.name: p.default for p in params if p.default is not inspect.Parameter.empty}


def drop_defaulted(graph: torch.fx.Graph, count: int) -> None:
    """concrete_args leaves a placeholder and an assertion for each defaulted argument: the program's
    forward keeps the reference's signature, and those arguments take no part in the graph."""
    for node in list(graph.nodes):
        if node.op == "call_function" and getattr(node.target, "__name__", "") == "_assert_is_none":
            graph.erase_node(node)
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    for node in placeholders[count:]:
        if not node.users:
            graph.erase_node(node)
