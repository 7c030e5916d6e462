"""Import and alias resolution for the D11 scan: expressions to dotted names (F.relu -> torch...relu)."""

from __future__ import annotations

import ast
import builtins
from dataclasses import dataclass, field

from stitchcuda.shared import build_calls
from stitchcuda.verifier.static_vocab import MODULE_RULES

BUILTIN_NAMES = frozenset(dir(builtins))
# Prefixes that also match longer last segments ("os.exec" matches os.execv).
_PARTIAL = frozenset({"os.exec", "os.spawn", "os.fork", "os.posix_spawn", "os.kill"})


@dataclass
class Import:
    module: str
    line: int
    star: bool = False
    # The imported name in a `from m import name` (or "" for `import m`).
    name: str = ""
    # Whether the import sits at module level, outside any try/if/function.
    top_level: bool = False
    in_try: bool = False


@dataclass
class Names:
    """Local name -> qualified dotted name, for one model_new.py."""

    tree: ast.Module
    ext_name: str
    # Further extensions the candidate builds itself (several load_inline/load calls).
    extra_ext: tuple[str, ...] = ()
    aliases: dict[str, str] = field(default_factory=dict)
    bound: set[str] = field(default_factory=set)
    imports: list[Import] = field(default_factory=list)
    # Module-level functions that return an extension module (a cached build helper): name -> extension.
    helpers: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.build_imports = build_calls.build_funcs(self.tree)
        self.ext_names = frozenset(n for n in (self.ext_name, *self.extra_ext) if n)
        self._collect_imports(self.tree.body, top=True, in_try=False)
        for node in ast.walk(self.tree):
            self._collect_bound(node)
        self._collect_assign_aliases()
        self._collect_helpers()

    def build_call_name(self, node: ast.AST) -> str | None:
        """The extension a load_inline/load call builds, when it is one of the candidate's served builds."""
        if not isinstance(node, ast.Call):
            return None
        name = build_calls.static_name(node, self.build_imports)
        return name if name in self.ext_names else None

    def _collect_helpers(self) -> None:
        for _ in range(3):  # helpers returning helpers
            for stmt in self.tree.body:
                if not isinstance(stmt, ast.FunctionDef) or stmt.name in self.helpers:
                    continue
                returned = {
                    self.qualname(n.value)
                    for n in ast.walk(stmt)
                    if isinstance(n, ast.Return) and n.value is not None
                }
                if len(returned) == 1:
                    (q,) = returned
                    if q is not None and q in self.ext_names:
                        self.helpers[stmt.name] = q

    # -- collection ---------------------------------------------------------------------------------
    def _collect_imports(self, body: list[ast.stmt], *, top: bool, in_try: bool) -> None:
        for stmt in body:
            if isinstance(stmt, ast.Import):
                for a in stmt.names:
                    root = a.name.split(".")[0]
                    self.aliases[a.asname or root] = a.name if a.asname else root
                    self.imports.append(Import(a.name, stmt.lineno, top_level=top, in_try=in_try))
            elif isinstance(stmt, ast.ImportFrom):
                module = ("." * stmt.level) + (stmt.module or "")
                for a in stmt.names:
                    if a.name == "*":
                        self.imports.append(
                            Import(module, stmt.lineno, star=True, top_level=top, in_try=in_try)
                        )
                        continue
                    self.aliases[a.asname or a.name] = f"{module}.{a.name}" if module else a.name
                    self.imports.append(
                        Import(module, stmt.lineno, name=a.name, top_level=top, in_try=in_try)
                    )
            else:
                nested_try = in_try or isinstance(stmt, ast.Try | ast.TryStar)
                for name in ("body", "orelse", "finalbody"):
                    inner = getattr(stmt, name, None)
                    if isinstance(inner, list) and inner and isinstance(inner[0], ast.stmt):
                        self._collect_imports(inner, top=False, in_try=nested_try)
                for handler in getattr(stmt, "handlers", []) or []:
                    self._collect_imports(handler.body, top=False, in_try=True)
                if isinstance(stmt, ast.Match):
                    for case in stmt.cases:
                        self._collect_imports(case.body, top=False, in_try=in_try)

    def _collect_bound(self, node: ast.AST) -> None:
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            self.bound.add(node.id)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            self.bound.add(node.name)
        elif isinstance(node, ast.arg):
            self.bound.add(node.arg)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            self.bound.add(node.name)
        elif isinstance(node, ast.alias):
            self.bound.add((node.asname or node.name).split(".")[0])

    def _collect_assign_aliases(self) -> None:
        pairs: list[tuple[ast.expr, ast.expr]] = []
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Assign):
                for target in node.targets:
                    pairs.extend(_pairs(target, node.value))
            elif isinstance(node, ast.AnnAssign) and node.value is not None:
                pairs.extend(_pairs(node.target, node.value))
            elif isinstance(node, ast.NamedExpr):
                pairs.append((node.target, node.value))
        for _ in range(4):  # chains such as `t = torch; f = t.nn.functional; r = f.relu`
            changed = False
            for target, value in pairs:
                if isinstance(target, ast.Name) and target.id not in self.aliases:
                    q = self.qualname(value)
                    if q is not None:
                        self.aliases[target.id] = q
                        changed = True
            if not changed:
                break

    # -- resolution ---------------------------------------------------------------------------------
    def qualname(self, node: ast.AST) -> str | None:
        """The dotted name an expression refers to, or None when it is not a module-level reference."""
        if isinstance(node, ast.Name):
            if node.id in self.aliases:
                return self.aliases[node.id]
            if node.id == "__builtins__":
                return "builtins"
            if node.id not in self.bound and node.id in BUILTIN_NAMES:
                return "builtins." + node.id
            stars = [i.module for i in self.imports if i.star and not i.module.startswith(".")]
            if node.id not in self.bound and stars:
                return f"{stars[0]}.{node.id}"  # a free name after `from m import *` most likely comes from m
            return None
        if isinstance(node, ast.Attribute):
            base = self.qualname(node.value)
            return f"{base}.{node.attr}" if base is not None else None
        if isinstance(node, ast.Call):
            built = self.build_call_name(node)
            if built is not None:
                return built
            if isinstance(node.func, ast.Name) and node.func.id in self.helpers and not node.args:
                return self.helpers[node.func.id]
            fn = self.qualname(node.func)
            if fn == "builtins.getattr" and len(node.args) >= 2 and _const_str(node.args[1]) is not None:
                base = self.qualname(node.args[0])
                return f"{base}.{_const_str(node.args[1])}" if base is not None else None
            if fn in {"importlib.import_module", "builtins.__import__"} and node.args:
                return _const_str(node.args[0])
            return None
        if isinstance(node, ast.Subscript):
            key = _const_str(node.slice)
            holder = node.value
            if key is not None and isinstance(holder, ast.Attribute) and holder.attr == "__dict__":
                owner = self.qualname(holder.value)
                return f"{owner}.{key}" if owner is not None else None
            if (
                key is not None
                and isinstance(holder, ast.Call)
                and self.qualname(holder.func) == "builtins.vars"
            ):
                owner = self.qualname(holder.args[0]) if holder.args else None
                return f"{owner}.{key}" if owner is not None else None
            base = self.qualname(node.value)
            if base in {"sys.modules", "builtins.__dict__", "builtins"} and key is not None:
                return key if base == "sys.modules" else f"builtins.{key}"
            return None
        return None

    def is_ext(self, q: str | None) -> bool:
        if not q:
            return False
        return any(q == n or q.startswith((n + ".", f"torch.ops.{n}.")) for n in self.ext_names)

    def ext_aliases(self) -> set[str]:
        """Local names bound to the extension module or to one of its functions."""
        return {name for name, q in self.aliases.items() if self.is_ext(q)}


def module_rule(q: str) -> str | None:
    """The rule a use of the dotted name q falls under ("" = harmless, None = not listed)."""
    for prefix, rule in MODULE_RULES:
        if prefix.endswith("."):
            if q.startswith(prefix):
                return rule
        elif q == prefix or q.startswith(prefix + ".") or (prefix in _PARTIAL and q.startswith(prefix)):
            return rule
    return None


def _pairs(target: ast.expr, value: ast.expr) -> list[tuple[ast.expr, ast.expr]]:
    if isinstance(target, ast.Tuple | ast.List) and isinstance(value, ast.Tuple | ast.List):
        if len(target.elts) == len(value.elts):
            out: list[tuple[ast.expr, ast.expr]] = []
            for t, v in zip(target.elts, value.elts, strict=True):
                out.extend(_pairs(t, v))
            return out
        return []
    return [(target, value)]


def _const_str(node: ast.AST) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def const_str(node: ast.AST) -> str | None:
    return _const_str(node)


def line(node: ast.AST) -> int:
    return int(getattr(node, "lineno", 0) or 0)
