"""Whole-file D11 checks on model_new.py: imports, tampering, I/O, threads, subclasses, streams, seeds."""

from __future__ import annotations

import ast
import io
import re
import tokenize
from collections.abc import Iterator
from dataclasses import dataclass, field

from stitchcuda.verifier.static_graph import Program
from stitchcuda.verifier.static_names import Names, const_str, line, module_rule
from stitchcuda.verifier.static_report import Hits
from stitchcuda.verifier.static_vocab import (
    AUTOCAST,
    BENIGN_DUNDERS,
    FRAME_ATTRS,
    GPU_CONTROL,
    GRAPH_NAMES,
    HARMLESS_SET,
    KNOWN_MODULES,
    LOW_DTYPES,
    LOW_METHODS,
    MEMORY_PROBE,
    PROTECTED_ROOTS,
    RANDOM_METHODS,
    SEED_CALLS,
    STREAM_JOIN_METHODS,
    STREAM_MAKERS,
    TORCH_RANDOM,
)

TENSOR_BASES = frozenset(
    {"torch.Tensor", "torch.nn.Parameter", "torch.nn.parameter.Parameter", "torch._C.TensorBase",
     "torch._C._TensorBase", "torch.nn.Buffer", "torch.nn.parameter.Buffer"}
)  # fmt: skip
ALLOCATORS = frozenset(
    {
        "torch.empty",
        "torch.zeros",
        "torch.ones",
        "torch.full",
        "torch.randn",
        "torch.rand",
        "torch.empty_strided",
    }
)
HOOKS = frozenset({"register_forward_hook", "register_forward_pre_hook", "register_module_forward_hook"})
OVERRIDES = frozenset(
    {"__call__", "_call_impl", "_wrapped_call_impl", "__getattribute__", "__getattr__", "__setattr__"}
)
GiB = 1 << 30


@dataclass
class Streams:
    """Stream creations and joins seen in Python; C++ adds its own before the verdict."""

    made: list[str] = field(default_factory=list)
    joined: list[str] = field(default_factory=list)


@dataclass
class Reference:
    constants: set[str] = field(default_factory=set)
    forward: list[str] = field(default_factory=list)
    fp32: bool = True


def reference_info(source: str) -> Reference:
    ref = Reference()
    ref.fp32 = not re.search(r"\b(float16|half|bfloat16|float8\w*)\b", source)
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return ref
    names = Names(tree, "")
    for stmt in tree.body:
        targets = (
            stmt.targets
            if isinstance(stmt, ast.Assign)
            else [stmt.target]
            if isinstance(stmt, ast.AnnAssign)
            else []
        )
        for t in targets:
            ref.constants |= {
                n.id for n in ast.walk(t) if isinstance(n, ast.Name) and not n.id.startswith("__")
            }
        if isinstance(stmt, ast.ClassDef) and stmt.name == "Model":
            for f in stmt.body:
                if isinstance(f, ast.FunctionDef) and f.name == "forward":
                    ref.forward = shape_tokens(f.body, names)
    return ref


def shape_tokens(body: list[ast.stmt], names: Names) -> list[str]:
    """A name-insensitive token stream of a function body, with calls resolved to qualified names."""
    out: list[str] = []
    for stmt in body:
        for n in ast.walk(stmt):
            if isinstance(n, ast.Call):
                out.append("call:" + str(names.qualname(n.func) or getattr(n.func, "attr", "?")))
            elif isinstance(n, ast.Constant):
                out.append(f"const:{n.value!r}")
            elif not isinstance(n, ast.Name | ast.Load | ast.Store | ast.arg | ast.arguments):
                out.append(type(n).__name__)
    return out


def _walk(tree: ast.AST) -> Iterator[tuple[ast.AST, ast.AST | None, int | None]]:
    """Every node with its parent and the id of the innermost enclosing function (None at import time)."""
    todo: list[tuple[ast.AST, ast.AST | None, int | None]] = [(tree, None, None)]
    while todo:
        node, parent, fn = todo.pop()
        yield node, parent, fn
        inner = id(node) if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda) else fn
        for child in ast.iter_child_nodes(node):
            # Decorators and defaults run where the def statement runs.
            outer = isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and (
                child in node.decorator_list or child is node.args
            )
            todo.append((child, node, fn if outer else inner))


class ModuleScan:
    """One pass over every node of model_new.py."""

    def __init__(
        self, program: Program, names: Names, hits: Hits, forward_ids: set[int], ref: Reference, path: str
    ) -> None:
        self.program, self.names, self.hits = program, names, hits
        self.forward_ids, self.ref, self.path = forward_ids, ref, path
        self.streams = Streams()
        self.probe_names: set[str] = set()
        self.ext_aliases = names.ext_aliases() | set(names.ext_names)
        # Build calls (and their function references) the run serves from the Verifier's build.
        self.served_calls: set[int] = set()
        self.served_funcs: set[int] = set()

    def hit(self, rule: str, detail: str, node: ast.AST) -> None:
        if rule == "D11.precision" and not self.ref.fp32:
            return
        self.hits.add(rule, detail, f"{self.path}:{line(node)}")

    def run(self, source: str) -> Streams:
        for node in ast.walk(self.program.tree):
            if self.names.build_call_name(node) is not None:
                self.served_funcs.add(id(node.func))  # type: ignore[attr-defined]
                self.served_calls.add(id(node))
        for node in _in_try(self.program.tree):
            if id(node) in self.served_calls:
                self.hit("D11.guarded-build", "the extension build call is guarded by try/except", node)
        for node in ast.walk(self.program.tree):
            if isinstance(node, ast.Assign) and _calls(node.value, self.names, MEMORY_PROBE):
                for t in node.targets:
                    self.probe_names |= {n.id for n in ast.walk(t) if isinstance(n, ast.Name)}
        for node, parent, fn in _walk(self.program.tree):
            where = "import" if fn is None else ("forward" if fn in self.forward_ids else "other")
            self.visit(node, parent, where)
        self.imports()
        self.structure()
        self.comments(source)
        return self.streams

    # -- per node -----------------------------------------------------------------------------------
    def visit(self, node: ast.AST, parent: ast.AST | None, where: str) -> None:
        if isinstance(node, ast.Name | ast.Attribute) and not (
            isinstance(parent, ast.Attribute) and parent.value is node
        ):
            self.reference(node)
        if isinstance(node, ast.Attribute) and node.attr in FRAME_ATTRS - BENIGN_DUNDERS:
            self.hit("D11.introspection", f"reads .{node.attr} (frames, code objects or globals)", node)
        if isinstance(node, ast.Assign | ast.AugAssign | ast.AnnAssign | ast.Delete):
            targets = node.targets if isinstance(node, ast.Assign | ast.Delete) else [node.target]
            for t in targets:
                self.write(t, node, top=parent is self.program.tree)
        elif isinstance(node, ast.Call):
            self.call(node, where)
        elif isinstance(node, ast.ClassDef):
            self.classdef(node, top=parent is self.program.tree)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            if parent is self.program.tree and node.name in {"get_inputs", "get_init_inputs"}:
                self.hit(
                    "D11.redefine", f"defines {node.name}() (the problem comes from the reference only)", node
                )
            if node.name in {"__torch_dispatch__", "__torch_function__"}:
                self.hit("D11.tensor-subclass", f"defines {node.name}", node)
        elif isinstance(node, ast.Raise) and node.exc is not None:
            exc = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
            if self.names.qualname(exc) in {"builtins.SystemExit", "builtins.KeyboardInterrupt"}:
                self.hit("D11.exit", "raises SystemExit/KeyboardInterrupt", node)
        elif isinstance(node, ast.Global) and where != "import":
            for n in node.names:
                if n in self.ref.constants:
                    self.hit(
                        "D11.redefine", f"rebinds the reference's module constant {n} from a function", node
                    )

    def reference(self, node: ast.Name | ast.Attribute) -> None:
        if isinstance(node, ast.Name) and node.id == "Model" and isinstance(node.ctx, ast.Load):
            self.hit("D11.reference", "names the reference class Model", node)
        if isinstance(node, ast.Attribute) and node.attr == "Model":
            self.hit("D11.reference", f"reaches a Model class: {ast.unparse(node)[:60]}", node)
        if id(node) in self.served_funcs:
            return
        q = self.names.qualname(node)
        if q is None or self.names.is_ext(q):
            return
        if self.served_funcs and q in PATH_STRINGS:
            return  # path arithmetic for cpp_extension.load's sources reads nothing
        rule = module_rule(q)
        if rule:
            self.hit(rule, f"uses {q}", node)

    def write(self, target: ast.expr, node: ast.stmt, top: bool) -> None:
        if isinstance(target, ast.Tuple | ast.List):
            for e in target.elts:
                self.write(e, node, top)
            return
        if isinstance(target, ast.Starred):
            target = target.value
        if isinstance(target, ast.Name):
            if top and target.id in {"get_inputs", "get_init_inputs", "Model"}:
                self.hit("D11.redefine", f"rebinds {target.id}", node)
            elif top and target.id in self.ref.constants:
                self.hit("D11.redefine", f"reassigns the reference's module constant {target.id}", node)
            served = isinstance(node, ast.Assign) and (
                id(node.value) in self.served_calls
                or (top and isinstance(node.value, ast.Constant) and node.value.value is None)
            )
            if target.id in self.ext_aliases and isinstance(node, ast.Assign) and not served:
                self.hit("D11.guarded-build", f"rebinds the extension name {target.id}", node)
            return
        base = target.value if isinstance(target, ast.Subscript) else target
        q = self.names.qualname(base)
        if q is None or self.names.is_ext(q) or q.split(".")[0] not in PROTECTED_ROOTS:
            return
        self.tamper(q, node, ast.unparse(target)[:80])

    def tamper(self, q: str, node: ast.AST, text: str) -> None:
        if q.startswith("torch.backends."):
            self.hit("D11.global-state", f"writes {text}", node)
        elif q.startswith(("os.environ", "os.environb")):
            self.hit("D11.environ", f"writes {text}", node)
        else:
            self.hit("D11.monkeypatch", f"replaces {text}", node)

    def call(self, node: ast.Call, where: str) -> None:
        q = self.names.qualname(node.func) or ""
        m = node.func.attr if isinstance(node.func, ast.Attribute) else ""
        if q in {"builtins.setattr", "builtins.delattr"} and node.args:
            q0 = self.names.qualname(node.args[0])
            if q0 and not self.names.is_ext(q0) and q0.split(".")[0] in PROTECTED_ROOTS:
                self.tamper(q0, node, f"{q[9:]}({ast.unparse(node.args[0])}, ...)")
        if q.endswith((".__setattr__", ".__delattr__")) or m in {"__setattr__", "__delattr__"}:
            self.hit("D11.monkeypatch", f"calls {ast.unparse(node.func)[:60]}", node)
        if q == "builtins.getattr" and len(node.args) >= 2 and const_str(node.args[1]) is None:
            q0 = self.names.qualname(node.args[0])
            if q0 and not self.names.is_ext(q0):
                self.hit("D11.dynamic-code", f"computed getattr on module {q0}", node)
        setter = (q.startswith("torch.set_") and q not in HARMLESS_SET) or q.startswith(
            ("torch.use_deterministic", "torch._C._set_")
        )
        if setter or (
            q.startswith("torch.backends.") and (q.endswith((".flags", ".set_flags")) or ".set_" in q)
        ):
            self.hit("D11.global-state", f"calls {q}", node)
        if q.startswith(GPU_CONTROL):
            self.hit("D11.gpu-control", f"calls {q}", node)
        if q.startswith(MEMORY_PROBE):
            self.hit("D11.memory-probe", f"calls {q}", node)
        if q in SEED_CALLS or m in ("manual_seed", "initial_seed", "get_rng_state"):
            self.hit("D11.seed", f"seeds a random generator: {ast.unparse(node.func)[:60]}", node)
        elif self._random(q, m):
            if where == "import":
                self.hit("D11.seed", f"generates random data at import: {ast.unparse(node.func)[:60]}", node)
            elif where == "forward" and not q.startswith("torch."):
                self.hit("D11.seed", f"generates random data on the forward path: {q or m}", node)
            elif where == "other":
                self.hit("D11.random", f"random data outside forward: {ast.unparse(node.func)[:60]}", node)
        if q.startswith(STREAM_MAKERS) or (m == "Stream" and "cuda" in ast.unparse(node.func)):
            self.streams.made.append(f"{self.path}:{line(node)}")
        if m in STREAM_JOIN_METHODS or q == "torch.cuda.synchronize":
            self.streams.joined.append(f"{self.path}:{line(node)}")
        if q.startswith(GRAPH_NAMES) or m in {"replay", "capture_begin"}:
            self.hit("D11.cuda-graph", f"CUDA graph use: {ast.unparse(node.func)[:60]}", node)
        if m == "elapsed_time" or (
            q == "torch.cuda.Event" and any(k.arg == "enable_timing" for k in node.keywords)
        ):
            self.hit("D11.timing", f"CUDA event timing: {ast.unparse(node.func)[:60]}", node)
        if m in HOOKS:
            self.hit("D11.call-override", f"registers a hook: .{m}()", node)
        self.precision(node, q, m)
        if q == "builtins.float" and node.args and (const_str(node.args[0]) or "").strip().lower() == "nan":
            self.hit("D11.nan-literal", "float('nan')", node)
        if q in ALLOCATORS:
            self.allocation(node, q)

    def _random(self, q: str, m: str) -> bool:
        if q.startswith("torch.") and q.rsplit(".", 1)[-1] in TORCH_RANDOM and q.count(".") == 1:
            return True
        return q.startswith(("random.", "numpy.random.", "torch.nn.init.")) or m in RANDOM_METHODS

    def precision(self, node: ast.Call, q: str, m: str) -> None:
        if m in LOW_METHODS and not q:
            self.hit("D11.precision", f".{m}() cast", node)
        if q.startswith(AUTOCAST):
            self.hit("D11.precision", f"{q} (autocast)", node)
        values = list(node.args) + [k.value for k in node.keywords]
        for v in values:
            vq = self.names.qualname(v)
            if vq in LOW_DTYPES:
                self.hit(
                    "D11.precision",
                    f"reduced-precision dtype {vq} in {ast.unparse(node.func)[:40]}(...)",
                    node,
                )
        for k in node.keywords:
            val = const_str(k.value)
            if k.arg == "input_precision" and val in {"tf32", "tf32x3"}:
                self.hit("D11.precision", f"input_precision={val!r}", node)
            if k.arg == "allow_tf32" and isinstance(k.value, ast.Constant) and k.value.value is True:
                self.hit("D11.precision", "allow_tf32=True", node)
        if q == "triton.language.dot":
            precise = any(
                (k.arg == "input_precision" and const_str(k.value) == "ieee")
                or (k.arg == "allow_tf32" and isinstance(k.value, ast.Constant) and k.value.value is False)
                for k in node.keywords
            )
            if not precise:
                self.hit("D11.tf32-default", "tl.dot without input_precision='ieee' runs fp32 in TF32", node)

    def allocation(self, node: ast.Call, q: str) -> None:
        dims: list[ast.expr] = []
        for a in node.args[: 1 if q == "torch.full" else None]:
            dims.extend(a.elts if isinstance(a, ast.Tuple | ast.List) else [a])
        if any(isinstance(n, ast.Name) and n.id in self.probe_names for d in dims for n in ast.walk(d)):
            self.hit("D11.memory", f"{q} sized from a free-memory query", node)
            return
        total = 1
        for d in dims:
            v = _const_int(d)
            if v is None:
                return
            total *= v
        if dims and total * 4 >= GiB:
            self.hit("D11.memory", f"{q} of {total * 4 / GiB:.1f} GiB from constant sizes", node)

    def classdef(self, node: ast.ClassDef, top: bool) -> None:
        for b in node.bases:
            qb = self.names.qualname(b) or ""
            local = isinstance(b, ast.Name) and b.id in self.program.classes
            if qb in TENSOR_BASES or (local and self._tensor_class(b.id)):  # type: ignore[attr-defined]
                self.hit("D11.tensor-subclass", f"class {node.name} derives from a tensor type", node)
        if top and node.name == "Model":
            self.hit("D11.redefine", "defines a class named Model", node)
        if node.name == "ModelNew":
            for b in node.bases:
                if not self._module_base(b):
                    self.hit(
                        "D11.modelnew-base", f"ModelNew derives from {ast.unparse(b)}, not nn.Module", node
                    )
            for stmt in node.body:
                if isinstance(stmt, ast.FunctionDef) and stmt.name in OVERRIDES:
                    self.hit("D11.call-override", f"ModelNew overrides {stmt.name}", stmt)

    def _tensor_class(self, name: str, depth: int = 0) -> bool:
        cls = self.program.classes.get(name)
        if cls is None or depth > 8:
            return False
        for b in cls.bases:
            if (self.names.qualname(b) or "") in TENSOR_BASES:
                return True
            if isinstance(b, ast.Name) and self._tensor_class(b.id, depth + 1):
                return True
        return False

    def _module_base(self, b: ast.expr, depth: int = 0) -> bool:
        if self.names.qualname(b) in {"torch.nn.Module", "torch.nn.modules.module.Module"}:
            return True
        if (
            isinstance(b, ast.Name)
            and b.id in self.program.classes
            and b.id not in {"Model", "ModelNew"}
            and depth < 8
        ):
            bases = self.program.classes[b.id].bases
            return bool(bases) and all(self._module_base(x, depth + 1) for x in bases)
        return False

    # -- whole file ---------------------------------------------------------------------------------
    def imports(self) -> None:
        for imp in self.names.imports:
            full = f"{imp.module}.{imp.name}" if imp.name else imp.module
            anchor = ast.Pass(lineno=imp.line)
            if imp.name == "Model":
                self.hit("D11.reference", f"imports Model from {imp.module}", anchor)
            if imp.module in self.names.ext_names:
                if not imp.top_level or imp.in_try:
                    self.hit("D11.guarded-build", "the extension import is guarded (try/if/function)", anchor)
                continue
            if imp.star:
                self.hit("D11.import", f"star import from {imp.module}", anchor)
            if self.served_funcs and full in SERVED_IMPORTS:
                continue  # the build functions the run serves from the Verifier's build
            rule = module_rule(full) or module_rule(imp.module)
            if rule:
                self.hit(rule, f"imports {full}", anchor)
            elif rule is None and imp.module.split(".")[0] not in KNOWN_MODULES:
                self.hit("D11.import", f"imports {imp.module}, outside the known set", anchor)

    def structure(self) -> None:
        anchor = ast.Pass(lineno=1)
        if "ModelNew" not in self.program.classes:
            self.hit("D11.structure", "no class ModelNew", anchor)
            return
        if self.program.method("ModelNew", "forward") is None:
            self.hit("D11.structure", "ModelNew has no forward method", self.program.classes["ModelNew"])
        init = self.program.method("ModelNew", "__init__")
        if init is not None and init.params:
            used = {
                n.id for n in ast.walk(init.node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)
            }
            if not used & set(init.params):
                self.hit(
                    "D11.ignores-init-args", f"ModelNew.__init__ ignores {', '.join(init.params)}", init.node
                )
        forward = self.program.method("ModelNew", "forward")
        if forward is not None and self.ref.forward and not isinstance(forward.node, ast.Lambda):
            mine = shape_tokens(forward.node.body, self.names)
            if mine == self.ref.forward:
                self.hit("D11.ref-copy", "ModelNew.forward is a copy of the reference forward", forward.node)
        reached = {id(f.node) for f, _ in self.program.reach()}
        for name in sorted(self.program.triton_names()):
            if all(id(f.node) not in reached for f in self.program.functions[name]):
                self.hit(
                    "D11.unlaunched-kernel", f"Triton kernel {name} is never launched from forward", anchor
                )

    def comments(self, source: str) -> None:
        aliases = sorted(self.ext_aliases | self.program.triton_names())
        if not aliases:
            return
        pattern = re.compile(r"\b(" + "|".join(map(re.escape, aliases)) + r")\s*(\.\s*\w+\s*\(|\[)")
        try:
            for tok in tokenize.generate_tokens(io.StringIO(source).readline):
                if tok.type == tokenize.COMMENT and pattern.search(tok.string):
                    self.hit(
                        "D11.commented-launch",
                        f"commented-out call: {tok.string[:80]}",
                        ast.Pass(lineno=tok.start[0]),
                    )
        except (tokenize.TokenError, SyntaxError):
            return


PATH_STRINGS = {f"os.path.{f}" for f in ("join", "dirname", "basename", "abspath", "normpath", "split")}
SERVED_IMPORTS = {
    "torch.utils.cpp_extension",
    "torch.utils.cpp_extension.load",
    "torch.utils.cpp_extension.load_inline",
}


def _in_try(tree: ast.Module) -> list[ast.AST]:
    """Every node inside a try statement's body or handlers."""
    out: list[ast.AST] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Try | ast.TryStar):
            for stmt in [*node.body, *node.handlers]:
                out.extend(ast.walk(stmt))
    return out


def _calls(node: ast.AST, names: Names, prefixes: tuple[str, ...]) -> bool:
    return any(
        isinstance(n, ast.Call) and (names.qualname(n.func) or "").startswith(prefixes)
        for n in ast.walk(node)
    )


def _const_int(node: ast.AST) -> int | None:
    try:
        value = ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult | ast.LShift | ast.Add):
            a, b = _const_int(node.left), _const_int(node.right)
            if a is None or b is None:
                return None
            if isinstance(node.op, ast.Mult):
                return a * b
            return a << b if isinstance(node.op, ast.LShift) and b < 64 else a + b
        return None
    return value if isinstance(value, int) and not isinstance(value, bool) else None
