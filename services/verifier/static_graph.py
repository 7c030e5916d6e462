"""The call graph of model_new.py: classes, functions, instance attributes, what ModelNew.forward reaches."""

from __future__ import annotations

import ast
from dataclasses import dataclass, field

from stitchcuda.verifier.static_names import Names
from stitchcuda.verifier.static_vocab import TRITON_JIT

FuncNode = ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda
ENTRY_METHODS = ("forward", "__call__", "_call_impl", "_wrapped_call_impl")
HOOK_REGISTRARS = frozenset(
    {"register_forward_hook", "register_forward_pre_hook", "register_module_forward_hook",
     "register_module_forward_pre_hook"}
)  # fmt: skip


@dataclass
class Func:
    node: FuncNode
    name: str
    cls: str | None
    params: list[str]
    self_name: str | None
    decorators: list[str] = field(default_factory=list)
    is_triton: bool = False
    # True for a method whose self is the instance (not a staticmethod or classmethod).
    bound: bool = False


def _params(node: FuncNode) -> list[str]:
    a = node.args
    names = [p.arg for p in a.posonlyargs + a.args]
    if a.vararg:
        names.append(a.vararg.arg)
    names += [p.arg for p in a.kwonlyargs]
    if a.kwarg:
        names.append(a.kwarg.arg)
    return names


class Program:
    """Index of the definitions in model_new.py and the functions ModelNew.forward can reach."""

    def __init__(self, tree: ast.Module, names: Names) -> None:
        self.tree = tree
        self.names = names
        self.classes: dict[str, ast.ClassDef] = {}
        self.methods: dict[str, dict[str, Func]] = {}
        self.functions: dict[str, list[Func]] = {}
        self.lambdas: dict[int, Func] = {}
        self.attr_types: dict[str, dict[str, str]] = {}
        self.attr_alias: dict[str, dict[str, ast.expr]] = {}
        self.hook_targets: list[ast.expr] = []
        self._index(tree.body, cls=None, prefix="")
        self._index_attrs()

    # -- index --------------------------------------------------------------------------------------
    def _func(self, node: FuncNode, name: str, cls: str | None) -> Func:
        params = _params(node)
        decorators: list[str] = []
        bound = False
        if not isinstance(node, ast.Lambda):
            for d in node.decorator_list:
                target = d.func if isinstance(d, ast.Call) else d
                decorators.append(self.names.qualname(target) or ast.unparse(target))
            bound = cls is not None and not ({"staticmethod", "builtins.staticmethod"} & set(decorators))
        self_name = params[0] if bound and params else None
        is_triton = any(d.startswith(TRITON_JIT) for d in decorators)
        return Func(
            node, name, cls, params[1:] if self_name else params, self_name, decorators, is_triton, bound
        )

    def _index(self, body: list[ast.stmt], cls: str | None, prefix: str) -> None:
        for stmt in body:
            if isinstance(stmt, ast.ClassDef):
                self.classes.setdefault(stmt.name, stmt)
                self.methods.setdefault(stmt.name, {})
                self._index(stmt.body, cls=stmt.name, prefix=f"{stmt.name}.")
            elif isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef):
                f = self._func(stmt, prefix + stmt.name, cls)
                if cls is not None and prefix == f"{cls}.":
                    self.methods[cls].setdefault(stmt.name, f)
                else:
                    self.functions.setdefault(stmt.name, []).append(f)
                self._index(stmt.body, cls=None, prefix=f"{prefix}{stmt.name}.<locals>.")
            elif isinstance(stmt, ast.Assign | ast.AnnAssign) and isinstance(stmt.value, ast.Lambda):
                targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
                for t in targets:
                    if isinstance(t, ast.Name):
                        f = self._func(stmt.value, prefix + t.id, None)
                        self.functions.setdefault(t.id, []).append(f)
                        self.lambdas[id(stmt.value)] = f
            else:
                for name in ("body", "orelse", "finalbody"):
                    inner = getattr(stmt, name, None)
                    if isinstance(inner, list) and inner and isinstance(inner[0], ast.stmt):
                        self._index(inner, cls, prefix)
                for handler in getattr(stmt, "handlers", []) or []:
                    self._index(handler.body, cls, prefix)

    def _index_attrs(self) -> None:
        for cls, methods in self.methods.items():
            types = self.attr_types.setdefault(cls, {})
            aliases = self.attr_alias.setdefault(cls, {})
            for f in methods.values():
                if f.self_name is None:
                    continue
                for node in ast.walk(f.node):
                    call = isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    if call and node.func.attr in HOOK_REGISTRARS and node.args:  # type: ignore[attr-defined]
                        self.hook_targets.append(node.args[0])  # type: ignore[attr-defined]
                    if not isinstance(node, ast.Assign):
                        continue
                    for t in node.targets:
                        if not (isinstance(t, ast.Attribute) and _is_name(t.value, f.self_name)):
                            continue
                        value = node.value
                        if self.names.build_call_name(value) is not None:
                            aliases.setdefault(t.attr, value)  # self.ext = load_inline(...): the extension
                        elif isinstance(value, ast.Call):
                            q = self.names.qualname(value.func)
                            if q is not None:
                                types.setdefault(t.attr, q)
                            elif isinstance(value.func, ast.Name) and value.func.id in self.classes:
                                types.setdefault(t.attr, "local:" + value.func.id)
                        else:
                            aliases.setdefault(t.attr, value)

    # -- lookups ------------------------------------------------------------------------------------
    def mro(self, cls: str) -> list[str]:
        out: list[str] = []
        todo = [cls]
        while todo:
            c = todo.pop(0)
            if c in out or c not in self.classes:
                continue
            out.append(c)
            todo.extend(b.id for b in self.classes[c].bases if isinstance(b, ast.Name))
        return out

    def method(self, cls: str, name: str) -> Func | None:
        for c in self.mro(cls):
            f = self.methods.get(c, {}).get(name)
            if f is not None:
                return f
        return None

    def attr_type(self, cls: str, attr: str) -> str | None:
        for c in self.mro(cls):
            t = self.attr_types.get(c, {}).get(attr)
            if t is not None:
                return t
        return None

    def attr_value(self, cls: str, attr: str) -> ast.expr | None:
        for c in self.mro(cls):
            v = self.attr_alias.get(c, {}).get(attr)
            if v is not None:
                return v
        return None

    def triton_names(self) -> set[str]:
        return {name for name, fs in self.functions.items() if any(f.is_triton for f in fs)}

    # -- reachability -------------------------------------------------------------------------------
    def entries(self, cls: str = "ModelNew") -> list[Func]:
        out = [f for name in ENTRY_METHODS if (f := self.method(cls, name)) is not None]
        extra = list(self.hook_targets)
        v = self.attr_value(cls, "forward")
        if v is not None:
            extra.append(v)
        for expr in extra:
            out.extend(self.referenced(expr, cls, None))
        return out

    def referenced(self, node: ast.AST, self_cls: str | None, self_name: str | None) -> list[Func]:
        """Local functions and methods that the expression names (called or passed on)."""
        found: list[Func] = []
        if isinstance(node, ast.Lambda):
            found.append(self.lambdas.get(id(node)) or self._func(node, "<lambda>", None))
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
            found.extend(self.functions.get(node.id, []))
            if node.id in self.classes:
                found.extend(self.methods.get(node.id, {}).values())
        elif isinstance(node, ast.Attribute):
            if self_name is not None and _is_name(node.value, self_name) and self_cls:
                m = self.method(self_cls, node.attr)
                if m is not None:
                    found.append(m)
                t = self.attr_type(self_cls, node.attr)
                if t and t.startswith("local:"):
                    found.extend(self.methods.get(t[6:], {}).values())
                v = self.attr_value(self_cls, node.attr)
                if v is not None and not (isinstance(v, ast.Attribute) and v.attr == node.attr):
                    found.extend(self.referenced(v, self_cls, self_name))
            elif _is_super(node.value) and self_cls:
                for c in self.mro(self_cls)[1:]:
                    m = self.methods.get(c, {}).get(node.attr)
                    if m is not None:
                        found.append(m)
                        break
            else:
                for cls, methods in self.methods.items():
                    if cls != "ModelNew" and node.attr in methods:
                        found.append(methods[node.attr])
        return found

    def reach(self, cls: str = "ModelNew") -> list[tuple[Func, str | None]]:
        """Every function reachable from the entry points, with the class its self stands for."""
        seen: dict[int, tuple[Func, str | None]] = {}
        todo: list[tuple[Func, str | None]] = [(f, cls) for f in self.entries(cls)]
        while todo:
            f, self_cls = todo.pop()
            if id(f.node) in seen:
                continue
            seen[id(f.node)] = (f, self_cls)
            if f.is_triton:
                continue
            for node in walk_body(f.node):
                for g in self.referenced(node, self_cls if f.self_name else None, f.self_name):
                    owner = self_cls if (g.cls and self_cls and g.cls in self.mro(self_cls)) else g.cls
                    todo.append((g, owner))
        return list(seen.values())


def walk_body(fn: FuncNode) -> list[ast.AST]:
    """Nodes of a function body, not descending into nested defs or classes (lambdas are entered)."""
    out: list[ast.AST] = []
    body: list[ast.AST] = [fn.body] if isinstance(fn, ast.Lambda) else list(fn.body)
    todo = list(reversed(body))
    while todo:
        node = todo.pop()
        out.append(node)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef | ast.Lambda):
            continue
        todo.extend(reversed(list(ast.iter_child_nodes(node))))
    return out


def _is_name(node: ast.AST, name: str | None) -> bool:
    return name is not None and isinstance(node, ast.Name) and node.id == name


def _is_super(node: ast.AST) -> bool:
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "super"
