"""The synthesizer's intermediate representation: SSA values and primitive ops normalized from torch.fx."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any


class Unsupported(Exception):
    """The built-in synthesizer has no lowering for a construct of the reference (reason in the message)."""


@dataclass(frozen=True)
class Ref:
    """A value produced by another op (tensor or host scalar)."""

    id: str


@dataclass(frozen=True)
class Const:
    """A literal scalar baked into the program (Python float/int/bool from the reference's code)."""

    value: float | int | bool


@dataclass(frozen=True)
class Attr:
    """A float attribute of the model (self.scale, self.norm.eps): ModelNew passes it at run time."""

    path: str
    value: float


Arg = Ref | Const | Attr


@dataclass
class Value:
    id: str
    # tensor | int | float | bool | shape | list | none
    kind: str
    shape: tuple[int, ...] = ()
    stride: tuple[int, ...] = ()
    dtype: str = "float32"
    contiguous: bool = True
    # The traced value of a host scalar or shape (informational; the program recomputes it).
    const: Any = None

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


# Op kinds.
INPUT = "input"  # a forward argument
PARAM = "param"  # a parameter/buffer/tensor attribute of the model, passed by ModelNew
EW = "ew"  # elementwise arithmetic over broadcast operands
REDUCE = "reduce"  # reduction along dims (sum, mean, amax, amin, prod, argmax, argmin)
VIEW = "view"  # metadata-only host op on a materialized tensor (view, transpose, ...)
LIB = "lib"  # library call from C++ (at::mm, at::conv2d, ...)
POOL = "pool"  # pooling window op
HOST = "host"  # host scalar arithmetic and shape queries
ITEM = "item"  # element of a multi-result value (max(dim) -> values, indices)
SCAN = "scan"  # inclusive/exclusive prefix sum or product along one dim, optionally from the end
FLIP = "flip"  # reversal of dims (a gather: torch has no negative strides)
TRI = "tri"  # triu/tril: elements off the kept triangle of the last two dims set to zero
# A draw from torch's random generator (dropout in training mode, torch.randn in the forward), through the
# ATen call the reference's own code makes, in the reference's order: the Verifier seeds the generator
# before every call, the reference's and the program's, so both draw the same numbers.
RANDOM = "random"

REDUCE_FNS = frozenset({"sum", "mean", "amax", "amin", "prod", "argmax", "argmin"})
SCAN_FNS = frozenset({"sum", "prod"})


@dataclass
class Op:
    kind: str
    fn: str
    out: str
    args: list[Any] = field(default_factory=list)
    attrs: dict[str, Any] = field(default_factory=dict)
    # The fx node this op was lowered from (several ops may share one origin after decomposition).
    origin: str = ""

    def refs(self) -> list[str]:
        found: list[str] = []

        def walk(a: Any) -> None:
            if isinstance(a, Ref):
                found.append(a.id)
            elif isinstance(a, list | tuple):
                for x in a:
                    walk(x)

        for a in self.args:
            walk(a)
        for a in self.attrs.values():
            if isinstance(a, Ref | list | tuple):
                walk(a)
        return found


@dataclass
class Graph:
    values: dict[str, Value] = field(default_factory=dict)
    ops: list[Op] = field(default_factory=list)
    # Forward arguments in order: (value id, argument name).
    inputs: list[tuple[str, str]] = field(default_factory=list)
    # Model tensors: value id -> attribute path ("linear.weight").
    params: dict[str, str] = field(default_factory=dict)
    outputs: list[str] = field(default_factory=list)
    output_is_tuple: bool = False
    # Model state the forward updates (BatchNorm's running statistics in training mode): new value id ->
    # the param value whose buffer it is written into, in place, by the kernel that computes it.
    writebacks: dict[str, str] = field(default_factory=dict)
    producer: dict[str, Op] = field(default_factory=dict)

    def add_value(self, value: Value) -> Value:
        if value.id in self.values:
            raise ValueError(f"duplicate value {value.id}")
        self.values[value.id] = value
        return value

    def add_op(self, op: Op) -> Op:
        self.ops.append(op)
        self.producer[op.out] = op
        return op

    def consumers(self) -> dict[str, list[Op]]:
        users: dict[str, list[Op]] = {v: [] for v in self.values}
        for op in self.ops:
            for r in op.refs():
                users.setdefault(r, []).append(op)
        return users

    def tensor(self, ident: str) -> Value:
        value = self.values[ident]
        if value.kind != "tensor":
            raise Unsupported(f"{ident} is a {value.kind}, a tensor was expected")
        return value


def broadcast_shapes(*shapes: tuple[int, ...]) -> tuple[int, ...]:
    rank = max((len(s) for s in shapes), default=0)
    out = [1] * rank
    for s in shapes:
        for i, size in enumerate(s):
            j = rank - len(s) + i
            if size != 1:
                if out[j] not in (1, size):
                    raise Unsupported(f"shapes {shapes} do not broadcast")
                out[j] = size
    return tuple(out)


def contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides = [1] * len(shape)
    for i in range(len(shape) - 2, -1, -1):
        strides[i] = strides[i + 1] * max(shape[i + 1], 1)
    return tuple(strides)


def norm_dims(dims: Any, rank: int) -> tuple[int, ...]:
    """Reduction dims as sorted non-negative ints; None or () means every dim."""
    if dims is None or (isinstance(dims, list | tuple) and len(dims) == 0):
        return tuple(range(rank))
    if isinstance(dims, int):
        dims = [dims]
    out = []
    for d in dims:
        if not isinstance(d, int):
            raise Unsupported(f"reduction dim {d!r} is not a constant int")
        if rank == 0:
            continue
        out.append(d % rank)
    return tuple(sorted(set(out)))


def reduced_shape(shape: tuple[int, ...], dims: tuple[int, ...], keepdim: bool) -> tuple[int, ...]:
    if keepdim:
        return tuple(1 if i in dims else s for i, s in enumerate(shape))
    return tuple(s for i, s in enumerate(shape) if i not in dims)
