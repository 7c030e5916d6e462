"""Code generation shared by the CPU and CUDA back ends: C++ names, elementwise expressions, the
per-kernel analysis (operands, scalars, reduction levels) and the host forward function that runs
the program's steps (views, library calls, kernel launches) in order.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from stitchcuda.coder.synth import convolution, einsum
from stitchcuda.coder.synth.exprs import EW as EW_SPECS
from stitchcuda.coder.synth.exprs import float_literal, pow_const
from stitchcuda.coder.synth.fusion import Kernel, Operand, Program
from stitchcuda.coder.synth.ir import (
    EW,
    FLIP,
    HOST,
    INPUT,
    ITEM,
    LIB,
    PARAM,
    RANDOM,
    REDUCE,
    SCAN,
    TRI,
    VIEW,
    Attr,
    Const,
    Graph,
    Op,
    Ref,
    Unsupported,
)

CTYPE = {"float32": "float", "bool": "bool", "int64": "int64_t"}
AT_DTYPE = {"float32": "at::kFloat", "bool": "at::kBool", "int64": "at::kLong"}


def cname(ident: str) -> str:
    return re.sub(r"\W", "_", ident)


def tensor_var(ident: str) -> str:
    return "T_" + cname(ident)


def host_var(ident: str) -> str:
    return "H_" + cname(ident)


def list_var(ident: str) -> str:
    return "L_" + cname(ident)


def local_var(ident: str) -> str:
    return "v_" + cname(ident)


def cpp_list(items: list[str]) -> str:
    return "{" + ", ".join(items) + "}"


class KernelBodies:
    """The kernels a program emits, each distinct body once.

    A deep model repeats the same fused kernel per layer (ResNet-101's 100 BatchNorm+ReLU epilogues differ
    only in their names): ResNet-101's kernels.cu was 4.2 MB of 724 kernels, 10 distinct, and nvcc did not
    finish it. Two kernels are the same when their sources are equal up to the kernel's own name, their
    local value names (`v_*`, renamed consistently in order of first use, so alpha-equivalent bodies only)
    and whole-line comments; a later one then launches the first one's entry point (`add` names it).
    """

    def __init__(self) -> None:
        self.functions: list[str] = []
        self._first: dict[str, str] = {}

    @staticmethod
    def canonical(source: str, name: str) -> str:
        text = re.sub(rf"\b{re.escape(name)}(?![0-9A-Za-z])", "KERNEL", source)
        text = re.sub(r"(?m)^[ \t]*//[^\n]*\n?", "", text)
        names: dict[str, str] = {}

        def rename(m: re.Match[str]) -> str:
            return "v_" + names.setdefault(m.group(1), str(len(names)))

        return re.sub(r"(?<![0-9A-Za-z])v_(\w+)", rename, text)

    def add(self, name: str, source: str) -> str:
        """The name whose entry point launches this kernel: `name`, or an earlier kernel of the same body."""
        first = self._first.setdefault(self.canonical(source, name), name)
        if first == name:
            self.functions.append(source)
        return first


class Scope:
    """Emits the C++ lines computing requested values, each at most once, in dependency order."""

    def __init__(
        self,
        graph: Graph,
        ops: dict[str, Op],
        scalar: Callable[[Any], str],
        load: Callable[[str], str],
        parent: Scope | None = None,
    ) -> None:
        self.graph = graph
        self.ops = ops
        self.scalar = scalar
        self.load = load
        self.names: dict[str, str] = dict(parent.names) if parent else {}
        self.lines: list[str] = []

    def arg(self, a: Any) -> str:
        if isinstance(a, Ref):
            v = self.graph.values[a.id]
            if v.kind != "tensor":
                return self.scalar(a)
            return self.need(a.id)
        if isinstance(a, Const):
            if isinstance(a.value, bool):
                return "true" if a.value else "false"
            return float_literal(float(a.value))
        if isinstance(a, Attr):
            return self.scalar(a)
        raise Unsupported(f"argument {a!r} in a kernel")

    def need(self, ident: str) -> str:
        if ident in self.names:
            return self.names[ident]
        op = self.ops.get(ident)
        if op is None or op.kind != EW:
            name = self.load(ident)
            self.names[ident] = name
            return name
        spec = EW_SPECS[op.fn]
        if op.fn == "pow" and isinstance(op.args[1], Const):
            expr = pow_const(self.arg(op.args[0]), float(op.args[1].value))
        else:
            expr = spec.emit([self.arg(a) for a in op.args])
        ctype = CTYPE[self.graph.values[ident].dtype]
        name = local_var(ident)
        if spec.result == "float" and ctype == "float":
            expr = f"static_cast<float>({expr})"
        self.lines.append(f"const {ctype} {name} = {expr};")
        self.names[ident] = name
        return name


@dataclass
class Reduction:
    op: Op
    level: int


@dataclass
class KernelInfo:
    """What a back end needs to emit one kernel."""

    kernel: Kernel
    operands: list[Operand]
    general: list[int]
    # (host expression, key) per scalar parameter, in parameter order.
    scalars: list[tuple[str, str]]
    ops: dict[str, Op]
    reductions: list[Reduction] = field(default_factory=list)
    row_level: dict[str, bool] = field(default_factory=dict)
    levels: dict[str, int] = field(default_factory=dict)
    max_level: int = 0

    def operand_index(self, ident: str, domain: str = "main") -> int:
        for i, o in enumerate(self.operands):
            if o.id == ident and o.domain == domain:
                return i
        raise KeyError(ident)


def analyze(graph: Graph, kernel: Kernel) -> KernelInfo:
    ops = {op.out: op for op in kernel.ops}
    scalars: dict[str, str] = {}
    for op in kernel.ops:
        for a in op.args:
            if isinstance(a, Attr):
                scalars.setdefault(f"attr:{a.path}", attr_var(a.path))
            elif isinstance(a, Ref) and graph.values[a.id].kind in ("int", "float", "bool"):
                scalars.setdefault(f"host:{a.id}", host_var(a.id))
    info = KernelInfo(
        kernel,
        kernel.operands,
        [i for i, o in enumerate(kernel.operands) if o.access == "general"],
        [(expr, key) for key, expr in scalars.items()],
        ops,
    )
    if kernel.kind == "row":
        classify_row(graph, info)
    return info


def flat_load(info: KernelInfo) -> Callable[[str], str]:
    """An operand's element at flat index `i` of a pointwise domain: `z<k>` (a scalar operand, loaded once
    beforehand), `in<k>[i]` (contiguous), or through the row base `b<k>` and column stride `cs<k>` (strided or
    broadcast; the caller computes them)."""
    index = {o.id: i for i, o in enumerate(info.operands)}

    def load(ident: str) -> str:
        i = index[ident]
        access = info.operands[i].access
        if access == "scalar":
            return f"z{i}"
        if access == "contig":
            return f"in{i}[i]"
        return f"in{i}[b{i} + c * cs{i}]"

    return load


def attr_var(path: str) -> str:
    return "A_" + cname(path)


def classify_row(graph: Graph, info: KernelInfo) -> None:
    k = info.kernel
    domain = graph.values[k.domain].shape
    rank = len(domain)

    def operand_is_row(ident: str) -> bool:
        shape = graph.values[ident].shape
        offset = rank - len(shape)
        return all(d - offset < 0 or shape[d - offset] == 1 for d in k.reduce_dims)

    levels: dict[str, int] = {}
    row: dict[str, bool] = {}

    def visit(ident: str) -> tuple[int, bool]:
        if ident in levels:
            return levels[ident], row[ident]
        op = info.ops.get(ident)
        if op is None:
            lv, rw = 0, operand_is_row(ident)
        elif op.kind == REDUCE:
            lv, _ = visit(op.args[0].id)
            lv, rw = lv + 1, True
        else:
            lv, rw = 0, True
            for a in op.args:
                if isinstance(a, Ref) and graph.values[a.id].kind == "tensor":
                    al, ar = visit(a.id)
                    lv, rw = max(lv, al), rw and ar
        levels[ident], row[ident] = lv, rw
        return lv, rw

    for ident in info.ops:
        visit(ident)
    info.levels, info.row_level = levels, row
    info.reductions = [Reduction(op, levels[op.out]) for op in k.ops if op.kind == REDUCE]
    info.max_level = max((r.level for r in info.reductions), default=0)


def acc_type(fn: str, variant_acc: str, default_double: bool) -> str:
    if fn in ("amax", "amin"):
        return "float"
    if fn in ("argmax", "argmin"):
        return "stitch::ArgAcc"
    if variant_acc == "double" or (variant_acc == "auto" and default_double):
        return "double"
    return "float"


def acc_init(fn: str, acc: str) -> str:
    return {
        "sum": f"static_cast<{acc}>(0)",
        "mean": f"static_cast<{acc}>(0)",
        "prod": f"static_cast<{acc}>(1)",
        "amax": "-INFINITY",
        "amin": "INFINITY",
        "argmax": "stitch::ArgAcc{-INFINITY, 0}",
        "argmin": "stitch::ArgAcc{INFINITY, 0}",
    }[fn]


def acc_update(fn: str, acc: str, name: str, value: str, index: str) -> str:
    if fn in ("sum", "mean"):
        return f"{name} += static_cast<{acc}>({value});"
    if fn == "prod":
        return f"{name} *= static_cast<{acc}>({value});"
    if fn == "amax":
        return f"{name} = stitch::st_max_nan({name}, {value});"
    if fn == "amin":
        return f"{name} = stitch::st_min_nan({name}, {value});"
    want = "true" if fn == "argmax" else "false"
    return f"{name} = stitch::arg_combine({name}, stitch::ArgAcc{{{value}, {index}}}, {want});"


def acc_combine(fn: str, a: str, b: str) -> str:
    if fn in ("sum", "mean"):
        return f"({a} + {b})"
    if fn == "prod":
        return f"({a} * {b})"
    if fn == "amax":
        return f"stitch::st_max_nan({a}, {b})"
    if fn == "amin":
        return f"stitch::st_min_nan({a}, {b})"
    want = "true" if fn == "argmax" else "false"
    return f"stitch::arg_combine({a}, {b}, {want})"


def acc_final(fn: str, acc: str, name: str, count: str) -> str:
    if fn == "mean":
        return f"static_cast<float>({name} / static_cast<{acc}>({count}))"
    if fn in ("argmax", "argmin"):
        return f"{name}.i"
    return f"static_cast<float>({name})"


# ---- host program ------------------------------------------------------------------------------------
_DECLARATION = re.compile(r"^(?:const )?(?:at::Tensor|std::vector<[\w:]+>|int64_t)&? (\w+)(?: = |\(|;)")


def own_function(lines: list[str], kernel: Any) -> list[str]:
    """One kernel launch's host lines as a function of their own (a lambda that is never inlined), with only
    its output declared in forward().

    forward() of a deep model is thousands of launches; as one function its size made the host compiler
    superlinear (ResNet-101's forward.cpp: 336 s at -O2, 50 s at -O0; 57 s and 15 s with a function per
    launch). The launch's locals (shapes, operands, descriptors) also die with it instead of living to the
    end of forward(). Lines that declare anything else the rest of forward() might read stay inline.
    """
    out = tensor_var(kernel.root)
    head = f"at::Tensor {out} = "
    comments, code, declared = [], [], False
    for line in lines:
        m = _DECLARATION.match(line)
        if line.startswith("//"):
            comments.append(line)
        elif line.startswith(head):
            code.append(f"  {out} = {line[len(head) :]}")
            declared = True
        elif m and not m.group(1).endswith(f"_{kernel.name}"):
            return lines
        else:
            code.append(f"  {line}")
    if not declared:
        return lines
    return [*comments, f"at::Tensor {out};", "[&]() __attribute__((noinline)) {", *code, "}();"]


_TOP_TENSOR = re.compile(r"^at::Tensor (T_\w+)(?: = |;)")
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_TENSOR_NAME = re.compile(r"\bT_\w+")


def release_dead(lines: list[str], keep: set[str]) -> list[str]:
    """forward()'s lines with each tensor it declares released (`T.reset()`) after the last statement that
    names it, so the caching allocator reuses its memory for later layers, as eager PyTorch does when a
    Python reference drops: a whole DenseNet's program held every intermediate to the end (1.9 GiB where
    the reference peaked at 0.3 GiB) and the Verifier rejected it (D10.memory).

    Statements are counted at the top level of forward() (a launch's function or a block is one). A tensor
    bound by a reference or whose data pointer is taken at the top level is kept to the end, and so are
    `keep` (the outputs).
    """
    depth, start = 0, 0
    end_of: dict[int, int] = {}  # first line of each top-level statement -> its last line
    owner: list[int] = []
    declared: set[str] = set()
    pinned = set(keep)
    codes = [_STRING.sub('""', line) for line in lines]  # string literals emptied: braces and names in code
    for i, (line, code) in enumerate(zip(lines, codes, strict=True)):
        if depth == 0:
            start = i
            m = _TOP_TENSOR.match(line)
            if m:
                declared.add(m.group(1))
            if "&" in code or "data_ptr" in code:
                pinned.update(_TENSOR_NAME.findall(code))
        owner.append(start)
        depth += code.count("{") - code.count("}")
        if depth == 0:
            end_of[start] = i
    if depth != 0:
        return lines  # braces that do not balance (a string this scan misread): release nothing
    last: dict[str, int] = {}
    for i, code in enumerate(codes):
        for name in _TENSOR_NAME.findall(code):
            last[name] = end_of[owner[i]]
    after: dict[int, list[str]] = {}
    for name in sorted(declared - pinned):
        after.setdefault(last[name], []).append(f"{name}.reset();")
    out: list[str] = []
    for i, line in enumerate(lines):
        out.append(line)
        out.extend(after.get(i, []))
    return out


def cat_into_var(cat: str) -> str:
    return f"CI_{cname(cat)}"


def cat_into_plan(program: Program) -> dict[str, tuple[str, int]]:
    """The parts of concatenations along the channels that their own convolutions can write in place (CUDA):
    part -> (the cat's value, the part's first channel). A part qualifies where the convolution's output
    (or, with its pointwise tail as its epilogue, that kernel's) is read by that cat alone, once, is no
    output of the program, and has a batch dim; the cat is of float32 tensors of rank 3 or more along dim 1.
    Each such part is written once instead of written and copied (SqueezeNet's fire modules, GoogLeNet's
    inception modules, DenseNet's layers)."""
    g = program.graph
    uses: dict[str, int] = {}
    for step in program.steps:
        refs = step.op.refs() if step.op is not None else []
        if step.kernel is not None:
            refs = [o.id for o in step.kernel.operands]
            if step.kernel.epilogue_of is not None:
                refs = [r for r in refs if r != step.kernel.epilogue_of.out]
        for r in refs:
            uses[r] = uses.get(r, 0) + 1
    for out in g.outputs:
        uses[out] = uses.get(out, 0) + 2
    produced: dict[str, Op] = {}  # value -> the convolution writing it
    for step in program.steps:
        if step.op is not None and step.op.kind == LIB and step.op.fn in convolution.CONV_FNS:
            produced[step.op.out] = step.op
        elif step.kernel is not None and step.kernel.epilogue_of is not None:
            lib = step.kernel.epilogue_of
            if lib.fn in convolution.CONV_FNS:
                produced.pop(lib.out, None)
                produced[step.kernel.root] = lib
    plan: dict[str, tuple[str, int]] = {}
    for step in program.steps:
        op = step.op
        if op is None or op.kind != LIB or op.fn != "cat":
            continue
        shape = g.values[op.out].shape
        dim = op.attrs.get("dim")
        if not isinstance(dim, int) or len(shape) < 3 or dim % len(shape) != 1:
            continue
        if g.values[op.out].dtype != "float32" or not all(isinstance(a, Ref) for a in op.args):
            continue
        ids = [a.id for a in op.args]
        offset = 0
        for part in ids:
            conv = produced.get(part)
            batched = conv is not None and len(g.values[conv.args[0].id].shape) == len(shape)
            if conv is not None and batched and uses.get(part) == 1 and ids.count(part) == 1:
                plan[part] = (op.out, offset)
            offset += g.values[part].shape[1]
    return plan


class Host:
    """Writes the body of `forward`: checks, host ops, library calls and kernel launches."""

    def __init__(
        self,
        program: Program,
        backend: str,
        launch: Callable[[KernelInfo, Host], list[str]],
        *,
        custom_library: bool = False,
    ) -> None:
        self.custom = custom_library
        self.p = program
        self.g = program.graph
        self.backend = backend
        self.launch = launch
        self.lines: list[str] = []
        # Host helpers the program needs from the back end ("lstm": the recurrent layers, LSTM and GRU).
        self.helpers: set[str] = set()
        # Parts of concatenations that their own convolutions write in place: part -> (cat, channel offset).
        self.cat_into: dict[str, tuple[str, int]] = (
            cat_into_plan(program) if backend == "cuda" and custom_library else {}
        )

    def into_args(self, part: str) -> str:
        """The trailing arguments of the convolution producing `part` ("" unless it writes into a cat)."""
        if part not in self.cat_into:
            return ""
        cat, offset = self.cat_into[part]
        return f", {cat_into_var(cat)}, {offset}"

    def scalar_expr(self, a: Any) -> str:
        if isinstance(a, Const):
            if a.value is None:
                return "c10::nullopt"
            if isinstance(a.value, bool):
                return "true" if a.value else "false"
            if isinstance(a.value, int):
                return str(a.value)
            return repr(float(a.value))
        if isinstance(a, Attr):
            return attr_var(a.path)
        if isinstance(a, Ref):
            v = self.g.values[a.id]
            if v.kind == "tensor":
                return tensor_var(a.id)
            return host_var(a.id)
        if a is None:
            return "c10::nullopt"
        if isinstance(a, int | float):
            return repr(a)
        raise Unsupported(f"host argument {a!r}")

    def int_list(self, items: Any) -> str:
        if isinstance(items, Ref) and self.g.values[items.id].kind == "shape":
            return host_var(items.id)
        if not isinstance(items, list):
            items = [items]
        parts = []
        for x in items:
            if isinstance(x, Ref) and self.g.values[x.id].kind == "shape":
                raise Unsupported("a shape nested inside a size list")
            parts.append(f"static_cast<int64_t>({self.scalar_expr(x)})")
        return f"std::vector<int64_t>{cpp_list(parts)}"

    def signature(self) -> tuple[str, list[str]]:
        params = []
        for ident, _ in self.g.inputs:
            v = self.g.values[ident]
            if v.kind == "tensor":
                params.append(f"at::Tensor {tensor_var(ident)}")
            elif v.kind == "float":
                params.append(f"double {host_var(ident)}")
            elif v.kind == "int":
                params.append(f"int64_t {host_var(ident)}")
            elif v.kind == "bool":
                params.append(f"bool {host_var(ident)}")
            else:
                raise Unsupported(f"forward argument {ident} of kind {v.kind}")
        for ident in self.g.params:
            params.append(f"at::Tensor {tensor_var(ident)}")
        for a in self.p.attrs:
            params.append(f"double {attr_var(a.path)}")
        if self.g.output_is_tuple:
            ret = "std::tuple<" + ", ".join("at::Tensor" for _ in self.g.outputs) + ">"
        else:
            ret = "at::Tensor"
        return ret, params

    def first_tensor(self) -> str:
        for ident, _ in self.g.inputs:
            if self.g.values[ident].kind == "tensor":
                return tensor_var(ident)
        for ident in self.g.params:
            return tensor_var(ident)
        raise Unsupported("the forward has no tensor argument")

    def body(self) -> list[str]:
        out = self.lines
        first = self.first_tensor()
        tensors = [i for i, _ in self.g.inputs if self.g.values[i].kind == "tensor"] + list(self.g.params)
        for ident in tensors:
            name = tensor_var(ident)
            dtype = self.g.values[ident].dtype
            out.append(f'TORCH_CHECK({name}.scalar_type() == {AT_DTYPE[dtype]}, "{ident} must be {dtype}");')
            if self.backend == "cuda":
                out.append(f'TORCH_CHECK({name}.is_cuda(), "{ident} must be a CUDA tensor");')
            else:
                out.append(f'TORCH_CHECK({name}.device().is_cpu(), "{ident} must be a CPU tensor");')
        if self.backend == "cuda":
            out.append(f"const c10::cuda::CUDAGuard device_guard({first}.device());")
        out.append(f"const auto opts = {first}.options();")
        for cat in sorted({cat for cat, _ in self.cat_into.values()}):
            self.helpers.add("cat_into")
            channels = self.g.values[cat].shape[1]
            # Through a pointer: a top-level statement that takes an address keeps its tensors to the end.
            out.append(f"StitchCatInto CB_{cname(cat)}{{{channels}, at::Tensor()}};")
            out.append(f"StitchCatInto* const {cat_into_var(cat)} = &CB_{cname(cat)};")
        for step in self.p.steps:
            if step.kernel is not None:
                out.extend(own_function(self.launch(analyze(self.g, step.kernel), self), step.kernel))
            elif step.op is not None:
                out.extend(self.host_op(step.op))
        results = [tensor_var(o) for o in self.g.outputs]
        out[:] = release_dead(out, set(results))
        if self.g.output_is_tuple:
            out.append(f"return std::make_tuple({', '.join(results)});")
        else:
            out.append(f"return {results[0]};")
        return out

    # ---- host ops -------------------------------------------------------------------------------
    def host_op(self, op: Op) -> list[str]:
        if op.kind in (INPUT, PARAM):
            return []
        if op.kind == VIEW and self.g.values[op.out].kind == "list":
            return [f"const std::vector<at::Tensor> {list_var(op.out)} = {self.list_expr(op)};"]
        if op.kind == VIEW:
            return [f"at::Tensor {tensor_var(op.out)} = {self.view_expr(op)};"]
        if op.kind == LIB:
            if op.fn in ("lstm", "gru"):
                self.helpers.add("lstm")
                if self.custom:
                    self.helpers.update({"custom", "gemm_plain"})
                return [f"const std::vector<at::Tensor> {list_var(op.out)} = {self.rnn_expr(op)};"]
            if self.custom:
                # An own GEMM or convolution launched here, without an epilogue: its plain kernels are built.
                self.helpers.add("conv_plain" if op.fn in convolution.CONV_FNS else "gemm_plain")
            lines = [f"at::Tensor {tensor_var(op.out)} = {self.lib_expr(op)};"]
            if op.attrs.get("causal"):
                self.helpers.add("causal")
                lines.append(f"stitch_causal_fill({tensor_var(op.out)});")
            return lines
        if op.kind in (SCAN, FLIP, TRI):
            return [f"at::Tensor {tensor_var(op.out)} = {self.ordered_expr(op)};"]
        if op.kind == RANDOM:
            return [f"at::Tensor {tensor_var(op.out)} = {self.random_expr(op)};"]
        if op.kind == HOST:
            return self.host_scalar(op)
        if op.kind == ITEM:
            src = op.args[0]
            idx = op.args[1]
            if not (isinstance(src, Ref) and isinstance(idx, Const) and isinstance(idx.value, int)):
                raise Unsupported(f"{op.origin}: indexing a list result with {idx!r}")
            return [f"at::Tensor {tensor_var(op.out)} = {list_var(src.id)}.at({idx.value});"]
        raise Unsupported(f"{op.origin}: host step {op.kind}")

    def host_scalar(self, op: Op) -> list[str]:
        v = self.g.values[op.out]
        name = host_var(op.out)
        a = [self.scalar_expr(x) for x in op.args if not isinstance(x, str | tuple)]
        fn = op.fn
        if fn == "tuple":
            return []
        if fn == "check_shape":
            # The trace was specialised to this shape (see normalize.guard_shapes).
            src, want = op.args[0].id, op.attrs["shape"]
            dims = cpp_list([str(d) for d in want])
            return [
                f"TORCH_CHECK(({tensor_var(src)}.sizes().vec() == std::vector<int64_t>{dims}), "
                f'"{src}: ModelNew was generated for shape {want}; generate it again for other shapes");'
            ]
        if fn == "size":
            src = tensor_var(op.args[0].id)
            if len(op.args) > 1:
                return [f"const int64_t {name} = {src}.size({a[1]});"]
            return [f"const std::vector<int64_t> {name} = {src}.sizes().vec();"]
        if fn == "dim":
            return [f"const int64_t {name} = {tensor_var(op.args[0].id)}.dim();"]
        if fn == "numel":
            return [f"const int64_t {name} = {tensor_var(op.args[0].id)}.numel();"]
        if fn == "count":
            src = tensor_var(op.args[0].id)
            terms = " * ".join(f"{src}.size({d})" for d in op.attrs["dims"]) or "1"
            return [f"const int64_t {name} = {terms};"]
        if fn == "getitem":
            source = self.g.values[op.args[0].id]
            if source.kind != "shape":
                raise Unsupported(f"{op.origin}: indexing a {source.kind}")
            idx = op.args[1]
            vec = host_var(op.args[0].id)
            if isinstance(idx, Const) and isinstance(idx.value, int):
                i = idx.value
                pos = f"{vec}.size() - {-i}" if i < 0 else str(i)
                return [f"const int64_t {name} = {vec}[{pos}];"]
            if isinstance(idx, tuple) and idx[0] == "slice":
                start, stop, step = idx[1:]
                if step is not None and not (isinstance(step, Const) and step.value == 1):
                    raise Unsupported(f"{op.origin}: strided slice of a shape")
                s0 = self._shape_pos(start, vec, "0")
                s1 = self._shape_pos(stop, vec, f"{vec}.size()")
                return [f"const std::vector<int64_t> {name}({vec}.begin() + {s0}, {vec}.begin() + {s1});"]
            raise Unsupported(f"{op.origin}: shape index {idx!r}")
        ctype = {"int": "int64_t", "float": "double", "bool": "bool", "shape": "std::vector<int64_t>"}[v.kind]
        binary = {"add": "+", "sub": "-", "mul": "*", "truediv": "/", "div": "/", "gt": ">", "lt": "<",
                  "ge": ">=", "le": "<=", "eq": "==", "ne": "!="}  # fmt: skip
        if fn in binary and len(a) == 2:
            lhs = f"static_cast<double>({a[0]})" if fn in ("truediv", "div") else a[0]
            return [f"const {ctype} {name} = static_cast<{ctype}>({lhs} {binary[fn]} {a[1]});"]
        if fn == "floordiv" and len(a) == 2:
            expr = f"std::floor(static_cast<double>({a[0]}) / static_cast<double>({a[1]}))"
            return [f"const {ctype} {name} = static_cast<{ctype}>({expr});"]
        if fn == "mod" and len(a) == 2:
            expr = (
                f"({a[0]}) - ({a[1]}) * std::floor(static_cast<double>({a[0]}) / static_cast<double>({a[1]}))"
            )
            return [f"const {ctype} {name} = static_cast<{ctype}>({expr});"]
        if fn == "pow" and len(a) == 2:
            return [
                f"const {ctype} {name} = static_cast<{ctype}>(std::pow(static_cast<double>({a[0]}), {a[1]}));"
            ]
        if fn == "neg":
            return [f"const {ctype} {name} = -({a[0]});"]
        if fn in ("sqrt", "exp", "log", "sin", "cos", "tan", "floor", "ceil", "fabs", "log2", "log10"):
            return [f"const {ctype} {name} = static_cast<{ctype}>(std::{fn}(static_cast<double>({a[0]})));"]
        if fn in ("int", "float", "abs", "max", "min", "round"):
            if fn == "abs":
                return [f"const {ctype} {name} = std::abs({a[0]});"]
            if fn in ("max", "min") and len(a) == 2:
                return [f"const {ctype} {name} = std::{fn}<{ctype}>({a[0]}, {a[1]});"]
            if fn == "round":
                return [f"const {ctype} {name} = static_cast<{ctype}>(std::nearbyint({a[0]}));"]
            return [f"const {ctype} {name} = static_cast<{ctype}>({a[0]});"]
        if fn == "len":
            return [f"const int64_t {name} = static_cast<int64_t>({a[0]}.size());"]
        raise Unsupported(f"{op.origin}: host computation {fn}")

    def _shape_pos(self, x: Any, vec: str, default: str) -> str:
        if x is None:
            return default
        if isinstance(x, Const) and isinstance(x.value, int):
            return f"({vec}.size() - {-x.value})" if x.value < 0 else str(x.value)
        raise Unsupported("a non-constant slice of a shape")

    def list_expr(self, op: Op) -> str:
        src = tensor_var(op.args[0].id)
        args = op.attrs.get("args", [])
        kwargs = op.attrs.get("kwargs", {})
        dim = args[1] if len(args) > 1 else kwargs.get("dim", Const(0))
        if op.fn == "chunk":
            n = args[0] if args else kwargs["chunks"]
            return f"{src}.chunk({self.scalar_expr(n)}, {self.scalar_expr(dim)})"
        if op.fn == "split":
            size = args[0] if args else kwargs.get("split_size_or_sections", kwargs.get("split_size"))
            if isinstance(size, list):
                return f"{src}.split_with_sizes({self.int_list(size)}, {self.scalar_expr(dim)})"
            return f"{src}.split({self.scalar_expr(size)}, {self.scalar_expr(dim)})"
        if op.fn == "unbind":
            d = args[0] if args else kwargs.get("dim", Const(0))
            return f"{src}.unbind({self.scalar_expr(d)})"
        raise Unsupported(f"{op.origin}: list view {op.fn}")

    def view_expr(self, op: Op) -> str:
        src = tensor_var(op.args[0].id)
        fn = op.fn
        attrs = op.attrs
        if "shape" in attrs:
            return f"stitch_reshape({src}, {self.int_list(attrs['shape'])})"
        args = attrs.get("args", [])
        kwargs = attrs.get("kwargs", {})
        s = self.scalar_expr
        if fn in ("view", "reshape"):
            sizes = args if args else kwargs.get("shape", kwargs.get("size"))
            if isinstance(sizes, list) and len(sizes) == 1 and isinstance(sizes[0], Ref):
                sizes = sizes[0]
            if fn == "reshape":
                return f"stitch_reshape({src}, {self.int_list(sizes)})"
            return f"{src}.view({self.int_list(sizes)})"
        if fn == "flatten":
            start = args[0] if args else kwargs.get("start_dim", Const(0))
            end = args[1] if len(args) > 1 else kwargs.get("end_dim", Const(-1))
            return f"stitch_flatten({src}, {s(start)}, {s(end)})"
        if fn == "unflatten":
            return f"{src}.unflatten({s(args[0])}, {self.int_list(args[1])})"
        if fn == "unsqueeze":
            return f"{src}.unsqueeze({s(args[0] if args else kwargs['dim'])})"
        if fn == "squeeze":
            dim = args[0] if args else kwargs.get("dim")
            if dim is None:
                return f"{src}.squeeze()"
            if isinstance(dim, list):
                return f"{src}.squeeze({self.int_list(dim)})"
            return f"{src}.squeeze({s(dim)})"
        if fn == "squeeze_dims":
            expr = src
            for d in sorted(attrs["dims"], reverse=True):
                expr = f"{expr}.squeeze({d})"
            return expr
        if fn == "reshape_like":
            return f"stitch_reshape({src}, {tensor_var(attrs['like'].id)}.sizes())"
        if fn in ("transpose", "swapaxes"):
            d0 = args[0] if args else kwargs.get("dim0")
            d1 = args[1] if len(args) > 1 else kwargs.get("dim1")
            return f"{src}.transpose({s(d0)}, {s(d1)})"
        if fn == "t":
            return f"{src}.t()"
        if fn == "permute":
            dims = args if args else kwargs.get("dims")
            return f"{src}.permute({self.int_list(dims)})"
        if fn == "movedim":
            return f"{src}.movedim({s(args[0])}, {s(args[1])})"
        if fn == "expand":
            sizes = args if args else kwargs.get("size")
            if isinstance(sizes, list) and len(sizes) == 1 and isinstance(sizes[0], Ref):
                sizes = sizes[0]
            return f"{src}.expand({self.int_list(sizes)})"
        if fn in ("expand_as", "view_as", "reshape_as"):
            return f"{src}.{fn}({tensor_var(args[0].id)})"
        if fn == "narrow":
            return f"{src}.narrow({s(args[0])}, {s(args[1])}, {s(args[2])})"
        if fn == "unfold":
            return f"{src}.unfold({s(args[0])}, {s(args[1])}, {s(args[2])})"
        if fn == "select":
            return f"{src}.select({s(args[0])}, {s(args[1])})"
        if fn == "index":
            return self.index_expr(src, op)
        raise Unsupported(f"{op.origin}: view {fn}")

    def index_expr(self, src: str, op: Op) -> str:
        items = op.attrs["index"]
        rank = len(self.g.values[op.args[0].id].shape)
        consumed = sum(
            1 for it in items if not (it is None or (isinstance(it, tuple) and it[0] == "ellipsis"))
        )
        expr, dim = src, 0
        for it in items:
            if it is None:
                expr = f"{expr}.unsqueeze({dim})"
                dim += 1
            elif isinstance(it, tuple) and it[0] == "ellipsis":
                dim += rank - consumed
            elif isinstance(it, tuple) and it[0] == "slice":
                start, stop, step = it[1:]
                a = self.scalar_expr(start) if start is not None else "0"
                b = self.scalar_expr(stop) if stop is not None else "std::numeric_limits<int64_t>::max()"
                c = self.scalar_expr(step) if step is not None else "1"
                expr = f"{expr}.slice({dim}, {a}, {b}, {c})"
                dim += 1
            elif isinstance(it, Const | Ref):
                expr = f"{expr}.select({dim}, {self.scalar_expr(it)})"
            else:
                raise Unsupported(f"{op.origin}: index item {it!r}")
        return expr

    def ordered_expr(self, op: Op) -> str:
        """A scan, flip or triangle: a call of the synthesizer's own helper kernel (scans.py)."""
        src = tensor_var(op.args[0].id)
        at = op.attrs
        self.helpers.add(op.kind)
        if op.kind == SCAN:
            flags = [op.fn == "prod", at["reverse"], at["exclusive"]]
            return f"stitch_scan({src}, {at['dim']}, {', '.join(str(f).lower() for f in flags)})"
        if op.kind == FLIP:
            return f"stitch_flip({src}, {self.int_list([Const(d) for d in at['dims']])})"
        return f"stitch_tri({src}, {str(op.fn == 'triu').lower()}, {at['diagonal']})"

    def random_expr(self, op: Op) -> str:
        """The ATen call torch itself makes for the draw (F.dropout is at::dropout; torch.randn at::randn):
        the same call on the same generator draws the same numbers."""
        if op.fn == "dropout":
            return f"at::dropout({tensor_var(op.args[0].id)}, {op.attrs['p']!r}, true)"
        if op.fn in ("randn_like", "rand_like"):
            return f"at::{op.fn}({tensor_var(op.args[0].id)})"
        sizes = self.int_list([Const(n) for n in op.attrs["size"]])
        return f"at::{op.fn}({sizes}, {self.first_tensor()}.options().dtype(at::kFloat))"

    def opt_tensor(self, a: Any) -> str:
        return f"c10::optional<at::Tensor>({tensor_var(a.id)})" if isinstance(a, Ref) else "c10::nullopt"

    def lib_expr(self, op: Op) -> str:
        t = [tensor_var(a.id) if isinstance(a, Ref) else self.scalar_expr(a) for a in op.args]
        fn = op.fn
        at = op.attrs
        custom = self.custom
        if fn in ("linear", "matmul", "mm", "bmm", "addmm", "baddbmm") and custom:
            self.helpers.add("custom")
        if fn == "linear":
            bias = self.opt_tensor(op.args[2]) if at.get("bias") else "c10::nullopt"
            if not custom:
                self.helpers.add("linear")
            return f"stitch_linear({t[0]}, {t[1]}, {bias})"
        if fn in ("matmul", "mm", "bmm"):
            return f"{'stitch_' if custom else 'at::'}{fn}({t[0]}, {t[1]})"
        if fn in ("addmm", "baddbmm"):
            if custom:
                if fn == "baddbmm" or at["beta"] != 1 or at["alpha"] != 1:
                    raise Unsupported(f"{op.origin}: no custom kernel for {fn} with beta/alpha")
                return f"stitch_addmm({t[0]}, {t[1]}, {t[2]})"
            return f"at::{fn}({t[0]}, {t[1]}, {t[2]}, {at['beta']}, {at['alpha']})"
        if fn == "einsum":
            if custom:
                return self.custom_einsum_expr(op, t)
            return f'at::einsum("{at["equation"]}", {{{", ".join(t)}}})'
        if fn in convolution.CONV_FNS:
            bias = self.opt_tensor(op.args[2]) if at.get("bias") else "c10::nullopt"
            if custom:
                return self.custom_conv_expr(op, t, bias)
            stride = self.int_list([Const(x) for x in at["stride"]])
            dil = self.int_list([Const(x) for x in at["dilation"]])
            if fn.startswith("conv_transpose"):
                pads = [self.int_list([Const(x) for x in at[k]]) for k in ("padding", "output_padding")]
                return (
                    f"at::{fn}({t[0]}, {t[1]}, {bias}, {stride}, {pads[0]}, {pads[1]}, {at['groups']}, {dil})"
                )
            pad = at["padding"]
            pad_expr = f'"{pad}"' if isinstance(pad, str) else self.int_list([Const(p) for p in pad])
            return f"at::{fn}({t[0]}, {t[1]}, {bias}, {stride}, {pad_expr}, {dil}, {at['groups']})"
        if fn == "sdpa":
            if custom:
                raise Unsupported(f"{op.origin}: no custom kernel for attention with an explicit mask")
            mask = self.opt_tensor(op.args[3]) if at.get("mask") else "c10::nullopt"
            scale = (
                f"c10::optional<double>({at['scale']!r})" if at.get("scale") is not None else "c10::nullopt"
            )
            causal = "true" if at["is_causal"] else "false"
            return f"at::scaled_dot_product_attention({t[0]}, {t[1]}, {t[2]}, {mask}, 0.0, {causal}, {scale})"
        if fn == "cat":
            self.helpers.add("cat")
            written = [isinstance(a, Ref) and self.cat_into.get(a.id, ("",))[0] == op.out for a in op.args]
            if any(written):
                flags = ", ".join("true" if w else "false" for w in written)
                return f"stitch_cat_into(*{cat_into_var(op.out)}, {{{', '.join(t)}}}, {{{flags}}})"
            return f"stitch_cat({{{', '.join(t)}}}, {at['dim']})"
        if fn == "index":
            self.helpers.add("index")
            return f"stitch_index({t[0]}, {at['dim']}, {t[1]})"
        if fn == "roll":
            self.helpers.add("roll")
            shifts = ", ".join(str(v) for v in at["shifts"])
            dims = ", ".join(str(v) for v in at["dims"])
            return f"stitch_roll({t[0]}, std::vector<int64_t>{{{shifts}}}, std::vector<int64_t>{{{dims}}})"
        raise Unsupported(f"{op.origin}: library call {fn}")

    def rnn_expr(self, op: Op) -> str:
        """nn.LSTM / nn.GRU through rnn.py's host loop: {output, h_n[, c_n]}."""
        at = op.attrs
        t = [tensor_var(a.id) for a in op.args]
        n = at["states"]
        states = (t[1 : 1 + n] + ["at::Tensor()"] * 2)[:2]
        flags = [at["layers"], at["directions"], str(at["bias"]).lower(), str(at["batch_first"]).lower()]
        gates = 4 if op.fn == "lstm" else 3
        return (
            f"stitch_rnn({t[0]}, {{{', '.join(t[1 + n :])}}}, {', '.join(states)}, {gates}, "
            + ", ".join(str(f) for f in flags)
            + ")"
        )

    def custom_conv_expr(self, op: Op, t: list[str], bias: str) -> str:
        """A convolution or its transpose through the synthesizer's direct kernel (convolution.py)."""
        at = op.attrs
        self.helpers.add("conv")
        nd = int(op.fn[-2])
        pad = at["padding"]
        if isinstance(pad, str):
            kernel = self.g.values[op.args[1].id].shape[2:]
            lo, hi = convolution.same_padding(pad, kernel, at["dilation"])
        else:
            lo = hi = pad
        lists = [at["stride"], lo, hi, at["dilation"], at.get("output_padding", [0] * nd)]
        args = ", ".join(self.int_list([Const(x) for x in v]) for v in lists)
        transposed = str(op.fn.startswith("conv_transpose")).lower()
        into = self.into_args(op.out)
        call = "stitch_conv_to" if into else "stitch_conv"
        return f"{call}({t[0]}, {t[1]}, {bias}, {args}, {at['groups']}, {transposed}{into})"

    def custom_einsum_expr(self, op: Op, t: list[str]) -> str:
        """A two-operand einsum as one batched GEMM of the synthesizer's kernel (einsum.py)."""
        shapes = [self.g.values[a.id].shape if isinstance(a, Ref) else () for a in op.args]
        try:
            form = einsum.plan(op.attrs["equation"], shapes)
        except Unsupported as exc:
            raise Unsupported(f"{op.origin}: {exc}") from None
        self.helpers.update({"custom", "einsum"})
        perms = [self.int_list([Const(x) for x in p]) for p in (form.perm_a, form.perm_b, form.perm_out)]
        counts = f"{form.nbatch}, {form.nm}, {form.nn}"
        return f"stitch_einsum_gemm({t[0]}, {t[1]}, {perms[0]}, {perms[1]}, {counts}, {perms[2]})"

    # ---- shared launch glue ------------------------------------------------------------------------
    def domain_lines(self, info: KernelInfo) -> tuple[list[str], str]:
        """Lines computing the kernel's main domain shape at run time; returns (lines, variable)."""
        k = info.kernel
        var = f"S_{k.name}"
        if k.kind == "pool":
            return self.pool_domain(info)
        shapes = [f"{tensor_var(o.id)}.sizes()" for o in info.operands if o.domain == "main"]
        rank = len(self.g.values[k.domain].shape)
        lines = [f"const std::vector<int64_t> {var} = stitch::broadcast({cpp_list(shapes)});"]
        lines.append(f'TORCH_CHECK({var}.size() == {rank}, "{k.name}: unexpected rank");')
        return lines, var

    def pool_domain(self, info: KernelInfo) -> tuple[list[str], str]:
        k = info.kernel
        pool = k.pool
        assert pool is not None
        nd = pool.attrs["nd"]
        var_in, var = f"SI_{k.name}", f"S_{k.name}"
        shapes = [f"{tensor_var(o.id)}.sizes()" for o in info.operands if o.domain == "in"]
        rank_in = len(self.g.values[pool.args[0].id].shape)
        lines = [
            f"const std::vector<int64_t> {var_in} = stitch::broadcast({cpp_list(shapes)});",
            f'TORCH_CHECK({var_in}.size() == {rank_in}, "{k.name}: unexpected rank");',
            f"std::vector<int64_t> {var}({var_in}.begin(), {var_in}.end());",
        ]
        for i in range(nd):
            d = rank_in - nd + i
            if pool.fn.startswith("adaptive"):
                lines.append(f"{var}[{d}] = {pool.attrs['output_size'][i]};")
            else:
                dil = pool.attrs.get("dilation", [1] * nd)[i]
                lines.append(
                    f"{var}[{d}] = stitch::pool_out({var_in}[{d}], {pool.attrs['kernel'][i]}, "
                    f"{pool.attrs['padding'][i]}, {pool.attrs['stride'][i]}, {dil}, "
                    f"{'true' if pool.attrs['ceil_mode'] else 'false'});"
                )
        return lines, var

    def operand_lines(self, info: KernelInfo, domain_var: str, row_dims: str, col_dims: str) -> list[str]:
        """Checks each operand against its access kind and builds the descriptors of strided ones."""
        k = info.kernel
        lines: list[str] = []
        descs: list[str] = []
        for i, o in enumerate(info.operands):
            src = tensor_var(o.id)
            dvar = domain_var if o.domain == "main" else f"SI_{k.name}"
            if o.access == "contig":
                lines.append(f"const at::Tensor O{i}_{k.name} = stitch_dense({src});")
                lines.append(
                    f"TORCH_CHECK(O{i}_{k.name}.sizes() == at::IntArrayRef({dvar}), "
                    f'"{k.name}: operand {o.id} shape");'
                )
            elif o.access == "scalar":
                lines.append(f"const at::Tensor& O{i}_{k.name} = {src};")
                lines.append(
                    f'TORCH_CHECK({src}.numel() == 1, "{k.name}: operand {o.id} must have one element");'
                )
            else:
                lines.append(f"const at::Tensor& O{i}_{k.name} = {src};")
                if o.domain == "main":
                    descs.append(f"stitch::make_desc({src}, {dvar}, {row_dims}, {col_dims})")
                else:
                    rank = f"static_cast<int>({dvar}.size())"
                    descs.append(f"stitch::make_desc({src}, {dvar}, stitch::range(0, {rank}), {{}})")
        if descs:
            lines.append(f"const std::vector<stitch::Desc> D_{k.name} = {cpp_list(descs)};")
        return lines

    def output_lines(self, info: KernelInfo, shape_expr: str) -> list[str]:
        k = info.kernel
        out = tensor_var(k.root)
        dtype = self.g.values[k.root].dtype
        if k.inplace:
            target = f"O{info.operand_index(k.inplace)}_{k.name}"
            lines = [f"at::Tensor {out} = {target};"]
            if k.root in self.g.writebacks:
                # A contiguous operand is the buffer itself (a strided one would be a copy, updated in vain).
                lines.insert(
                    0,
                    f"TORCH_CHECK({tensor_var(k.inplace)}.is_contiguous(), "
                    f'"{k.name}: the model state {k.inplace} must be contiguous to be updated in place");',
                )
            return lines
        return [f"at::Tensor {out} = at::empty({shape_expr}, opts.dtype({AT_DTYPE[dtype]}));"]

    def ptr(self, info: KernelInfo, i: int) -> str:
        o = info.operands[i]
        ctype = CTYPE[self.g.values[o.id].dtype]
        return f"O{i}_{info.kernel.name}.data_ptr<{ctype}>()"


__all__ = [
    "CTYPE",
    "Host",
    "KernelBodies",
    "KernelInfo",
    "Scope",
    "acc_combine",
    "acc_final",
    "acc_init",
    "acc_type",
    "acc_update",
    "analyze",
    "cname",
    "flat_load",
    "local_var",
    "tensor_var",
]
