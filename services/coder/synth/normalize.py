"""Lowers a traced torch.fx graph to the synthesizer's IR: primitive elementwise ops, reductions,
views, library calls and pooling, with norms and softmax decomposed into reductions + elementwise ops.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from stitchcuda.coder.synth.attention import attention_probs, lib_shaped, lower_multihead_attention
from stitchcuda.coder.synth.exprs import ALIASES, EW
from stitchcuda.coder.synth.ir import (
    EW as K_EW,
)
from stitchcuda.coder.synth.ir import (
    FLIP,
    HOST,
    INPUT,
    ITEM,
    LIB,
    PARAM,
    POOL,
    RANDOM,
    REDUCE,
    SCAN,
    TRI,
    VIEW,
    Arg,
    Attr,
    Const,
    Graph,
    Op,
    Ref,
    Unsupported,
    Value,
    broadcast_shapes,
    contiguous_strides,
    norm_dims,
    reduced_shape,
)
from stitchcuda.coder.synth.scan_folds import fold_scans
from stitchcuda.coder.synth.trace import Trace, TracedNode

FLOAT_DTYPES = ("float32",)
# Inputs the program accepts: float tensors, and boolean masks (read by elementwise ops as 0/1).
# Tensors elementwise kernels read (boolean masks as 0/1).
EW_DTYPES = (*FLOAT_DTYPES, "bool")
# int64 inputs are class indices (cross-entropy targets): only comparisons read them (int_reads).
INPUT_DTYPES = (*EW_DTYPES, "int64")
# torch constructors of constant tensors lowered in the forward, with their fill value.
CONSTANT_FILLS = {"ones": 1.0, "zeros": 0.0, "full": None}

# Every adaptive pooling module: global ones become reductions, the others window kernels.
ADAPTIVE_POOL_MODULES = tuple(f"Adaptive{kind}Pool{nd}d" for kind in ("Avg", "Max") for nd in (1, 2, 3))

# Activation modules: class -> (ew fn, [(module attribute, ew parameter)]).

ACTIVATION_MODULES: dict[str, tuple[str, list[str]]] = {
    "ReLU": ("relu", []),
    "ReLU6": ("relu6", []),
    "LeakyReLU": ("leaky_relu", ["negative_slope"]),
    "SiLU": ("silu", []),
    "Sigmoid": ("sigmoid", []),
    "Tanh": ("tanh", []),
    "Softplus": ("softplus", ["beta", "threshold"]),
    "Mish": ("mish", []),
    "Hardswish": ("hardswish", []),
    "Hardsigmoid": ("hardsigmoid", []),
    "Hardtanh": ("hardtanh", ["min_val", "max_val"]),
    "ELU": ("elu", ["alpha"]),
    "SELU": ("selu", []),
    "CELU": ("celu", ["alpha"]),
    "Softsign": ("softsign", []),
    "Tanhshrink": ("tanhshrink", []),
    "LogSigmoid": ("logsigmoid", []),
    "Identity": ("identity", []),
}

VIEW_FNS = frozenset(
    {"view", "reshape", "flatten", "unflatten", "unsqueeze", "squeeze", "transpose", "swapaxes", "permute",
     "t", "expand", "expand_as", "view_as", "reshape_as", "narrow", "select", "slice", "movedim"}
)  # fmt: skip
HOST_MATH = {"sqrt", "exp", "log", "sin", "cos", "tan", "floor", "ceil", "fabs", "pow", "log2", "log10"}


def view_strides(
    shape: tuple[int, ...], stride: tuple[int, ...], new: tuple[int, ...]
) -> tuple[int, ...] | None:
    """The strides of `new` as a view of a tensor laid out as (shape, stride), or None where torch's view
    would fail and reshape copy (ATen's computeStride: dims merge only where their strides chain)."""
    if math.prod(shape) == 0 or not shape:
        return tuple(contiguous_strides(new))
    out = [0] * len(new)
    view_d = len(new) - 1
    base = stride[-1]
    tensor_numel = view_numel = 1
    for d in range(len(shape) - 1, -1, -1):
        tensor_numel *= shape[d]
        if d == 0 or (shape[d - 1] != 1 and stride[d - 1] != tensor_numel * base):
            while view_d >= 0 and (view_numel < tensor_numel or new[view_d] == 1):
                out[view_d] = view_numel * base
                view_numel *= new[view_d]
                view_d -= 1
            if view_numel != tensor_numel:
                return None
            if d > 0:
                base = stride[d - 1]
                tensor_numel = view_numel = 1
    return tuple(out) if view_d == -1 else None


def short_name(target: str) -> str:
    for prefix in ("torch.nn.functional.", "torch.Tensor.", "torch.", "operator.", "builtins.", "math."):
        if target.startswith(prefix):
            return target[len(prefix) :]
    return target.rsplit(".", 1)[-1]


# Keyword arguments that only place a result (device, dtype): a device value may be passed to them.
PLACEMENT_KWARGS = frozenset({"device", "dtype"})
PLACEMENT_ATTRS = frozenset({"device", "dtype"})


class Normalizer:
    """One pass over the fx nodes in order; each handler appends IR ops and defines the node's value."""

    def __init__(self, trace: Trace) -> None:
        self.trace = trace
        self.g = Graph()
        self._fresh = 0
        # fx node name -> the IR value its lowering produced (when they differ).
        self.alias: dict[str, str] = {}
        # Comparisons allowed to read int64 tensors (check_int_reads).
        self.int_reads: set[str] = set()
        # Results the lowering does not produce (a tensor's device as a value): an error only if used.
        self.unavailable: dict[str, str] = {}

    # ---- helpers -------------------------------------------------------------------------------
    def fresh(self, origin: str) -> str:
        self._fresh += 1
        return f"{origin}__{self._fresh}"

    def meta_value(self, ident: str, meta: dict[str, Any]) -> Value:
        kind = meta.get("kind", "unknown")
        if kind == "tensor":
            return Value(
                ident,
                "tensor",
                tuple(meta["shape"]),
                tuple(meta["stride"]),
                meta["dtype"],
                bool(meta["contiguous"]),
            )
        if kind in ("int", "float", "bool", "shape"):
            return Value(ident, kind, const=meta.get("value"))
        if kind == "list":
            return Value(ident, "list", const=meta.get("items"))
        if kind == "none":
            return Value(ident, "none")
        raise Unsupported(f"{ident}: result of kind {kind} ({meta.get('repr', '')})")

    def arg(self, node: TracedNode, raw: Any, path: str) -> Any:
        """Decodes one encoded fx argument (node refs, literals, float attributes of the model)."""
        if isinstance(raw, dict):
            if "node" in raw:
                name = str(raw["node"])
                return Ref(self.alias.get(name, name))
            if "float" in raw:
                return Const(float(raw["float"]))
            if "slice" in raw:
                return ("slice", *[self.arg(node, x, path) for x in raw["slice"]])
            if "ellipsis" in raw:
                return ("ellipsis",)
            if "dtype" in raw:
                return ("dtype", raw["dtype"])
            if "memory_format" in raw or "device" in raw:
                return ("ignored",)
            raise Unsupported(f"{node.name}: argument {raw}")
        if isinstance(raw, list):
            return [self.arg(node, x, f"{path}.{i}") for i, x in enumerate(raw)]
        if isinstance(raw, bool):
            return Const(raw)
        if isinstance(raw, float):
            source = self.trace.scalar_sources.get(f"{node.name}:{path}")
            return Attr(source, raw) if source else Const(raw)
        if isinstance(raw, int):
            return Const(raw)
        return raw

    def node_args(self, node: TracedNode) -> tuple[list[Any], dict[str, Any]]:
        args = [self.arg(node, a, f"args.{i}") for i, a in enumerate(node.args)]
        kwargs = {k: self.arg(node, v, f"kwargs.{k}") for k, v in node.kwargs.items()}
        # `t.to(x.device)`: a placement given positionally is dropped like one given by keyword.
        checked = args[:1] if node.target == "to" else args
        for a in [*checked, *(v for k, v in kwargs.items() if k not in PLACEMENT_KWARGS)]:
            if isinstance(a, Ref) and a.id in self.unavailable:
                raise Unsupported(f"{node.name}: uses {self.unavailable[a.id]}")
        return args, kwargs

    def value(self, a: Any) -> Value | None:
        return self.g.values.get(a.id) if isinstance(a, Ref) else None

    def is_tensor(self, a: Any) -> bool:
        v = self.value(a)
        return v is not None and v.kind == "tensor"

    def shape_of(self, a: Any) -> tuple[int, ...]:
        v = self.value(a)
        return v.shape if v is not None and v.kind == "tensor" else ()

    def emit_ew(
        self,
        fn: str,
        operands: list[Any],
        params: list[Any],
        origin: str,
        out: str | None = None,
        small_ints: bool = False,
    ) -> Ref:
        """One elementwise op; `small_ints`: a comparison whose int64 operands are known to hold integers
        exact in float32 (class indices), the only reads of int64 tensors the float kernels make."""
        spec = EW[fn]
        for a in operands:
            v = self.value(a)
            allowed = (*EW_DTYPES, "int64") if small_ints and spec.result == "bool" else EW_DTYPES
            if v is not None and v.kind == "tensor" and v.dtype not in allowed:
                raise Unsupported(f"{origin}: elementwise {fn} on a {v.dtype} tensor")
        shape = broadcast_shapes(*[self.shape_of(a) for a in operands if self.is_tensor(a)])
        ident = out or self.fresh(origin)
        dtype = "bool" if spec.result == "bool" else "float32"
        self.g.add_value(Value(ident, "tensor", shape, contiguous_strides(shape), dtype, True))
        self.g.add_op(Op(K_EW, fn, ident, [*operands, *params], origin=origin))
        if small_ints:
            self.int_reads.add(ident)
        return Ref(ident)

    def scalar(self, a: Any, default: float | int | bool | None = None) -> Any:
        if a is None:
            return Const(default) if default is not None else None
        if isinstance(a, Const | Attr):
            return a
        if isinstance(a, Ref) and self.g.values[a.id].kind in ("int", "float", "bool"):
            return a
        if isinstance(a, Ref) and self.g.values[a.id].kind == "tensor":
            return a
        if isinstance(a, int | float):
            return Const(a)
        raise Unsupported(f"scalar argument {a!r}")

    def literal(self, a: Any) -> Any:
        """A compile-time Python value (ints for dims, kernel sizes, ...)."""
        if isinstance(a, Const):
            return a.value
        if isinstance(a, Attr):
            return a.value
        if isinstance(a, list):
            return [self.literal(x) for x in a]
        if isinstance(a, Ref):
            v = self.g.values[a.id]
            if v.kind in ("int", "float", "bool"):
                return v.const
            raise Unsupported(f"{a.id} is used where a constant is needed")
        return a

    def mod_attr(self, node: TracedNode, attr: str) -> Any:
        mod = node.module or {}
        value = mod.get("attrs", {}).get(attr)
        if isinstance(value, float) and not isinstance(value, bool):
            return Attr(f"{node.target}.{attr}", value)
        if isinstance(value, dict) and "float" in value:
            return Const(float(value["float"]))
        return Const(value) if isinstance(value, int | bool) else value

    def param_ref(self, path: str, shape: tuple[int, ...]) -> Ref:
        ident = "p_" + path.replace(".", "_")
        if ident not in self.g.values:
            self.g.add_value(Value(ident, "tensor", shape, contiguous_strides(shape)))
            self.g.add_op(Op(PARAM, "param", ident, attrs={"path": path}, origin=path))
            self.g.params[ident] = path
        return Ref(ident)

    def view_op(self, fn: str, src: Ref, attrs: dict[str, Any], shape: tuple[int, ...], origin: str) -> Ref:
        """A view the lowering itself makes, with the strides it has: a reshape that cannot be a view of
        its source (heads split from a slice of a fused projection) copies through the program's own
        identity kernel rather than inside at::reshape."""
        sv = self.g.values[src.id]
        laid = sv.stride if len(sv.stride) == len(sv.shape) else tuple(contiguous_strides(sv.shape))
        stride = tuple(contiguous_strides(shape))
        if fn == "reshape":
            viewed = view_strides(sv.shape, laid, shape)
            if viewed is None and sv.dtype == "float32":
                src = self.emit_ew("identity", [src], [], origin)
            elif viewed is not None:
                stride = viewed
        elif fn == "transpose" and len(laid) == len(shape):
            d0, d1 = (int(a.value) % len(shape) for a in attrs["args"][:2])
            swapped = list(laid)
            swapped[d0], swapped[d1] = swapped[d1], swapped[d0]
            stride = tuple(swapped)
        elif fn == "narrow" and len(laid) == len(shape):
            stride = laid
        ident = self.fresh(origin)
        contiguous = stride == tuple(contiguous_strides(shape))
        self.g.add_value(Value(ident, "tensor", shape, stride, sv.dtype, contiguous))
        self.g.add_op(Op(VIEW, fn, ident, [src], attrs, origin=origin))
        return Ref(ident)

    def reduce(
        self, fn: str, x: Ref, dims: tuple[int, ...], keepdim: bool, origin: str, out: str | None = None
    ) -> Ref:
        shape = reduced_shape(self.shape_of(x), dims, keepdim)
        ident = out or self.fresh(origin)
        dtype = "int64" if fn in ("argmax", "argmin") else "float32"
        self.g.add_value(Value(ident, "tensor", shape, contiguous_strides(shape), dtype))
        self.g.add_op(Op(REDUCE, fn, ident, [x], {"dims": list(dims), "keepdim": keepdim}, origin=origin))
        return Ref(ident)

    def own_id(self, node: TracedNode) -> str:
        return node.name if node.name not in self.g.values else self.fresh(node.name)

    def define(self, node: TracedNode, result: Ref) -> None:
        """Makes the fx node's name refer to the last value of its lowering."""
        if result.id != node.name:
            self.alias[node.name] = result.id

    # ---- driver --------------------------------------------------------------------------------
    def run(self) -> Graph:
        for node in self.trace.nodes:
            try:
                self.lower(node)
            except Unsupported as exc:
                if str(exc).startswith(node.name):
                    raise
                raise Unsupported(f"{node.name} ({node.target}): {exc}") from exc
        if self.trace.specialized:
            self.guard_shapes()
        self.check_int_reads()
        fold_scans(self.g)
        return self.g

    def check_int_reads(self) -> None:
        """An int64 tensor (an input of class indices, an index buffer) is read only by views, indexing, and
        the comparisons a lowering made knowing its values are small integers, exact in float32: torch's
        integer arithmetic (division, overflow) is not what the float kernels compute."""
        for op in self.g.ops:
            if op.kind in (VIEW, HOST) or op.out in self.int_reads:
                continue
            for ident in op.refs():
                v = self.g.values[ident]
                if (
                    v.kind == "tensor"
                    and v.dtype == "int64"
                    and self.g.producer[ident].kind in (INPUT, PARAM, VIEW)
                ):
                    raise Unsupported(
                        f"{op.origin}: {op.fn} of an int64 tensor (integer tensors are class indices and "
                        "indices, read only by comparisons and indexing)"
                    )

    def guard_shapes(self) -> None:
        """A trace specialised to the inputs' shapes holds them as numbers (view sizes, loop counts): the
        program checks every input and model tensor against the shape it was traced with."""
        ops: list[Op] = []
        for op in self.g.ops:
            ops.append(op)
            v = self.g.values[op.out]
            if op.kind in (INPUT, PARAM) and v.kind == "tensor":
                ident = self.fresh(op.out + "_guard")
                self.g.add_value(Value(ident, "none"))
                check = Op(
                    HOST, "check_shape", ident, [Ref(op.out)], {"shape": list(v.shape)}, origin=op.origin
                )
                self.g.producer[ident] = check
                ops.append(check)
        self.g.ops = ops

    def lower(self, node: TracedNode) -> None:
        if node.op == "placeholder":
            v = self.meta_value(node.name, node.meta)
            if v.kind == "tensor" and v.dtype not in INPUT_DTYPES:
                raise Unsupported(f"{node.name}: input of dtype {v.dtype}")
            self.g.add_value(v)
            self.g.add_op(Op(INPUT, "input", node.name, origin=node.name))
            self.g.inputs.append((node.name, node.target))
            return
        if node.op == "get_attr" and node.constant is not None:
            self.define(node, self.graph_constant(node))
            return
        if node.op == "get_attr":
            v = self.meta_value(node.name, node.meta)
            if v.kind != "tensor":
                raise Unsupported(f"{node.name}: attribute {node.target} is not a tensor")
            if v.dtype not in FLOAT_DTYPES and v.dtype != "int64":  # int64: an index buffer (check_int_reads)
                raise Unsupported(f"{node.name}: attribute {node.target} has dtype {v.dtype}")
            self.g.add_value(v)
            self.g.add_op(Op(PARAM, "param", node.name, attrs={"path": node.target}, origin=node.name))
            self.g.params[node.name] = node.target
            return
        if node.op == "output":
            out = node.args[0]
            if isinstance(out, list):
                self.g.output_is_tuple = True
                refs = [self.arg(node, o, "out") for o in out]
            else:
                refs = [self.arg(node, out, "out")]
            for r in refs:
                if not isinstance(r, Ref) or self.g.values[r.id].kind != "tensor":
                    raise Unsupported("the forward must return tensors")
            self.g.outputs = [r.id for r in refs]
            return
        args, kwargs = self.node_args(node)
        if node.op == "call_module":
            self.lower_module(node, args, kwargs)
            return
        name = short_name(node.target) if node.op == "call_function" else node.target
        in_place = name.endswith("_") and not name.startswith("_") and name[:-1] in EW
        if in_place:
            name = name[:-1]
        if node.op == "call_function" and not args and "input" in kwargs:
            # F.linear(input=x, weight=w): the tensor operand by keyword, where every lowering reads it first.
            kwargs = dict(kwargs)
            args = [kwargs.pop("input")]
        self.lower_call(node, name, args, kwargs)
        target = node.args[0] if node.args else None
        if in_place and node.op == "call_method" and isinstance(target, dict) and "node" in target:
            # `t.floor_()` as a statement: t's later readers see the new value, as in torch.
            self.alias[target["node"]] = self.alias.get(node.name, node.name)

    # ---- calls -----------------------------------------------------------------------------------
    def lower_call(self, node: TracedNode, name: str, args: list[Any], kwargs: dict[str, Any]) -> None:
        if name == "getitem" and isinstance(args[0], Ref) and self.g.values[args[0].id].kind == "list":
            self.fn_getitem(node, args, kwargs)
            return
        if name == "getattr" and isinstance(args[0], Ref) and self.g.values[args[0].id].kind == "list":
            # torch.max(x, dim).values / .indices: the named tuple's fields.
            field = {"values": 0, "indices": 1}.get(str(args[1]))
            if field is None:
                raise Unsupported(f"{node.name}: attribute {args[1]} of a tuple")
            self.fn_getitem(node, [args[0], Const(field)], {})
            return
        if name in ("cat", "concat", "concatenate", "stack") and args and isinstance(args[0], list | tuple):
            self.define(node, self.cat(node, name == "stack", list(args[0]), args[1:], kwargs))
            return
        tensor_args = [a for a in args if self.is_tensor(a)]
        if name == "tensor" and not tensor_args:
            self.define(node, self.tensor_literal(node, args))
            return
        if name in CONSTANT_FILLS and node.meta.get("kind") == "tensor":
            self.define(node, self.constant_fill(node, name, args, kwargs))
            return
        if name in ("randn", "rand") and node.meta.get("kind") == "tensor":
            self.define(node, self.random_draw(node, name, [], {}))
            return
        if not tensor_args and not any(self.is_tensor(v) for v in kwargs.values()):
            self.lower_host(node, name, args, kwargs)
            return
        handler: Callable[[TracedNode, list[Any], dict[str, Any]], Ref | None] | None = getattr(
            self, f"fn_{name}", None
        )
        if handler is not None:
            result = handler(node, args, kwargs)
            if result is not None:
                self.define(node, result)
            return
        ew = ALIASES.get(name, name)
        if ew in EW:
            self.define(node, self.generic_ew(node, ew, args, kwargs))
            return
        raise Unsupported(f"{node.name}: no lowering for {node.target}")

    def generic_ew(self, node: TracedNode, fn: str, args: list[Any], kwargs: dict[str, Any]) -> Ref:
        spec = EW[fn]
        operands = [self.scalar(a) for a in args[: spec.operands]]
        rest = args[spec.operands :]
        params = []
        for i, (pname, default) in enumerate(spec.params):
            raw = rest[i] if i < len(rest) else kwargs.get(pname)
            params.append(self.scalar(raw, default))  # type: ignore[arg-type]
        if any(p is None for p in params):
            raise Unsupported(f"{node.name}: missing parameter of {fn}")
        return self.emit_ew(fn, operands, params, node.name, out=node.name)

    def lower_host(self, node: TracedNode, name: str, args: list[Any], kwargs: dict[str, Any]) -> None:
        v = self.meta_value(node.name, node.meta)
        if v.kind not in ("int", "float", "bool", "shape"):
            raise Unsupported(f"{node.name}: host computation {name} yielding {v.kind}")
        self.g.add_value(v)
        self.g.add_op(Op(HOST, name, node.name, args, dict(kwargs), origin=node.name))

    def host_from_tensor(self, node: TracedNode, fn: str, args: list[Any]) -> None:
        v = self.meta_value(node.name, node.meta)
        self.g.add_value(v)
        self.g.add_op(Op(HOST, fn, node.name, args, origin=node.name))

    # Shape queries on tensors become host ops.
    def fn_size(self, node: TracedNode, args: list[Any], kwargs: dict[str, Any]) -> None:
        dim = args[1] if len(args) > 1 else kwargs.get("dim")
        self.host_from_tensor(node, "size", [args[0]] + ([dim] if dim is not None else []))

    def fn_dim(self, node: TracedNode, args: list[Any], kwargs: dict[str, Any]) -> None:
        self.host_from_tensor(node, "dim", [args[0]])

    def fn_numel(self, node: TracedNode, args: list[Any], kwargs: dict[str, Any]) -> None:
        self.host_from_tensor(node, "numel", [args[0]])

    def fn_getattr(self, node: TracedNode, args: list[Any], kwargs: dict[str, Any]) -> Ref | None:
        attr = args[1]
        if attr == "shape":
            self.host_from_tensor(node, "size", [args[0]])
            return None
        if attr == "ndim":
            self.host_from_tensor(node, "dim", [args[0]])
            return None
        if attr in ("T", "mT"):
            return self._view(node, "transpose", [args[0], Const(-2), Const(-1)], {})
        if attr in PLACEMENT_ATTRS:
            # Only meaningful as a placement (`torch.tensor(0.0, device=x.device)`): the program runs on
            # its inputs' device and in float32, so a placement argument is dropped; any other use is refused.
            self.g.add_value(Value(node.name, "none"))
            self.unavailable[node.name] = f"the tensor attribute {attr} as a value"
            return None
        raise Unsupported(f"{node.name}: tensor attribute {attr}")

    def cat(
        self, node: TracedNode, stack: bool, parts: list[Any], rest: list[Any], kwargs: dict[str, Any]
    ) -> Ref:
        """torch.cat / torch.stack: the program's own copy kernel writes each part into its slice."""
        dim_arg = rest[0] if rest else kwargs.get("dim", kwargs.get("axis", Const(0)))
        dim = int(self.literal(dim_arg))
        if not parts or not all(self.is_tensor(p) for p in parts):
            raise Unsupported(f"{node.name}: {'stack' if stack else 'cat'} of non-tensors")
        for p in parts:
            if self.g.values[p.id].dtype != "float32":
                raise Unsupported(f"{node.name}: cat of a {self.g.values[p.id].dtype} tensor")
        rank = len(self.shape_of(parts[0])) + (1 if stack else 0)
        dim = dim + rank if dim < 0 else dim
        if stack:
            parts = [
                self.view_op(
                    "unsqueeze",
                    p,
                    {"args": [Const(dim)], "kwargs": {}},
                    (*self.shape_of(p)[:dim], 1, *self.shape_of(p)[dim:]),
                    node.name,
                )
                for p in parts
            ]
        if len(self.shape_of(parts[0])) == 0:
            raise Unsupported(f"{node.name}: cat of 0-d tensors")
        return self.lib("cat", parts, {"dim": dim}, node)

    def fn_pad(self, node: TracedNode, args: list[Any], kwargs: dict[str, Any]) -> Ref:
        """F.pad in constant mode: per padded dim, a cat of constant blocks around the tensor (the blocks
        are one constant expanded to their shape, the other sizes read at run time)."""
        got = dict(zip(["input", "pad", "mode", "value"], args, strict=False)) | kwargs
        if got.get("mode", "constant") != "constant":
            raise Unsupported(f"{node.name}: pad mode {got.get('mode')}")
        value = self.literal(got["value"]) if got.get("value") is not None else 0.0
        pads = [int(p) for p in self.literal(got["pad"])]
        x: Ref = got["input"]
        if any(p < 0 for p in pads) or self.g.values[x.id].dtype != "float32":
            raise Unsupported(f"{node.name}: pad that crops, or of a non-float tensor")
        rank = len(self.shape_of(x))
        for i in range(len(pads) // 2):
            dim, widths = rank - 1 - i, pads[2 * i : 2 * i + 2]
            if widths == [0, 0]:
                continue
            parts = [self.constant_block(x, dim, w, float(value), node.name) if w else None for w in widths]
            shape = list(self.shape_of(x))
            shape[dim] += sum(widths)
            x = lib_shaped(self, "cat", [p for p in (parts[0], x, parts[1]) if p is not None], {"dim": dim},
                           tuple(shape), node.name)  # fmt: skip
        return x

    def constant_block(self, like: Ref, dim: int, width: int, value: float, origin: str) -> Ref:
        """`value` expanded to like's shape with `width` along dim (a view: stride 0 everywhere)."""
        one = self.emit_ew("identity", [Const(value)], [], origin)
        sizes: list[Any] = []
        for d, extent in enumerate(self.shape_of(like)):
            if d == dim:
                sizes.append(Const(width))
                continue
            ident = self.fresh(origin)
            self.g.add_value(Value(ident, "int", const=extent))
            self.g.add_op(Op(HOST, "size", ident, [like, Const(d)], origin=origin))
            sizes.append(Ref(ident))
        shape = tuple(width if d == dim else s for d, s in enumerate(self.shape_of(like)))
        return self.view_op("expand", one, {"args": sizes, "kwargs": {}}, shape, origin)

    def graph_constant(self, node: TracedNode) -> Ref:
        """A one-element tensor torch.fx kept as a graph attribute (`torch.tensor(self.value)` in a symbolic
        trace): the model has no such attribute, so its value is folded in like `torch.tensor(number)`."""
        meta = self.meta_value(node.name, node.meta)
        value = node.constant
        if isinstance(value, bool) or not isinstance(value, int | float) or meta.dtype not in FLOAT_DTYPES:
            raise Unsupported(f"{node.name}: a constant {node.target} of dtype {meta.dtype}")
        one = self.emit_ew("identity", [Const(float(value))], [], node.name)
        if not meta.shape:
            return one
        return self.view_op(
            "expand", one, {"args": [Const(n) for n in meta.shape], "kwargs": {}}, meta.shape, node.name
        )

    def tensor_literal(self, node: TracedNode, args: list[Any]) -> Ref:
        """`torch.tensor(number)`: a 0-d constant, folded into the kernels that read it."""
        value = self.literal(args[0]) if args else None
        meta = self.meta_value(node.name, node.meta)
        if isinstance(value, bool) or not isinstance(value, int | float) or meta.shape != ():
            raise Unsupported(f"{node.name}: torch.tensor of {value!r} (only a number is lowered)")
        if meta.dtype not in FLOAT_DTYPES:
            raise Unsupported(f"{node.name}: torch.tensor of dtype {meta.dtype}")
        return self.emit_ew("identity", [Const(float(value))], [], node.name, node.name)

    def constant_fill(self, node: TracedNode, fn: str, args: list[Any], kwargs: dict[str, Any]) -> Ref:
        """torch.ones/zeros/full(size, ...) in the forward (a mask, an initial state): one constant element
        expanded (a view) to the traced size, float32 or bool; the kernels that read it fold it in."""
        meta = self.meta_value(self.own_id(node), node.meta)
        if fn == "full":
            got = dict(zip(["size", "fill_value"], args, strict=False)) | kwargs
            value = self.literal(got.get("fill_value"))
        else:
            value = CONSTANT_FILLS[fn]
        if not isinstance(value, int | float) or meta.dtype not in ("float32", "bool"):
            raise Unsupported(f"{node.name}: torch.{fn} of dtype {meta.dtype} (float32 and bool are lowered)")
        if meta.dtype == "bool":
            one = self.emit_ew("ne", [Const(float(value)), Const(0.0)], [], node.name)
        else:
            one = self.emit_ew("identity", [Const(float(value))], [], node.name)
        if not meta.shape:
            return one
        size = [Const(n) for n in meta.shape]
        strides = (0,) * len(meta.shape)
        self.g.add_value(Value(meta.id, "tensor", meta.shape, strides, meta.dtype, False))
        self.g.add_op(Op(VIEW, "expand", meta.id, [one], {"args": size, "kwargs": {}}, origin=node.name))
        return Ref(meta.id)

    def fn_zeros_like(self, node: TracedNode, args: list[Any], kwargs: dict[str, Any]) -> Ref:
        return self.filled_like(node, args[0], 0.0, kwargs)

    def fn_ones_like(self, node: TracedNode, args: list[Any], kwargs: dict[str, Any]) -> Ref:
        return self.filled_like(node, args[0], 1.0, kwargs)

    def filled_like(self, node: TracedNode, x: Ref, value: float, kwargs: dict[str, Any]) -> Ref:
        """zeros_like/ones_like: a one-element constant expanded (a view) to the shape of x at run time."""
        dtype = kwargs.get("dtype")
        foreign = isinstance(dtype, tuple) and dtype[1] not in FLOAT_DTYPES
        if foreign or self.g.values[x.id].dtype != "float32":
            raise Unsupported(f"{node.name}: a constant tensor that is not float32")
        one = self.emit_ew("identity", [Const(value)], [], node.name)
        shape = self.shape_of(x)
        ident = self.own_id(node)
        self.g.add_value(Value(ident, "tensor", shape, (0,) * len(shape), "float32", len(shape) == 0))
        self.g.add_op(Op(VIEW, "expand_as", ident, [one], {"args": [x], "kwargs": {}}, origin=node.name))
        return Ref(ident)

    def fn_getitem(self, node: TracedNode, args: list[Any], kwargs: dict[str, Any]) -> Ref | None:
        src = self.g.values[args[0].id]
        if src.kind == "list":
            producer = self.g.producer.get(src.id)
            index = self.literal(args[1])
            if producer is not None and producer.fn == "tuple" and isinstance(index, int):
                item = producer.args[index]
                if isinstance(item, Ref):
                    self.alias[node.name] = item.id
                else:
                    self.g.add_value(Value(node.name, "none"))
                    self.unavailable[node.name] = str(item)
                return None
            ident = node.name
            self.g.add_value(self.meta_value(ident, node.meta))
            self.g.add_op(Op(ITEM, "item", ident, [args[0], args[1]], origin=node.name))
            return None
        if src.kind != "tensor":
            raise Unsupported(f"{node.name}: indexing a {src.kind}")
        meta = self.meta_value(node.name, node.meta)
        index = args[1] if isinstance(args[1], list) else [args[1]]
        tensors = [i for i, item in enumerate(index) if self.is_tensor(item)]
        if tensors:
            # x[idx], x[:, idx]: an int64 index tensor after full slices only picks slices along one dim.
            at = tensors[0]
            full = all(item == ("slice", None, None, None) for item in index[:at])
            if len(tensors) > 1 or at != len(index) - 1 or not full:
                raise Unsupported(
                    f"{node.name}: tensor indexing other than one index tensor after full slices"
                )
            return self.index_pick(node, args[0], at, index[at])
        for item in index:
            # Host integers (x[:, :T] with T = x.size(1)) are read at run time; anything else is refused.
            refs = (
                [item]
                if isinstance(item, Ref)
                else [x for x in item if isinstance(x, Ref)]
                if isinstance(item, tuple)
                else []
            )
            if any(self.g.values[r.id].kind != "int" for r in refs):
                raise Unsupported(f"{node.name}: indexing with a {self.g.values[refs[0].id].kind} value")
        return self.view_op("index", args[0], {"index": index}, meta.shape, node.name)

    def index_pick(self, node: TracedNode, src: Ref, dim: int, index: Ref) -> Ref:
        """src's slices along `dim` picked by an int64 index of any shape (index_select, embedding,
        x[index]): the synthesizer's own gather kernel (libops.py stitch_index)."""
        sv, iv = self.g.values[src.id], self.g.values[index.id]
        if iv.dtype != "int64":
            what = (
                "a boolean mask (its result's shape depends on the data)" if iv.dtype == "bool" else iv.dtype
            )
            raise Unsupported(f"{node.name}: indexing with {what}")
        if sv.dtype not in FLOAT_DTYPES or not sv.shape:
            raise Unsupported(f"{node.name}: indexing a {sv.dtype} tensor of shape {list(sv.shape)}")
        d = dim % len(sv.shape)
        picked = lib_shaped(
            self, "index", [src, index], {"dim": d}, sv.shape[:d] + iv.shape + sv.shape[d + 1 :], node.name
        )
        self.int_reads.add(picked.id)
        return picked

    def fn_roll(self, node: TracedNode, args: list[Any], kwargs: dict[str, Any]) -> Ref:
        """torch.roll along given dims (Swin's shifted windows): the synthesizer's own kernel."""
        shifts = self.literal(args[1] if len(args) > 1 else kwargs.get("shifts"))
        dims = self.literal(args[2] if len(args) > 2 else kwargs.get("dims"))
        shifts = list(shifts) if isinstance(shifts, list | tuple) else [shifts]
        dims = list(dims) if isinstance(dims, list | tuple) else [dims] if dims is not None else []
        if not dims or len(dims) != len(shifts) or not all(isinstance(v, int) for v in [*shifts, *dims]):
            raise Unsupported(f"{node.name}: roll needs constant shifts and as many dims")
        src = self.value(args[0])
        if src is None or src.dtype != "float32":
            raise Unsupported(f"{node.name}: roll of a tensor that is not float32")
        return lib_shaped(self, "roll", [args[0]], {"shifts": shifts, "dims": dims}, src.shape, node.name)

    def fn_index_select(self, node: TracedNode, args: list[Any], kwargs: dict[str, Any]) -> Ref:
        dim = args[1] if len(args) > 1 else kwargs.get("dim")
        index = args[2] if len(args) > 2 else kwargs.get("index")
        if not isinstance(dim, Const) or not isinstance(index, Ref) or len(self.shape_of(index)) > 1:
            raise Unsupported(f"{node.name}: index_select needs a constant dim and a 1-D index tensor")
        return self.index_pick(node, args[0], int(dim.value), index)

    def fn_embedding(self, node: TracedNode, args: list[Any], kwargs: dict[str, Any]) -> Ref:
        """F.embedding(ids, weight): weight's rows picked by ids (padding_idx only changes gradients)."""
        weight = args[1] if len(args) > 1 else kwargs.get("weight")
        max_norm = args[3] if len(args) > 3 else kwargs.get("max_norm")
        if max_norm is not None and not (isinstance(max_norm, Const) and max_norm.value is None):
            raise Unsupported(f"{node.name}: embedding with max_norm (it renormalises the weight in place)")
        if not isinstance(weight, Ref):
            raise Unsupported(f"{node.name}: embedding without a weight tensor")
        return self.index_pick(node, weight, 0, args[0])

    # Elementwise with special argument handling.
    def fn_add(self, node: TracedNode, args: list[Any], kwargs: dict[str, Any]) -> Ref:
        return self._add_sub(node, "add", args, kwargs)

    def fn_sub(self, node: TracedNode, args: list[Any], kwargs: dict[str, Any]) -> Ref:
        return self._add_sub(node, "sub", args, kwargs)

    def fn_rsub(self, node: TracedNode, args: list[Any], kwargs: dict[str, Any]) -> Ref:
        return self._add_sub(node, "sub", [args[1], args[0], *args[2:]], kwargs)

    def _add_sub(self, node: TracedNode, fn: str, args: list[Any], kwargs: dict[str, Any]) -> Ref:
        a, b = self.scalar(args[0]), self.scalar(args[1] if len(args) > 1 else kwargs.get("other"))
        alpha = kwargs.get("alpha", args[2] if len(args) > 2 else None)
        if alpha is not None and self.literal(alpha) != 1:
            b = self.emit_ew("mul", [b, self.scalar(alpha)], [], node.name)
        return self.emit_ew(fn, [a, b], [], node.name, out=node.name)

    def fn_div(self, node: TracedNode, args: list[Any], kwargs: dict[str, Any]) -> Ref:
        mode = kwargs.get("rounding_mode", args[2] if len(args) > 2 else None)
        fn = {None: "div", "trunc": "div_trunc", "floor": "div_floor"}.get(mode)
        if fn is None:
            raise Unsupported(f"{node.name}: rounding mode {mode}")
        other = args[1] if len(args) > 1 else kwargs.get("other")
        return self.emit_ew(fn, [self.scalar(args[0]), self.scalar(other)], [], node.name, out=node.name)

    fn_truediv = fn_div
    fn_true_divide = fn_div
    fn_divide = fn_div

    def fn_floordiv(self, node: TracedNode, args: list[Any], kwargs: dict[str, Any]) -> Ref:
        return self.emit_ew(
            "div_floor", [self.scalar(args[0]), self.scalar(args[1])], [], node.name, node.name
        )

    def fn_mod(self, node: TracedNode, args: list[Any], kwargs: dict[str, Any]) -> Ref:
        return self.emit_ew(
            "remainder", [self.scalar(args[0]), self.scalar(args[1])], [], node.name, node.name
        )

    def fn_pow(self, node: TracedNode, args: list[Any], kwargs: dict[str, Any]) -> Ref:
        base = self.scalar(args[0] if args else kwargs.get("input", kwargs.get("self")))
        exponent = self.scalar(args[1] if len(args) > 1 else kwargs.get("exponent"))
        return self.emit_ew("pow", [base, exponent], [], node.name, out=node.name)

    def fn_gelu(self, node: TracedNode, args: list[Any], kwargs: dict[str, Any]) -> Ref:
        approximate = kwargs.get("approximate", args[1] if len(args) > 1 else "none")
        fn = "gelu_tanh" if approximate == "tanh" else "gelu"
        return self.emit_ew(fn, [args[0]], [], node.name, out=node.name)

    def fn_clamp(self, node: TracedNode, args: list[Any], kwargs: dict[str, Any]) -> Ref:
        lo = kwargs.get("min", args[1] if len(args) > 1 else None)
        hi = kwargs.get("max", args[2] if len(args) > 2 else None)
        x = args[0]
        if lo is not None and hi is not None:
            return self.emit_ew("clamp", [x, self.scalar(lo), self.scalar(hi)], [], node.name, node.name)
        if lo is not None:
            return self.emit_ew("clamp_min", [x, self.scalar(lo)], [], node.name, node.name)
        if hi is not None:
            return self.emit_ew("clamp_max", [x, self.scalar(hi)], [], node.name, node.name)
        return self.emit_ew("identity", [x], [], node.name, node.name)

    fn_clip = fn_clamp

    def fn_clamp_min(self, node: TracedNode, args: list[Any], kwargs: dict[str, Any]) -> Ref:
        return self.emit_ew("clamp_min", [args[0], self.scalar(args[1])], [], node.name, node.name)

    def fn_clamp_max(self, node: TracedNode, args: list[Any], kwargs: dict[str, Any]) -> Ref:
        return self.emit_ew("clamp_max", [args[0], self.scalar(args[1])], [], node.name, node.name)

    def fn_hardtanh(self, node: TracedNode, args: list[Any], kwargs: dict[str, Any]) -> Ref:
        lo = kwargs.get("min_val", args[1] if len(args) > 1 else Const(-1.0))
        hi = kwargs.get("max_val", args[2] if len(args) > 2 else Const(1.0))
        return self.emit_ew("clamp", [args[0], self.scalar(lo), self.scalar(hi)], [], node.name, node.name)

    def fn_relu6(self, node: TracedNode, args: list[Any], kwargs: dict[str, Any]) -> Ref:
        return self.emit_ew("clamp", [args[0], Const(0.0), Const(6.0)], [], node.name, node.name)

    def fn_dropout(self, node: TracedNode, args: list[Any], kwargs: dict[str, Any]) -> Ref:
        p = self.literal(kwargs.get("p", args[1] if len(args) > 1 else Const(0.5)))
        training = self.literal(kwargs.get("training", args[2] if len(args) > 2 else Const(True)))
        if training and p > 0:
            return self.random_draw(node, "dropout", [args[0]], {"p": float(p)})
        return self.emit_ew("identity", [args[0]], [], node.name, node.name)

    def fn_randn_like(self, node: TracedNode, args: list[Any], kwargs: dict[str, Any]) -> Ref:
        return self.random_draw(node, "randn_like", [args[0]], {})

    def fn_rand_like(self, node: TracedNode, args: list[Any], kwargs: dict[str, Any]) -> Ref:
        return self.random_draw(node, "rand_like", [args[0]], {})

    def random_draw(self, node: TracedNode, fn: str, args: list[Any], attrs: dict[str, Any]) -> Ref:
        """Dropout in training mode or a tensor of random numbers: the ATen call torch makes for it, on
        torch's generator, in the reference's order (ir.RANDOM), so the program draws what the reference
        draws when both start from one seed. The numbers come from torch; the work around them is ours."""
        meta = self.meta_value(self.own_id(node), node.meta)
        if meta.kind != "tensor" or meta.dtype != "float32":
            raise Unsupported(f"{node.name}: {fn} of dtype {meta.dtype} (float32 draws are lowered)")
        for a in args:
            if self.g.values[a.id].dtype != "float32":
                raise Unsupported(f"{node.name}: {fn} of a {self.g.values[a.id].dtype} tensor")
        attrs = dict(attrs, size=list(meta.shape))
        self.g.add_value(Value(meta.id, "tensor", meta.shape, contiguous_strides(meta.shape), "float32"))
        self.g.add_op(Op(RANDOM, fn, meta.id, list(args), attrs, origin=node.name))
        return Ref(meta.id)

    def _identity(self, node: TracedNode, args: list[Any], kwargs: dict[str, Any]) -> Ref:
        return self.emit_ew("identity", [args[0]], [], node.name, node.name)

    fn_contiguous = _identity
    fn_clone = _identity
    fn_detach = _identity

    def fn_to(self, node: TracedNode, args: list[Any], kwargs: dict[str, Any]) -> Ref:
        for a in [*args[1:], *kwargs.values()]:
            if isinstance(a, tuple) and a[0] == "dtype" and a[1] not in FLOAT_DTYPES:
                raise Unsupported(f"{node.name}: conversion to {a[1]}")
        return self._identity(node, args, kwargs)

    def fn_float(self, node: TracedNode, args: list[Any], kwargs: dict[str, Any]) -> Ref:
        return self._identity(node, args, kwargs)

    def fn_type_as(self, node: TracedNode, args: list[Any], kwargs: dict[str, Any]) -> Ref:
        return self._identity(node, args, kwargs)

    def fn_max(self, node: TracedNode, args: list[Any], kwargs: dict[str, Any]) -> Ref | None:
        return self._max_min(node, "max", args, kwargs)

    def fn_min(self, node: TracedNode, args: list[Any], kwargs: dict[str, Any]) -> Ref | None:
        return self._max_min(node, "min", args, kwargs)

    def _max_min(self, node: TracedNode, which: str, args: list[Any], kwargs: dict[str, Any]) -> Ref | None:
        other = args[1] if len(args) > 1 else kwargs.get("dim", kwargs.get("other"))
        if other is not None and self.is_tensor(other):
            fn = "maximum" if which == "max" else "minimum"
            return self.emit_ew(fn, [args[0], other], [], node.name, node.name)
        x = args[0]
        rank = len(self.shape_of(x))
        if other is None:
            return self.reduce(
                "amax" if which == "max" else "amin", x, norm_dims(None, rank), False, node.name
            )
        dim = self.literal(other)
        keepdim = bool(self.literal(kwargs.get("keepdim", args[2] if len(args) > 2 else Const(False))))
        dims = norm_dims(dim, rank)
        values = self.reduce("amax" if which == "max" else "amin", x, dims, keepdim, node.name)
        indices = self.reduce("argmax" if which == "max" else "argmin", x, dims, keepdim, node.name)
        self.g.add_value(Value(node.name, "list", const=[values.id, indices.id]))
        self.g.add_op(Op(HOST, "tuple", node.name, [values, indices], origin=node.name))
        return None

    def fn_maximum(self, node: TracedNode, args: list[Any], kwargs: dict[str, Any]) -> Ref:
        return self.emit_ew("maximum", [args[0], args[1]], [], node.name, node.name)

    def fn_minimum(self, node: TracedNode, args: list[Any], kwargs: dict[str, Any]) -> Ref:
        return self.emit_ew("minimum", [args[0], args[1]], [], node.name, node.name)

    def fn_where(self, node: TracedNode, args: list[Any], kwargs: dict[str, Any]) -> Ref:
        if len(args) < 3:
            raise Unsupported(f"{node.name}: where with one argument")
        return self.emit_ew(
            "where", [args[0], self.scalar(args[1]), self.scalar(args[2])], [], node.name, node.name
        )

    def fn_masked_fill(self, node: TracedNode, args: list[Any], kwargs: dict[str, Any]) -> Ref:
        """x.masked_fill(mask, value): where(mask, value, x), the mask broadcast to x's shape."""
        got = dict(zip(["input", "mask", "value"], args, strict=False)) | kwargs
        mask = got["mask"]
        if not self.is_tensor(mask) or self.g.values[mask.id].dtype != "bool":
            raise Unsupported(f"{node.name}: masked_fill with a mask that is not a bool tensor")
        return self.emit_ew(
            "where", [mask, self.scalar(got["value"]), got["input"]], [], node.name, node.name
        )

    # Reductions.
    def _reduce_args(self, args: list[Any], kwargs: dict[str, Any]) -> tuple[Ref, tuple[int, ...], bool]:
        x = args[0]
        rank = len(self.shape_of(x))
        dim = kwargs.get("dim", args[1] if len(args) > 1 else None)
        keepdim = kwargs.get("keepdim", args[2] if len(args) > 2 else Const(False))
        for key in ("dtype",):
            value = kwargs.get(key)
            if isinstance(value, tuple) and value[1] not in FLOAT_DTYPES:
                raise Unsupported(f"reduction to dtype {value[1]}")
        return x, norm_dims(self.literal(dim) if dim is not None else None, rank), bool(self.literal(keepdim))

    def fn_sum(self, node: TracedNode, args: list[Any], kwargs: dict[str, Any]) -> Ref:
        x, dims, keep = self._reduce_args(args, kwargs)
        return self.reduce("sum", x, dims, keep, node.name, node.name)

    def fn_mean(self, node: TracedNode, args: list[Any], kwargs: dict[str, Any]) -> Ref:
        x, dims, keep = self._reduce_args(args, kwargs)
        return self.reduce("mean", x, dims, keep, node.name, node.name)

    def fn_prod(self, node: TracedNode, args: list[Any], kwargs: dict[str, Any]) -> Ref:
        x, dims, keep = self._reduce_args(args, kwargs)
        return self.reduce("prod", x, dims, keep, node.name, node.name)

    def fn_amax(self, node: TracedNode, args: list[Any], kwargs: dict[str, Any]) -> Ref:
        x, dims, keep = self._reduce_args(args, kwargs)
        return self.reduce("amax", x, dims, keep, node.name, node.name)

    def fn_amin(self, node: TracedNode, args: list[Any], kwargs: dict[str, Any]) -> Ref:
        x, dims, keep = self._reduce_args(args, kwargs)
        return self.reduce("amin", x, dims, keep, node.name, node.name)

    def fn_argmax(self, node: TracedNode, args: list[Any], kwargs: dict[str, Any]) -> Ref:
        return self._arg_reduce(node, "argmax", args, kwargs)

    def fn_argmin(self, node: TracedNode, args: list[Any], kwargs: dict[str, Any]) -> Ref:
        return self._arg_reduce(node, "argmin", args, kwargs)

    def _arg_reduce(self, node: TracedNode, fn: str, args: list[Any], kwargs: dict[str, Any]) -> Ref:
        x = args[0]
        dim = kwargs.get("dim", args[1] if len(args) > 1 else None)
        keep = bool(self.literal(kwargs.get("keepdim", args[2] if len(args) > 2 else Const(False))))
        if dim is None:
            # argmax over the flattened tensor: a view to 1-D, then a reduction over dim 0.
            flat = self.view_op("reshape", x, {"shape": [-1]}, (self.g.values[x.id].numel,), node.name)
            return self.reduce(fn, flat, (0,), keep and False, node.name, node.name)
        dims = norm_dims(self.literal(dim), len(self.shape_of(x)))
        return self.reduce(fn, x, dims, keep, node.name, node.name)

    def _var(self, node: TracedNode, args: list[Any], kwargs: dict[str, Any]) -> tuple[Ref, tuple[int, ...]]:
        x = args[0]
        rank = len(self.shape_of(x))
        dim = kwargs.get("dim", args[1] if len(args) > 1 and not isinstance(args[1], Const) else None)
        if len(args) > 1 and isinstance(args[1], Const) and isinstance(args[1].value, bool):
            unbiased = args[1].value
            dim = kwargs.get("dim")
        else:
            unbiased = bool(self.literal(kwargs.get("unbiased", Const(True))))
        correction = kwargs.get("correction")
        corr = float(self.literal(correction)) if correction is not None else (1.0 if unbiased else 0.0)
        keep = bool(self.literal(kwargs.get("keepdim", Const(False))))
        dims = norm_dims(self.literal(dim) if dim is not None else None, rank)
        shape = self.shape_of(x)
        count = math.prod(shape[d] for d in dims)
        mean = self.reduce("mean", x, dims, True, node.name)
        d = self.emit_ew("sub", [x, mean], [], node.name)
        sq = self.emit_ew("mul", [d, d], [], node.name)
        total = self.reduce("sum", sq, dims, keep, node.name)
        n = self.count_expr(x, dims, node.name, count)
        denom = self.host_binary("sub", n, Const(corr), node.name, float(count) - corr)
        return self.emit_ew("div", [total, denom], [], node.name), dims

    def count_expr(self, x: Ref, dims: tuple[int, ...], origin: str, traced: int) -> Ref:
        ident = self.fresh(origin)
        self.g.add_value(Value(ident, "int", const=traced))
        self.g.add_op(Op(HOST, "count", ident, [x], {"dims": list(dims)}, origin=origin))
        return Ref(ident)

    def host_int(self, fn: str, args: list[Any], traced: int, origin: str) -> Ref:
        ident = self.fresh(origin)
        self.g.add_value(Value(ident, "int", const=traced))
        self.g.add_op(Op(HOST, fn, ident, args, origin=origin))
        return Ref(ident)

    def host_binary(self, fn: str, a: Any, b: Any, origin: str, traced: float) -> Ref:
        ident = self.fresh(origin)
        self.g.add_value(Value(ident, "float", const=traced))
        self.g.add_op(Op(HOST, fn, ident, [a, b], origin=origin))
        return Ref(ident)

    def fn_var(self, node: TracedNode, args: list[Any], kwargs: dict[str, Any]) -> Ref:
        return self._var(node, args, kwargs)[0]

    def fn_std(self, node: TracedNode, args: list[Any], kwargs: dict[str, Any]) -> Ref:
        var, _ = self._var(node, args, kwargs)
        return self.emit_ew("sqrt", [var], [], node.name)

    def fn_logsumexp(self, node: TracedNode, args: list[Any], kwargs: dict[str, Any]) -> Ref:
        x, dims, keep = self._reduce_args(args, kwargs)
        return self.logsumexp(x, dims, keep, node)

    def logsumexp(self, x: Ref, dims: tuple[int, ...], keep: bool, node: TracedNode) -> Ref:
        m = self.reduce("amax", x, dims, True, node.name)
        # A row of -inf keeps its max out of the subtraction (as torch does).
        safe = self.emit_ew(
            "where", [self.emit_ew("isinf", [m], [], node.name), Const(0.0), m], [], node.name
        )
        e = self.emit_ew("exp", [self.emit_ew("sub", [x, safe], [], node.name)], [], node.name)
        s = self.reduce("sum", e, dims, keep, node.name)
        safe_k = (
            safe
            if keep
            else self.view_op("squeeze_dims", safe, {"dims": list(dims)}, self.shape_of(s), node.name)
        )
        return self.emit_ew("add", [self.emit_ew("log", [s], [], node.name), safe_k], [], node.name)

    def fn_norm(self, node: TracedNode, args: list[Any], kwargs: dict[str, Any]) -> Ref:
        p = self.literal(kwargs.get("p", args[1] if len(args) > 1 else Const(2.0)))
        if p not in (2, 2.0, "fro", None):
            raise Unsupported(f"{node.name}: norm with p={p}")
        x = args[0]
        dim = kwargs.get("dim", args[2] if len(args) > 2 else None)
        keep = bool(self.literal(kwargs.get("keepdim", args[3] if len(args) > 3 else Const(False))))
        dims = norm_dims(self.literal(dim) if dim is not None else None, len(self.shape_of(x)))
        s = self.reduce("sum", self.emit_ew("mul", [x, x], [], node.name), dims, keep, node.name)
        return self.emit_ew("sqrt", [s], [], node.name)

    def fn_softmax(self, node: TracedNode, args: list[Any], kwargs: dict[str, Any]) -> Ref:
        return self._softmax(node, args, kwargs, log=False)

    def fn_log_softmax(self, node: TracedNode, args: list[Any], kwargs: dict[str, Any]) -> Ref:
        return self._softmax(node, args, kwargs, log=True)

    def _softmax(self, node: TracedNode, args: list[Any], kwargs: dict[str, Any], *, log: bool) -> Ref:
        x = args[0]
        dim = kwargs.get("dim", args[1] if len(args) > 1 else None)
        if dim is None:
            raise Unsupported(f"{node.name}: softmax without an explicit dim")
        return self.softmax_of(x, self.literal(dim), node.name, log=log)

    def softmax_of(self, x: Ref, dim: int, origin: str, *, log: bool) -> Ref:
        dims = norm_dims(dim, len(self.shape_of(x)))
        m = self.reduce("amax", x, dims, True, origin)
        shifted = self.emit_ew("sub", [x, m], [], origin)
        e = self.emit_ew("exp", [shifted], [], origin)
        s = self.reduce("sum", e, dims, True, origin)
        if log:
            return self.emit_ew("sub", [shifted, self.emit_ew("log", [s], [], origin)], [], origin)
        return self.emit_ew("div", [e, s], [], origin)

    # Scans, flips and triangles: host-side steps calling the synthesizer's own kernels (scans.py).
    def ordered(
        self, kind: str, fn: str, x: Any, attrs: dict[str, Any], node: TracedNode, out: str | None = None
    ) -> Ref:
        v = self.value(x)
        if v is None or v.kind != "tensor" or v.dtype not in FLOAT_DTYPES:
            raise Unsupported(f"{node.name}: {fn} of a {v.dtype if v else 'non'}-tensor")
        ident = out or self.own_id(node)
        self.g.add_value(Value(ident, "tensor", v.shape, contiguous_strides(v.shape)))
        self.g.add_op(Op(kind, fn, ident, [x], attrs, origin=node.name))
        return Ref(ident)

    def fn_cumsum(self, node: TracedNode, args: list[Any], kwargs: dict[str, Any]) -> Ref:
        return self._scan(node, "sum", args, kwargs)

    def fn_cumprod(self, node: TracedNode, args: list[Any], kwargs: dict[str, Any]) -> Ref:
        return self._scan(node, "prod", args, kwargs)

    def _scan(self, node: TracedNode, fn: str, args: list[Any], kwargs: dict[str, Any]) -> Ref:
        dim = kwargs.get("dim", args[1] if len(args) > 1 else None)
        dtype = kwargs.get("dtype", args[2] if len(args) > 2 else None)
        if dim is None:
            raise Unsupported(f"{node.name}: scan without a dim")
        if isinstance(dtype, tuple) and dtype[1] not in FLOAT_DTYPES:
            raise Unsupported(f"{node.name}: scan to dtype {dtype[1]}")
        (d,) = norm_dims(int(self.literal(dim)), max(len(self.shape_of(args[0])), 1))
        attrs = {"dim": d, "reverse": False, "exclusive": False}
        return self.ordered(SCAN, fn, args[0], attrs, node)

    def fn_flip(self, node: TracedNode, args: list[Any], kwargs: dict[str, Any]) -> Ref:
        dims = kwargs.get("dims", args[1] if len(args) == 2 else args[1:])
        literal = self.literal(dims)
        listed = literal if isinstance(literal, list) else [literal]
        shape = self.shape_of(args[0])
        # Dims of size 1 read the same either way (and no dims at all is a copy).
        flipped = [d for d in norm_dims(listed, len(shape)) if shape[d] > 1] if listed else []
        return self.ordered(FLIP, "flip", args[0], {"dims": flipped}, node)

    def fn_triu(self, node: TracedNode, args: list[Any], kwargs: dict[str, Any]) -> Ref:
        return self._triangle(node, "triu", args, kwargs)

    def fn_tril(self, node: TracedNode, args: list[Any], kwargs: dict[str, Any]) -> Ref:
        return self._triangle(node, "tril", args, kwargs)

    def _triangle(self, node: TracedNode, fn: str, args: list[Any], kwargs: dict[str, Any]) -> Ref:
        diagonal = int(self.literal(kwargs.get("diagonal", args[1] if len(args) > 1 else Const(0))))
        if len(self.shape_of(args[0])) < 2:
            raise Unsupported(f"{node.name}: {fn} of a tensor with fewer than 2 dims")
        if self.g.values[args[0].id].dtype == "bool":
            # A triangular mask: the float kernel over 0/1, read back as a mask.
            as_float = self.emit_ew("where", [args[0], Const(1.0), Const(0.0)], [], node.name)
            kept = self.ordered(TRI, fn, as_float, {"diagonal": diagonal}, node, out=self.fresh(node.name))
            return self.emit_ew("ne", [kept, Const(0.0)], [], node.name, node.name)
        return self.ordered(TRI, fn, args[0], {"diagonal": diagonal}, node)

    # Norms.
    def layer_norm(
        self, x: Ref, ndims: int, weight: Ref | None, bias: Ref | None, eps: Arg, origin: str
    ) -> Ref:
        rank = len(self.shape_of(x))
        dims = tuple(range(rank - ndims, rank))
        mean = self.reduce("mean", x, dims, True, origin)
        d = self.emit_ew("sub", [x, mean], [], origin)
        var = self.reduce("mean", self.emit_ew("mul", [d, d], [], origin), dims, True, origin)
        rstd = self.emit_ew("rsqrt", [self.emit_ew("add", [var, eps], [], origin)], [], origin)
        y = self.emit_ew("mul", [d, rstd], [], origin)
        if weight is not None:
            y = self.emit_ew("mul", [y, weight], [], origin)
        if bias is not None:
            y = self.emit_ew("add", [y, bias], [], origin)
        return y

    def rms_norm(self, x: Ref, ndims: int, weight: Ref | None, eps: Arg, origin: str) -> Ref:
        rank = len(self.shape_of(x))
        dims = tuple(range(rank - ndims, rank))
        ms = self.reduce("mean", self.emit_ew("mul", [x, x], [], origin), dims, True, origin)
        rstd = self.emit_ew("rsqrt", [self.emit_ew("add", [ms, eps], [], origin)], [], origin)
        y = self.emit_ew("mul", [x, rstd], [], origin)
        return self.emit_ew("mul", [y, weight], [], origin) if weight is not None else y

    def channel_view(self, p: Ref | None, rank: int, origin: str) -> Ref | None:
        """A per-channel [C] parameter viewed as [C, 1, ...] to broadcast over (N, C, *spatial)."""
        if p is None:
            return None
        c = self.shape_of(p)[0]
        shape = (c,) + (1,) * (rank - 2)
        # -1, never the traced size: the program must run at any channel count.
        return self.view_op("reshape", p, {"shape": [-1] + [1] * (rank - 2)}, shape, origin)

    def channel_affine(self, y: Ref, weight: Ref | None, bias: Ref | None, rank: int, origin: str) -> Ref:
        """y * weight + bias with per-channel [C] parameters (either may be absent)."""
        w = self.channel_view(weight, rank, origin)
        b = self.channel_view(bias, rank, origin)
        if w is not None:
            y = self.emit_ew("mul", [y, w], [], origin)
        if b is not None:
            y = self.emit_ew("add", [y, b], [], origin)
        return y

    def batch_norm_eval(
        self, x: Ref, mean: Ref, var: Ref, weight: Ref | None, bias: Ref | None, eps: Arg, origin: str
    ) -> Ref:
        rank = len(self.shape_of(x))
        mean_v = self.channel_view(mean, rank, origin)
        var_v = self.channel_view(var, rank, origin)
        assert mean_v is not None and var_v is not None
        rstd = self.emit_ew("rsqrt", [self.emit_ew("add", [var_v, eps], [], origin)], [], origin)
        y = self.emit_ew("mul", [self.emit_ew("sub", [x, mean_v], [], origin), rstd], [], origin)
        y = self.channel_affine(y, weight, bias, rank, origin)
        return y

    def batch_mean(self, x: Ref, origin: str) -> Ref:
        """Per-channel mean over (N, *spatial), kept as [1, C, 1, ...].

        In two steps: over the trailing spatial dims (contiguous rows, one row reduction per (n, c)), then
        over the batch of those partial means (N x C values). One reduction over (0, 2, ...) would be a
        strided walk of every channel's whole slice by one thread.
        """
        rank = len(self.shape_of(x))
        if rank == 2:
            return self.reduce("mean", x, (0,), True, origin)
        per_sample = self.reduce("mean", x, tuple(range(2, rank)), True, origin)
        return self.reduce("mean", per_sample, (0,), True, origin)

    def batch_norm_train(
        self,
        x: Ref,
        running_mean: Ref | None,
        running_var: Ref | None,
        weight: Ref | None,
        bias: Ref | None,
        momentum: Arg | None,
        eps: Arg,
        origin: str,
    ) -> Ref:
        """Normalizes with the batch's statistics and, as torch does, updates the running statistics in place.

        The running mean takes the batch mean and the running variance the unbiased batch variance, each
        blended by `momentum`; the update is written into the model's buffers by the kernel that computes
        it (graph.writebacks). num_batches_tracked is not advanced: only momentum=None reads it, and that
        is refused here.
        """
        shape = self.shape_of(x)
        rank = len(shape)
        if rank < 2:
            raise Unsupported(f"{origin}: batch norm of a rank-{rank} tensor")
        dims = (0, *range(2, rank))
        count = math.prod(shape[d] for d in dims)
        mean = self.batch_mean(x, origin)
        d = self.emit_ew("sub", [x, mean], [], origin)
        var = self.batch_mean(self.emit_ew("mul", [d, d], [], origin), origin)
        rstd = self.emit_ew("rsqrt", [self.emit_ew("add", [var, eps], [], origin)], [], origin)
        y = self.emit_ew("mul", [d, rstd], [], origin)
        y = self.channel_affine(y, weight, bias, rank, origin)
        if running_mean is None or running_var is None:
            return y
        if momentum is None or (isinstance(momentum, Const) and momentum.value is None):
            raise Unsupported(f"{origin}: batch norm with momentum=None (a cumulative average)")
        if count < 2:
            raise Unsupported(f"{origin}: batch norm over one value per channel")
        c = shape[1]
        mean_c = self.view_op("reshape", mean, {"shape": [-1]}, (c,), origin)
        var_c = self.view_op("reshape", var, {"shape": [-1]}, (c,), origin)
        n = self.count_expr(x, dims, origin, count)
        n_minus_1 = self.host_binary("sub", n, Const(1), origin, float(count - 1))
        correction = self.host_binary("truediv", n, n_minus_1, origin, count / (count - 1))
        unbiased = self.emit_ew("mul", [var_c, correction], [], origin)
        for buffer, batch in ((running_mean, mean_c), (running_var, unbiased)):
            # running + momentum * (batch - running): torch's (1 - m) * running + m * batch.
            step = self.emit_ew(
                "mul", [self.emit_ew("sub", [batch, buffer], [], origin), momentum], [], origin
            )
            new = self.emit_ew("add", [buffer, step], [], origin)
            self.g.writebacks[new.id] = buffer.id
        return y

    def instance_norm(self, x: Ref, weight: Ref | None, bias: Ref | None, eps: Arg, origin: str) -> Ref:
        rank = len(self.shape_of(x))
        dims = tuple(range(2, rank))
        mean = self.reduce("mean", x, dims, True, origin)
        d = self.emit_ew("sub", [x, mean], [], origin)
        var = self.reduce("mean", self.emit_ew("mul", [d, d], [], origin), dims, True, origin)
        rstd = self.emit_ew("rsqrt", [self.emit_ew("add", [var, eps], [], origin)], [], origin)
        y = self.emit_ew("mul", [d, rstd], [], origin)
        y = self.channel_affine(y, weight, bias, rank, origin)
        return y

    def group_norm(
        self, x: Ref, groups: int, weight: Ref | None, bias: Ref | None, eps: Arg, origin: str
    ) -> Ref:
        shape = self.shape_of(x)
        n, c = shape[0], shape[1]
        if c % groups:
            raise Unsupported(f"{origin}: {c} channels do not split into {groups} groups")
        rest = math.prod(shape[2:])
        gshape = (n, groups, c // groups, rest)
        n_dim = self.host_int("size", [x, Const(0)], shape[0], origin)
        c_dim = self.host_int("size", [x, Const(1)], c, origin)
        per_group = self.host_int("floordiv", [c_dim, Const(groups)], c // groups, origin)
        xv = self.view_op(
            "reshape", x, {"shape": [n_dim, Const(groups), per_group, Const(-1)]}, gshape, origin
        )
        mean = self.reduce("mean", xv, (2, 3), True, origin)
        d = self.emit_ew("sub", [xv, mean], [], origin)
        var = self.reduce("mean", self.emit_ew("mul", [d, d], [], origin), (2, 3), True, origin)
        rstd = self.emit_ew("rsqrt", [self.emit_ew("add", [var, eps], [], origin)], [], origin)
        y = self.emit_ew("mul", [d, rstd], [], origin)
        if weight is not None:
            wv = self.view_op("reshape", weight, {"shape": [groups, -1, 1]}, (groups, c // groups, 1), origin)
            y = self.emit_ew("mul", [y, wv], [], origin)
        if bias is not None:
            bv = self.view_op("reshape", bias, {"shape": [groups, -1, 1]}, (groups, c // groups, 1), origin)
            y = self.emit_ew("add", [y, bv], [], origin)
        return self.view_op("reshape_like", y, {"like": x}, shape, origin)

    def fn_layer_norm(self, node: TracedNode, args: list[Any], kwargs: dict[str, Any]) -> Ref:
        shape = self.literal(kwargs.get("normalized_shape", args[1]))
        ndims = len(shape) if isinstance(shape, list) else 1
        weight = kwargs.get("weight", args[2] if len(args) > 2 else None)
        bias = kwargs.get("bias", args[3] if len(args) > 3 else None)
        eps = self.scalar(kwargs.get("eps", args[4] if len(args) > 4 else None), 1e-5)
        return self.layer_norm(args[0], ndims, weight, bias, eps, node.name)

    def fn_rms_norm(self, node: TracedNode, args: list[Any], kwargs: dict[str, Any]) -> Ref:
        shape = self.literal(kwargs.get("normalized_shape", args[1]))
        ndims = len(shape) if isinstance(shape, list) else 1
        weight = kwargs.get("weight", args[2] if len(args) > 2 else None)
        eps_raw = kwargs.get("eps", args[3] if len(args) > 3 else None)
        eps = self.scalar(eps_raw) if eps_raw is not None and self.literal(eps_raw) is not None else None
        return self.rms_norm(args[0], ndims, weight, eps or Const(1.1920928955078125e-07), node.name)

    def fn_group_norm(self, node: TracedNode, args: list[Any], kwargs: dict[str, Any]) -> Ref:
        groups = int(self.literal(kwargs.get("num_groups", args[1])))
        weight = kwargs.get("weight", args[2] if len(args) > 2 else None)
        bias = kwargs.get("bias", args[3] if len(args) > 3 else None)
        eps = self.scalar(kwargs.get("eps", args[4] if len(args) > 4 else None), 1e-5)
        return self.group_norm(args[0], groups, weight, bias, eps, node.name)

    def fn_batch_norm(self, node: TracedNode, args: list[Any], kwargs: dict[str, Any]) -> Ref:
        names = ["input", "running_mean", "running_var", "weight", "bias", "training", "momentum", "eps"]
        got = dict(zip(names, args, strict=False)) | kwargs
        eps = self.scalar(got.get("eps"), 1e-5)
        mean, var = got.get("running_mean"), got.get("running_var")
        if self.literal(got.get("training", Const(False))):
            momentum = self.scalar(got.get("momentum"), 0.1)
            return self.batch_norm_train(
                got["input"], mean, var, got.get("weight"), got.get("bias"), momentum, eps, node.name
            )
        if mean is None or var is None:
            raise Unsupported(f"{node.name}: batch_norm without running statistics")
        return self.batch_norm_eval(
            got["input"], mean, var, got.get("weight"), got.get("bias"), eps, node.name
        )

    def fn_instance_norm(self, node: TracedNode, args: list[Any], kwargs: dict[str, Any]) -> Ref:
        names = [
            "input",
            "running_mean",
            "running_var",
            "weight",
            "bias",
            "use_input_stats",
            "momentum",
            "eps",
        ]
        got = dict(zip(names, args, strict=False)) | kwargs
        if got.get("running_mean") is not None or not self.literal(got.get("use_input_stats", Const(True))):
            raise Unsupported(f"{node.name}: instance_norm with running statistics")
        eps = self.scalar(got.get("eps"), 1e-5)
        return self.instance_norm(got["input"], got.get("weight"), got.get("bias"), eps, node.name)

    def fn_normalize(self, node: TracedNode, args: list[Any], kwargs: dict[str, Any]) -> Ref:
        p = self.literal(kwargs.get("p", args[1] if len(args) > 1 else Const(2.0)))
        if p != 2:
            raise Unsupported(f"{node.name}: normalize with p={p}")
        dim = self.literal(kwargs.get("dim", args[2] if len(args) > 2 else Const(1)))
        eps = self.scalar(kwargs.get("eps", args[3] if len(args) > 3 else None), 1e-12)
        x = args[0]
        dims = norm_dims(dim, len(self.shape_of(x)))
        ss = self.reduce("sum", self.emit_ew("mul", [x, x], [], node.name), dims, True, node.name)
        nrm = self.emit_ew("clamp_min", [self.emit_ew("sqrt", [ss], [], node.name), eps], [], node.name)
        return self.emit_ew("div", [x, nrm], [], node.name)

    # Losses (elementwise terms, then the reduction the call names).
    def loss_reduction(self, loss: Ref, reduction: Any, origin: str, batch_of: Ref | None = None) -> Ref:
        mode = self.literal(reduction) if reduction is not None else "mean"
        rank = len(self.shape_of(loss))
        if mode == "none":
            return loss
        if mode == "sum":
            return self.reduce("sum", loss, norm_dims(None, rank), False, origin)
        if mode == "mean":
            return self.reduce("mean", loss, norm_dims(None, rank), False, origin)
        if mode == "batchmean" and batch_of is not None:
            total = self.reduce("sum", loss, norm_dims(None, rank), False, origin)
            shape = self.shape_of(batch_of)
            batch = self.host_int("size", [batch_of, Const(0)], shape[0] if shape else 1, origin)
            return self.emit_ew("div", [total, batch], [], origin)
        raise Unsupported(f"{origin}: loss reduction {mode!r}")

    def fn_cross_entropy(self, node: TracedNode, args: list[Any], kwargs: dict[str, Any]) -> Ref:
        """F.cross_entropy with class-index targets (int64) or class probabilities (float), classes along
        dim 1: logsumexp over the classes minus the target's logit, picked by comparing the index with
        the class number (a scan of ones), label smoothing and ignore_index as torch defines them."""
        names = ["input", "target", "weight", "size_average", "ignore_index", "reduce", "reduction"]
        got = dict(zip([*names, "label_smoothing"], args, strict=False)) | kwargs
        self.legacy_reduction(node, got)
        x, target = got["input"], got["target"]
        if got.get("weight") is not None:
            raise Unsupported(f"{node.name}: cross_entropy with class weights")
        shape = self.shape_of(x)
        if len(shape) < 2:
            raise Unsupported(f"{node.name}: cross_entropy of an input without a batch dim")
        classes = shape[1]
        smoothing = float(self.literal(got.get("label_smoothing", Const(0.0))))
        lse = self.logsumexp(x, (1,), False, node)
        t = self.g.values[target.id]
        if t.dtype in FLOAT_DTYPES:  # class probabilities: -sum_c t_c log_softmax(x)_c, smoothed
            if smoothing:
                target = self.emit_ew(
                    "add", [self.emit_ew("mul", [target, Const(1.0 - smoothing)], [], node.name),
                            Const(smoothing / classes)], [], node.name,
                )  # fmt: skip
            lsm = self.emit_ew("sub", [x, self.unsqueeze(lse, 1, node.name)], [], node.name)
            picked = self.reduce(
                "sum", self.emit_ew("mul", [target, lsm], [], node.name), (1,), False, node.name
            )
            loss = self.emit_ew("neg", [picked], [], node.name)
            return self.loss_reduction(loss, got.get("reduction"), node.name)
        if t.dtype != "int64":
            raise Unsupported(f"{node.name}: cross_entropy targets of dtype {t.dtype}")
        if classes >= 1 << 24:
            raise Unsupported(f"{node.name}: {classes} classes (class numbers exact in float32 up to 2^24)")
        ignore = int(self.literal(got.get("ignore_index", Const(-100))))
        # The class number of each position along dim 1: a running sum of ones, minus one.
        ones = self.emit_ew("identity", [Const(1.0)], [], node.name)
        ones = self.view_op("expand", ones, {"args": [Const(classes)], "kwargs": {}}, (classes,), node.name)
        count = self.ordered(SCAN, "sum", ones, {"dim": 0, "reverse": False, "exclusive": False}, node,
                             out=self.fresh(node.name))  # fmt: skip
        number = self.emit_ew("sub", [count, Const(1.0)], [], node.name)
        column = (classes, *(1,) * (len(shape) - 2))
        number = self.view_op("reshape", number, {"shape": list(column)}, column, node.name)
        hit = self.emit_ew(
            "eq", [self.unsqueeze(target, 1, node.name), number], [], node.name, small_ints=True
        )
        logit = self.reduce(
            "sum", self.emit_ew("where", [hit, x, Const(0.0)], [], node.name), (1,), False, node.name
        )
        loss = self.emit_ew("sub", [lse, logit], [], node.name)
        if smoothing:
            mean = self.reduce("mean", x, (1,), False, node.name)
            smooth = self.emit_ew("sub", [lse, mean], [], node.name)
            loss = self.emit_ew(
                "add", [self.emit_ew("mul", [loss, Const(1.0 - smoothing)], [], node.name),
                        self.emit_ew("mul", [smooth, Const(smoothing)], [], node.name)], [], node.name,
            )  # fmt: skip
        kept = self.emit_ew("ne", [target, Const(ignore)], [], node.name, small_ints=True)
        loss = self.emit_ew("where", [kept, loss, Const(0.0)], [], node.name)
        mode = self.literal(got["reduction"]) if got.get("reduction") is not None else "mean"
        if mode == "mean":  # over the targets not ignored
            rank = len(self.shape_of(loss))
            counted = self.emit_ew("where", [kept, Const(1.0), Const(0.0)], [], node.name)
            total = self.reduce("sum", loss, norm_dims(None, rank), False, node.name)
            return self.emit_ew(
                "div", [total, self.reduce("sum", counted, norm_dims(None, rank), False, node.name)], [],
                node.name,
            )  # fmt: skip
        return self.loss_reduction(loss, got.get("reduction"), node.name)

    def unsqueeze(self, x: Ref, dim: int, origin: str) -> Ref:
        shape = self.shape_of(x)
        out = (*shape[:dim], 1, *shape[dim:])
        return self.view_op("reshape", x, {"shape": list(out)}, out, origin)

    def fn_smooth_l1_loss(self, node: TracedNode, args: list[Any], kwargs: dict[str, Any]) -> Ref:
        names = ["input", "target", "size_average", "reduce", "reduction", "beta"]
        got = dict(zip(names, args, strict=False)) | kwargs
        self.legacy_reduction(node, got)
        beta = float(self.literal(got.get("beta", Const(1.0))))
        d = self.emit_ew("sub", [got["input"], got["target"]], [], node.name)
        a = self.emit_ew("abs", [d], [], node.name)
        if beta == 0.0:
            return self.loss_reduction(a, got.get("reduction"), node.name)
        quad = self.emit_ew(
            "mul", [self.emit_ew("mul", [d, d], [], node.name), Const(0.5 / beta)], [], node.name
        )
        lin = self.emit_ew("sub", [a, Const(0.5 * beta)], [], node.name)
        near = self.emit_ew("lt", [a, Const(beta)], [], node.name)
        loss = self.emit_ew("where", [near, quad, lin], [], node.name)
        return self.loss_reduction(loss, got.get("reduction"), node.name)

    def fn_huber_loss(self, node: TracedNode, args: list[Any], kwargs: dict[str, Any]) -> Ref:
        names = ["input", "target", "reduction", "delta"]
        got = dict(zip(names, args, strict=False)) | kwargs
        delta = float(self.literal(got.get("delta", Const(1.0))))
        d = self.emit_ew("sub", [got["input"], got["target"]], [], node.name)
        a = self.emit_ew("abs", [d], [], node.name)
        quad = self.emit_ew("mul", [self.emit_ew("mul", [d, d], [], node.name), Const(0.5)], [], node.name)
        lin = self.emit_ew(
            "mul", [self.emit_ew("sub", [a, Const(0.5 * delta)], [], node.name), Const(delta)], [], node.name
        )
        near = self.emit_ew("lt", [a, Const(delta)], [], node.name)
        loss = self.emit_ew("where", [near, quad, lin], [], node.name)
        return self.loss_reduction(loss, got.get("reduction"), node.name)

    def fn_kl_div(self, node: TracedNode, args: list[Any], kwargs: dict[str, Any]) -> Ref:
        names = ["input", "target", "size_average", "reduce", "reduction", "log_target"]
        got = dict(zip(names, args, strict=False)) | kwargs
        self.legacy_reduction(node, got)
        x, t = got["input"], got["target"]
        if self.literal(got.get("log_target", Const(False))):
            loss = self.emit_ew(
                "mul",
                [self.emit_ew("exp", [t], [], node.name), self.emit_ew("sub", [t, x], [], node.name)],
                [],
                node.name,
            )
        else:
            # xlogy(t, t) - t * x: a zero target contributes nothing (not 0 * -inf).
            tlogt = self.emit_ew("mul", [t, self.emit_ew("log", [t], [], node.name)], [], node.name)
            zero = self.emit_ew("eq", [t, Const(0.0)], [], node.name)
            xlogy = self.emit_ew("where", [zero, Const(0.0), tlogt], [], node.name)
            loss = self.emit_ew("sub", [xlogy, self.emit_ew("mul", [t, x], [], node.name)], [], node.name)
        return self.loss_reduction(loss, got.get("reduction"), node.name, batch_of=x)

    def legacy_reduction(self, node: TracedNode, got: dict[str, Any]) -> None:
        if got.get("size_average") is not None or got.get("reduce") is not None:
            raise Unsupported(f"{node.name}: the deprecated size_average/reduce arguments")

    def pairwise_distance(self, a: Ref, b: Ref, eps: Arg, origin: str) -> Ref:
        d = self.emit_ew("add", [self.emit_ew("sub", [a, b], [], origin), eps], [], origin)
        rank = len(self.shape_of(d))
        ss = self.reduce("sum", self.emit_ew("mul", [d, d], [], origin), (rank - 1,), False, origin)
        return self.emit_ew("sqrt", [ss], [], origin)

    def triplet_margin_loss(
        self, node: TracedNode, anchor: Ref, positive: Ref, negative: Ref, attrs: dict[str, Any]
    ) -> Ref:
        if float(attrs.get("p", 2.0)) != 2.0 or attrs.get("swap"):
            raise Unsupported(f"{node.name}: triplet margin loss with p != 2 or swap")
        eps, margin = self.mod_attr(node, "eps"), self.mod_attr(node, "margin")
        d_ap = self.pairwise_distance(anchor, positive, eps, node.name)
        d_an = self.pairwise_distance(anchor, negative, eps, node.name)
        gap = self.emit_ew("add", [self.emit_ew("sub", [d_ap, d_an], [], node.name), margin], [], node.name)
        loss = self.emit_ew("clamp_min", [gap, Const(0.0)], [], node.name)
        return self.loss_reduction(loss, attrs.get("reduction", "mean"), node.name)

    # Library calls.
    def lib(self, fn: str, args: list[Any], attrs: dict[str, Any], node: TracedNode) -> Ref:
        meta = self.meta_value(self.own_id(node), node.meta)
        for a in args:
            v = self.value(a)
            if v is not None and v.kind == "tensor" and v.dtype not in FLOAT_DTYPES:
                raise Unsupported(f"{node.name}: {fn} on a {v.dtype} tensor")
        self.g.add_value(meta)
        self.g.add_op(Op(LIB, fn, meta.id, args, attrs, origin=node.name))
        return Ref(meta.id)

    def linear(self, node: TracedNode, x: Ref, w: Ref, b: Ref | None) -> Ref:
        return self.lib("linear", [x, w] + ([b] if b is not None else []), {"bias": b is not None}, node)

    def fn_linear(self, node: TracedNode, args: list[Any], kwargs: dict[str, Any]) -> Ref:
        b = kwargs.get("bias", args[2] if len(args) > 2 else None)
        w = kwargs.get("weight", args[1] if len(args) > 1 else None)
        if not isinstance(w, Ref) or not isinstance(args[0], Ref):
            raise Unsupported(f"{node.name}: linear without tensor operands")
        return self.linear(node, args[0], w, b if isinstance(b, Ref) else None)

    def fn_matmul(self, node: TracedNode, args: list[Any], kwargs: dict[str, Any]) -> Ref:
        return self.lib("matmul", [args[0], args[1]], {}, node)

    def fn_mm(self, node: TracedNode, args: list[Any], kwargs: dict[str, Any]) -> Ref:
        return self.lib("mm", [args[0], args[1]], {}, node)

    def fn_bmm(self, node: TracedNode, args: list[Any], kwargs: dict[str, Any]) -> Ref:
        return self.lib("bmm", [args[0], args[1]], {}, node)

    def fn_addmm(self, node: TracedNode, args: list[Any], kwargs: dict[str, Any]) -> Ref:
        return self._addmm(node, "addmm", args, kwargs)

    def fn_baddbmm(self, node: TracedNode, args: list[Any], kwargs: dict[str, Any]) -> Ref:
        return self._addmm(node, "baddbmm", args, kwargs)

    def _addmm(self, node: TracedNode, fn: str, args: list[Any], kwargs: dict[str, Any]) -> Ref:
        beta = self.literal(kwargs.get("beta", Const(1)))
        alpha = self.literal(kwargs.get("alpha", Const(1)))
        return self.lib(fn, [args[0], args[1], args[2]], {"beta": beta, "alpha": alpha}, node)

    def fn_einsum(self, node: TracedNode, args: list[Any], kwargs: dict[str, Any]) -> Ref:
        equation = args[0]
        operands = args[1] if len(args) == 2 and isinstance(args[1], list) else args[1:]
        if not isinstance(equation, str):
            raise Unsupported(f"{node.name}: einsum equation is not a literal")
        eq = equation.replace(" ", "")
        specs = eq.split("->")[0].split(",")
        if len(operands) <= 2 or "..." in eq or "->" not in eq or len(specs) != len(operands):
            return self.lib("einsum", list(operands), {"equation": equation}, node)
        # Several operands: contracted pairwise, left to right, each step keeping the labels a later
        # operand or the result still needs (a GEMM where labels are summed, a product where none are).
        out = eq.split("->")[1]
        sizes: dict[str, int] = {}
        for spec, x in zip(specs, operands, strict=True):
            shape = self.shape_of(x)
            if len(spec) != len(shape):
                raise Unsupported(f"{node.name}: einsum {equation!r} and its operands' ranks disagree")
            for label, n in zip(spec, shape, strict=True):
                if sizes.setdefault(label, n) != n and n != 1 and sizes[label] != 1:
                    raise Unsupported(f"{node.name}: einsum label {label} has sizes {sizes[label]} and {n}")
                sizes[label] = max(sizes[label], n)
        if not all(isinstance(x, Ref) for x in operands):
            raise Unsupported(f"{node.name}: einsum of an operand that is not a tensor")
        acc: Ref = operands[0]
        acc_spec = specs[0]
        for i in range(1, len(operands)):
            last = i == len(operands) - 1
            needed = set("".join(specs[i + 1 :]) + out)
            labels = dict.fromkeys(label for label in acc_spec + specs[i] if label in needed)
            pair_out = out if last else "".join(labels)
            acc = self.einsum_pair(node, acc, acc_spec, operands[i], specs[i], pair_out, sizes, last)
            acc_spec = pair_out
        return acc

    def einsum_pair(
        self,
        node: TracedNode,
        a: Ref,
        sa: str,
        b: Ref,
        sb: str,
        so: str,
        sizes: dict[str, int],
        last: bool,
    ) -> Ref:
        """One step of a many-operand einsum: `sa,sb->so` as a two-operand einsum (the GEMM form) when a
        label is summed over both, else as a broadcast product of the operands permuted to `so`'s order."""
        if len(set(sa)) != len(sa) or len(set(sb)) != len(sb):
            raise Unsupported(f"{node.name}: einsum with a repeated label (a diagonal)")
        # A label summed within one operand only is summed before the pair is formed.
        alone_a = [d for d, label in enumerate(sa) if label not in sb and label not in so]
        if alone_a:
            a = self.reduce("sum", a, tuple(alone_a), False, node.name)
            sa = "".join(label for label in sa if label in sb or label in so)
        alone_b = [d for d, label in enumerate(sb) if label not in sa and label not in so]
        if alone_b:
            b = self.reduce("sum", b, tuple(alone_b), False, node.name)
            sb = "".join(label for label in sb if label in sa or label in so)
        shape = tuple(sizes[label] for label in so)
        out_id = self.own_id(node) if last else self.fresh(node.name)
        if set(sa) & set(sb) - set(so):
            self.g.add_value(Value(out_id, "tensor", shape, contiguous_strides(shape)))
            self.g.add_op(
                Op(LIB, "einsum", out_id, [a, b], {"equation": f"{sa},{sb}->{so}"}, origin=node.name)
            )
            return Ref(out_id)
        aligned = [self.align_labels(node, x, spec, so) for x, spec in ((a, sa), (b, sb))]
        return self.emit_ew("mul", aligned, [], node.name, out_id)

    def align_labels(self, node: TracedNode, x: Ref, spec: str, so: str) -> Ref:
        """x (labels `spec`) as a view whose dims follow `so`: permuted, with size-1 dims for the labels it
        lacks, so a broadcast product lines up."""
        order = sorted(range(len(spec)), key=lambda d: so.index(spec[d]))
        shape = self.shape_of(x)
        if order != list(range(len(spec))):
            permuted = tuple(shape[d] for d in order)
            x = self.view_op(
                "permute", x, {"args": [Const(d) for d in order], "kwargs": {}}, permuted, node.name
            )
            shape, spec = permuted, "".join(spec[d] for d in order)
        full = tuple(shape[spec.index(label)] if label in spec else 1 for label in so)
        if full != shape:
            x = self.view_op("reshape", x, {"shape": list(full)}, full, node.name)
        return x

    def _conv(self, node: TracedNode, fn: str, x: Ref, w: Ref, b: Ref | None, attrs: dict[str, Any]) -> Ref:
        attrs = dict(attrs, bias=b is not None)
        return self.lib(fn, [x, w] + ([b] if b is not None else []), attrs, node)

    def _conv_fn(self, node: TracedNode, fn: str, args: list[Any], kwargs: dict[str, Any]) -> Ref:
        nd = int(fn[-2])
        names = ["input", "weight", "bias", "stride", "padding", "dilation", "groups"]
        got = dict(zip(names, args, strict=False)) | kwargs

        def tup(v: Any, default: int) -> list[int] | str:
            value = self.literal(v) if v is not None else default
            if isinstance(value, str):
                return value
            return [int(value)] * nd if isinstance(value, int) else [int(x) for x in value]

        attrs = {
            "stride": tup(got.get("stride"), 1),
            "padding": tup(got.get("padding"), 0),
            "dilation": tup(got.get("dilation"), 1),
            "groups": int(self.literal(got.get("groups", Const(1)))),
        }
        return self._conv(node, fn, got["input"], got["weight"], got.get("bias"), attrs)

    def fn_conv1d(self, node: TracedNode, args: list[Any], kwargs: dict[str, Any]) -> Ref:
        return self._conv_fn(node, "conv1d", args, kwargs)

    def fn_conv2d(self, node: TracedNode, args: list[Any], kwargs: dict[str, Any]) -> Ref:
        return self._conv_fn(node, "conv2d", args, kwargs)

    def fn_conv3d(self, node: TracedNode, args: list[Any], kwargs: dict[str, Any]) -> Ref:
        return self._conv_fn(node, "conv3d", args, kwargs)

    # Pooling.
    def pool(self, node: TracedNode, fn: str, x: Ref, attrs: dict[str, Any]) -> Ref:
        meta = self.meta_value(self.own_id(node), node.meta)
        if meta.kind != "tensor":
            raise Unsupported(f"{node.name}: pooling with indices")
        if fn.startswith("adaptive") and all(s == 1 for s in attrs["output_size"]):
            # Global pooling is a reduction over the spatial dims: the row kernels, coalesced and
            # split across blocks, instead of one thread looping over a whole feature map.
            rank = len(self.shape_of(x))
            dims = tuple(range(rank - attrs["nd"], rank))
            return self.reduce("mean" if "avg" in fn else "amax", x, dims, True, node.name)
        self.g.add_value(meta)
        self.g.add_op(Op(POOL, fn, meta.id, [x], attrs, origin=node.name))
        return Ref(meta.id)

    def pool_attrs(self, fn: str, got: dict[str, Any]) -> dict[str, Any]:
        nd = int(fn.split("pool")[1][0])

        def tup(v: Any) -> list[int] | None:
            if v is None:
                return None
            value = self.literal(v)
            if value is None or (isinstance(value, list) and not value):
                return None
            return [int(value)] * nd if isinstance(value, int) else [int(x) for x in value]

        if fn.startswith("adaptive"):
            out = self.literal(got["output_size"])
            sizes = [out] * nd if isinstance(out, int) or out is None else list(out)
            if any(s is None for s in sizes):
                raise Unsupported("adaptive pooling with a None output size")
            if got.get("return_indices") is not None and self.literal(got["return_indices"]):
                raise Unsupported("pooling with indices")
            return {"nd": nd, "output_size": [int(s) for s in sizes if s is not None]}
        kernel = tup(got["kernel_size"])
        assert kernel is not None
        attrs: dict[str, Any] = {
            "nd": nd,
            "kernel": kernel,
            "stride": tup(got.get("stride")) or kernel,
            "padding": tup(got.get("padding")) or [0] * nd,
            "ceil_mode": bool(self.literal(got.get("ceil_mode", Const(False)))),
        }
        if fn.startswith("max"):
            attrs["dilation"] = tup(got.get("dilation")) or [1] * nd
            if self.literal(got.get("return_indices", Const(False))):
                raise Unsupported("max pooling with return_indices")
        else:
            attrs["count_include_pad"] = bool(self.literal(got.get("count_include_pad", Const(True))))
            div = got.get("divisor_override")
            override = self.literal(div) if div is not None else None
            attrs["divisor_override"] = int(override) if override else 0
        return attrs

    def _pool_fn(self, node: TracedNode, fn: str, args: list[Any], kwargs: dict[str, Any]) -> Ref:
        if fn.startswith("adaptive"):
            names = ["input", "output_size", "return_indices"]
        elif fn.startswith("max"):
            names = ["input", "kernel_size", "stride", "padding", "dilation", "ceil_mode", "return_indices"]
        else:
            names = [
                "input",
                "kernel_size",
                "stride",
                "padding",
                "ceil_mode",
                "count_include_pad",
                "divisor_override",
            ]
        got = dict(zip(names, args, strict=False)) | kwargs
        return self.pool(node, fn, got["input"], self.pool_attrs(fn, got))

    # Views on tensors.
    def _view(self, node: TracedNode, fn: str, args: list[Any], kwargs: dict[str, Any]) -> Ref:
        meta = self.meta_value(node.name, node.meta)
        if fn in ("reshape", "flatten", "reshape_as") and not self.viewable(args[0], meta.shape):
            # torch would copy inside at::reshape (torch's kernel, outside the program's own): the copy is
            # the program's own identity kernel, and the reshape a view of its contiguous output.
            args = [self.emit_ew("identity", [args[0]], [], node.name), *args[1:]]
        rest = args[1:]
        if len(rest) == 1 and isinstance(rest[0], list) and fn not in ("unflatten",):
            rest = rest[0]
        attrs: dict[str, Any] = {"args": rest, "kwargs": kwargs}
        ident = self.own_id(node)
        self.g.add_value(Value(ident, "tensor", meta.shape, meta.stride, meta.dtype, meta.contiguous))
        self.g.add_op(Op(VIEW, fn, ident, [args[0]], attrs, origin=node.name))
        return Ref(ident)

    def viewable(self, src: Ref, shape: tuple[int, ...]) -> bool:
        """Can `src` (laid out as traced) take `shape` as a view? A float tensor that cannot is copied."""
        v = self.g.values[src.id]
        if v.contiguous or v.dtype != "float32" or len(v.stride) != len(v.shape):
            return True
        return view_strides(v.shape, v.stride, shape) is not None

    def _list_view(self, node: TracedNode, fn: str, args: list[Any], kwargs: dict[str, Any]) -> None:
        """chunk/split/unbind: a host-side list of views; getitem picks one."""
        if node.meta.get("kind") != "list":
            raise Unsupported(f"{node.name}: {fn} did not return a list")
        self.g.add_value(Value(node.name, "list", const=node.meta.get("items")))
        self.g.add_op(
            Op(VIEW, fn, node.name, [args[0]], {"args": args[1:], "kwargs": kwargs}, origin=node.name)
        )

    def fn_unfold(self, node: TracedNode, args: list[Any], kwargs: dict[str, Any]) -> Ref:
        """Tensor.unfold(dim, size, step), the sliding-window view (patches of an image); F.unfold, the
        im2col copy, is another operation."""
        if node.op != "call_method" and node.target != "torch.Tensor.unfold":
            raise Unsupported(f"{node.name}: {node.target} (im2col) has no lowering")
        given = [
            *args[1:],
            *(kwargs[k] for k in ("dimension", "size", "step")[len(args) - 1 :] if k in kwargs),
        ]
        if len(given) != 3 or not all(isinstance(v, Const) for v in given):
            raise Unsupported(f"{node.name}: unfold with sizes read at run time")
        return self._view(node, "unfold", [args[0], *given], {})

    def fn_chunk(self, node: TracedNode, args: list[Any], kwargs: dict[str, Any]) -> None:
        self._list_view(node, "chunk", args, kwargs)

    def fn_split(self, node: TracedNode, args: list[Any], kwargs: dict[str, Any]) -> None:
        self._list_view(node, "split", args, kwargs)

    def fn_unbind(self, node: TracedNode, args: list[Any], kwargs: dict[str, Any]) -> None:
        self._list_view(node, "unbind", args, kwargs)

    def fn_scaled_dot_product_attention(
        self, node: TracedNode, args: list[Any], kwargs: dict[str, Any]
    ) -> Ref:
        names = ["query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale"]
        got = dict(zip(names, args, strict=False)) | kwargs
        if self.literal(got.get("dropout_p", Const(0.0))):
            raise Unsupported(f"{node.name}: attention dropout is random")
        if got.get("enable_gqa") is not None and self.literal(got["enable_gqa"]):
            raise Unsupported(f"{node.name}: grouped-query attention")
        mask = got.get("attn_mask")
        causal = bool(self.literal(got.get("is_causal", Const(False))))
        scale = self.literal(got["scale"]) if got.get("scale") is not None else None
        if mask is not None:
            attrs = {"is_causal": causal, "scale": scale, "mask": True}
            return self.lib("sdpa", [got["query"], got["key"], got["value"], mask], attrs, node)
        # softmax(q k^T * scale [causal]) v: two GEMMs around one fused row kernel.
        q, k, v = got["query"], got["key"], got["value"]
        probs = attention_probs(self, q, k, None if scale is None else float(scale), causal, node.name)
        return self.lib("matmul", [probs, v], {}, node)

    def lower_view_call(self, node: TracedNode, name: str, args: list[Any], kwargs: dict[str, Any]) -> Ref:
        return self._view(node, name, args, kwargs)

    # ---- modules -------------------------------------------------------------------------------
    def module_param(self, node: TracedNode, name: str) -> Ref | None:
        mod = node.module or {}
        shapes = {**mod.get("params", {}), **mod.get("buffers", {})}
        if name not in shapes:
            return None
        return self.param_ref(f"{node.target}.{name}", tuple(shapes[name]))

    def lower_module(self, node: TracedNode, args: list[Any], kwargs: dict[str, Any]) -> None:
        mod = node.module or {}
        cls = mod.get("class", "")
        a = mod.get("attrs", {})
        x = args[0] if args else kwargs.get("input")
        if not isinstance(x, Ref):
            raise Unsupported(f"{node.name}: module {cls} called without a tensor argument")
        if cls in ACTIVATION_MODULES:
            fn, keys = ACTIVATION_MODULES[cls]
            if cls == "Hardtanh":
                params = [self.mod_attr(node, "min_val"), self.mod_attr(node, "max_val")]
                self.define(node, self.emit_ew("clamp", [x, *params], [], node.name, node.name))
                return
            if cls == "ReLU6":
                self.define(
                    node, self.emit_ew("clamp", [x, Const(0.0), Const(6.0)], [], node.name, node.name)
                )
                return
            params = [self.mod_attr(node, k) for k in keys]
            self.define(node, self.emit_ew(fn, [x], params, node.name, node.name))
            return
        if cls == "GELU":
            fn = "gelu_tanh" if a.get("approximate") == "tanh" else "gelu"
            self.define(node, self.emit_ew(fn, [x], [], node.name, node.name))
            return
        if cls in ("Dropout", "Dropout1d", "Dropout2d", "Dropout3d", "AlphaDropout"):
            if mod.get("training") and a.get("p", 0) > 0:
                if cls != "Dropout":  # each draws its mask its own way (per channel, alpha-scaled)
                    raise Unsupported(f"{node.name}: {cls} in training mode (nn.Dropout's is lowered)")
                self.define(node, self.random_draw(node, "dropout", [x], {"p": float(a["p"])}))
                return
            self.define(node, self.emit_ew("identity", [x], [], node.name, node.name))
            return
        if cls in ("Softmax", "LogSoftmax"):
            if a.get("dim") is None:
                raise Unsupported(f"{node.name}: softmax without an explicit dim")
            self.define(node, self.softmax_of(x, int(a["dim"]), node.name, log=cls == "LogSoftmax"))
            return
        if cls == "Linear":
            w = self.module_param(node, "weight")
            assert w is not None
            self.define(node, self.linear(node, x, w, self.module_param(node, "bias")))
            return
        if cls == "Embedding":
            w = self.module_param(node, "weight")
            if w is None or a.get("max_norm") is not None:
                raise Unsupported(
                    f"{node.name}: Embedding with max_norm (it renormalises the weight in place)"
                )
            self.define(node, self.index_pick(node, w, 0, x))
            return
        if cls in ("Conv1d", "Conv2d", "Conv3d"):
            if a.get("padding_mode", "zeros") != "zeros":
                raise Unsupported(f"{node.name}: padding_mode {a.get('padding_mode')}")
            attrs = {k: a[k] for k in ("stride", "padding", "dilation", "groups")}
            w = self.module_param(node, "weight")
            assert w is not None
            self.define(node, self._conv(node, cls.lower(), x, w, self.module_param(node, "bias"), attrs))
            return
        if cls in ("ConvTranspose1d", "ConvTranspose2d", "ConvTranspose3d"):
            if len(args) > 1:
                raise Unsupported(f"{node.name}: conv_transpose with output_size")
            attrs = {k: a[k] for k in ("stride", "padding", "output_padding", "groups", "dilation")}
            w = self.module_param(node, "weight")
            assert w is not None
            fn = "conv_transpose" + cls[-2:].lower()
            self.define(node, self._conv(node, fn, x, w, self.module_param(node, "bias"), attrs))
            return
        if cls == "LayerNorm":
            shape = a.get("normalized_shape")
            ndims = len(shape) if isinstance(shape, list) else 1
            eps = self.mod_attr(node, "eps")
            y = self.layer_norm(
                x, ndims, self.module_param(node, "weight"), self.module_param(node, "bias"), eps, node.name
            )
            self.define(node, y)
            return
        if cls == "RMSNorm":
            shape = a.get("normalized_shape")
            ndims = len(shape) if isinstance(shape, list) else 1
            eps = self.mod_attr(node, "eps") if a.get("eps") is not None else Const(1.1920928955078125e-07)
            self.define(node, self.rms_norm(x, ndims, self.module_param(node, "weight"), eps, node.name))
            return
        if cls == "CrossEntropyLoss":
            if self.module_param(node, "weight") is not None:
                raise Unsupported(f"{node.name}: CrossEntropyLoss with class weights")
            settings = {
                "ignore_index": Const(int(a.get("ignore_index", -100))),
                "reduction": a.get("reduction", "mean"),
                "label_smoothing": Const(float(a.get("label_smoothing", 0.0))),
            }
            self.define(node, self.fn_cross_entropy(node, list(args[:2]), {**kwargs, **settings}))
            return
        if cls == "TripletMarginLoss":
            operands = [*args, *(kwargs[k] for k in ("positive", "negative") if k in kwargs)]
            if len(operands) != 3:
                raise Unsupported(f"{node.name}: TripletMarginLoss without anchor, positive and negative")
            self.define(node, self.triplet_margin_loss(node, operands[0], operands[1], operands[2], a))
            return
        if cls == "GroupNorm":
            eps = self.mod_attr(node, "eps")
            y = self.group_norm(
                x,
                int(a["num_groups"]),
                self.module_param(node, "weight"),
                self.module_param(node, "bias"),
                eps,
                node.name,
            )
            self.define(node, y)
            return
        if cls in ("BatchNorm1d", "BatchNorm2d", "BatchNorm3d"):
            eps = self.mod_attr(node, "eps")
            mean, var = self.module_param(node, "running_mean"), self.module_param(node, "running_var")
            weight, bias = self.module_param(node, "weight"), self.module_param(node, "bias")
            if mod.get("training") or mean is None or var is None:
                # Batch statistics: training mode, or a norm that keeps no running statistics.
                momentum = self.mod_attr(node, "momentum") if mod.get("training") else None
                y = self.batch_norm_train(x, mean, var, weight, bias, momentum, eps, node.name)
            else:
                y = self.batch_norm_eval(x, mean, var, weight, bias, eps, node.name)
            self.define(node, y)
            return
        if cls in ("InstanceNorm1d", "InstanceNorm2d", "InstanceNorm3d"):
            if a.get("track_running_stats") and not mod.get("training"):
                raise Unsupported(f"{node.name}: instance norm with running statistics")
            eps = self.mod_attr(node, "eps")
            y = self.instance_norm(
                x, self.module_param(node, "weight"), self.module_param(node, "bias"), eps, node.name
            )
            self.define(node, y)
            return
        if cls in ("MaxPool1d", "MaxPool2d", "MaxPool3d", "AvgPool1d", "AvgPool2d", "AvgPool3d"):
            fn = ("max" if cls.startswith("Max") else "avg") + "_pool" + cls[-2]
            got = {k: (Const(v) if isinstance(v, int | bool) else v) for k, v in a.items()}
            got = {k: ([Const(x) for x in v] if isinstance(v, list) else v) for k, v in got.items()}
            self.define(node, self.pool(node, fn, x, self.pool_attrs(fn, got)))
            return
        if cls in ADAPTIVE_POOL_MODULES:
            fn = "adaptive_" + ("avg" if "Avg" in cls else "max") + "_pool" + cls[-2]
            got = {"output_size": a.get("output_size"), "return_indices": a.get("return_indices")}
            self.define(node, self.pool(node, fn, x, self.pool_attrs(fn, got)))
            return
        if cls in ("LSTM", "GRU"):
            self.lower_rnn(node, cls, x, args[1:] or [kwargs.get("hx")])
            return
        if cls == "MultiheadAttention":
            lower_multihead_attention(self, node, args, kwargs)
            return
        if cls == "Flatten":
            self.define(
                node,
                self._view(
                    node, "flatten", [x, Const(a.get("start_dim", 1)), Const(a.get("end_dim", -1))], {}
                ),
            )
            return
        if cls == "Unflatten":
            self.define(
                node,
                self._view(
                    node, "unflatten", [x, Const(a["dim"]), [Const(s) for s in a["unflattened_size"]]], {}
                ),
            )
            return
        raise Unsupported(f"{node.name}: module {cls} has no lowering")

    def lower_rnn(self, node: TracedNode, cls: str, x: Ref, hx: list[Any]) -> None:
        """nn.LSTM / nn.GRU: one library call (rnn.py's host loop: per layer and direction a GEMM for every
        step's input projection, then per step a GEMM for the recurrent term and a fused cell kernel)
        whose list result is {output, h_n[, c_n]}; the module's (output, h_n) or (output, (h_n, c_n)) is
        a tuple of those items."""
        mod = node.module or {}
        a = mod.get("attrs", {})
        if a.get("proj_size", 0) or (a.get("dropout", 0) and mod.get("training")):
            raise Unsupported(f"{node.name}: projected or dropout {cls}")
        if len(self.shape_of(x)) != 3:
            raise Unsupported(f"{node.name}: {cls} over an unbatched (2-D) sequence")
        states = self.rnn_states(node, cls, hx[0] if hx else None)
        layers, bias = int(a["num_layers"]), bool(a.get("bias", True))
        directions = ("", "_reverse") if a.get("bidirectional") else ("",)
        weights = []
        for layer in range(layers):
            for suffix in directions:
                for name in ("weight_ih", "weight_hh") + (("bias_ih", "bias_hh") if bias else ()):
                    ref = self.module_param(node, f"{name}_l{layer}{suffix}")
                    if ref is None:
                        raise Unsupported(f"{node.name}: {cls} parameter {name}_l{layer}{suffix} missing")
                    weights.append(ref)
        items = node.meta.get("items") or []
        state_metas = items[1:2] if cls == "GRU" else (items[1].get("items") or [] if len(items) == 2 else [])
        metas = items[:1] + state_metas
        if len(metas) != (3 if cls == "LSTM" else 2) or any(m.get("kind") != "tensor" for m in metas):
            raise Unsupported(f"{node.name}: unexpected {cls} result")
        fn = cls.lower()
        packed = self.g.add_value(Value(self.fresh(node.name), "list"))
        attrs = {
            "layers": layers,
            "directions": len(directions),
            "bias": bias,
            "batch_first": bool(a.get("batch_first")),
            "states": len(states),
        }
        self.g.add_op(Op(LIB, fn, packed.id, [x, *states, *weights], attrs, origin=node.name))
        results = []
        for i, (meta, what) in enumerate(zip(metas, ("out", "h_n", "c_n"), strict=False)):
            item = self.g.add_value(self.meta_value(f"{node.name}_{what}", meta))
            self.g.add_op(Op(ITEM, "item", item.id, [Ref(packed.id), Const(i)], origin=node.name))
            results.append(Ref(item.id))
        state: Ref = results[1]
        if cls == "LSTM":
            state = Ref(self.g.add_value(Value(f"{node.name}_state", "list")).id)
            self.g.add_op(Op(HOST, "tuple", state.id, results[1:], origin=node.name))
        self.g.add_value(Value(node.name, "list"))
        self.g.add_op(Op(HOST, "tuple", node.name, [results[0], state], origin=node.name))

    def rnn_states(self, node: TracedNode, cls: str, hx: Any) -> list[Ref]:
        """The initial state argument: none, h0 (GRU) or (h0, c0) (LSTM), each a float32 tensor."""
        if hx is None or (isinstance(hx, Const) and hx.value is None):
            return []
        producer = self.g.producer.get(hx.id) if isinstance(hx, Ref) else None
        if producer is not None and producer.fn == "tuple":
            hx = producer.args  # the (h_n, c_n) state of an earlier LSTM
        states = list(hx) if isinstance(hx, list | tuple) else [hx]
        if len(states) != (2 if cls == "LSTM" else 1):
            raise Unsupported(f"{node.name}: {cls} initial state {hx!r}")
        for ref in states:
            value = self.value(ref)
            if value is None or value.kind != "tensor" or value.dtype != "float32":
                raise Unsupported(f"{node.name}: {cls} initial state that is not a float32 tensor")
        return states


def _install_view_handlers() -> None:
    for name in VIEW_FNS:
        if not hasattr(Normalizer, f"fn_{name}"):

            def handler(
                self: Normalizer, node: TracedNode, args: list[Any], kwargs: dict[str, Any], _n: str = name
            ) -> Ref:
                return self._view(node, _n, args, kwargs)

            setattr(Normalizer, f"fn_{name}", handler)
    for name in ("max_pool1d", "max_pool2d", "max_pool3d", "avg_pool1d", "avg_pool2d", "avg_pool3d",
                 "adaptive_avg_pool1d", "adaptive_avg_pool2d", "adaptive_avg_pool3d",
                 "adaptive_max_pool1d", "adaptive_max_pool2d", "adaptive_max_pool3d"):  # fmt: skip

        def pool_handler(
            self: Normalizer, node: TracedNode, args: list[Any], kwargs: dict[str, Any], _n: str = name
        ) -> Ref:
            return self._pool_fn(node, _n, args, kwargs)

        setattr(Normalizer, f"fn_{name}", pool_handler)


_install_view_handlers()


def normalize(trace: Trace) -> Graph:
    return Normalizer(trace).run()
