"""Forward-path analysis of model_new.py: statements, instance state, interprocedural taint and its rules."""

from __future__ import annotations

import ast
from collections.abc import Mapping
from typing import Any

from stitchcuda.verifier.static_graph import Func, Program, walk_body
from stitchcuda.verifier.static_names import Names, line
from stitchcuda.verifier.static_report import Hits
from stitchcuda.verifier.static_taint import (
    EMPTY,
    Evaluator,
    Taint,
    data,
    has,
    no_alias,
    retag,
    sources,
    union,
)
from stitchcuda.verifier.static_vocab import MEMO_DECORATORS, TORCH_CODEGEN

ITERATIONS = 8


class Flow(Evaluator):
    """Runs the taint analysis to a fixpoint over every function ModelNew.forward reaches, then emits hits."""

    def __init__(self, program: Program, names: Names, hits: Hits, path: str = "model_new.py") -> None:
        self.program = program
        self.names = names
        self.hits = hits
        self.path = path
        self.reached = program.reach()
        self.entry_ids = {id(f.node) for f in program.entries()}
        self.triton = program.triton_names()
        self.ext_aliases = names.ext_aliases() | set(names.ext_names)
        self.module_names = _module_names(program.tree)
        self.state: dict[str, Taint] = {}
        self.globals_: dict[str, Taint] = {}
        self.env: dict[int, dict[str, Taint]] = {}
        self.params_in: dict[int, dict[str, Taint]] = {}
        self.returns: dict[int, Taint] = {}
        self.state_alias: dict[int, set[str]] = {}
        self.used: set[str] = set()
        self.custom_calls = 0
        self.emit = False
        self.counters = self._counters()
        # Parameters with a mutable default (def forward(self, x, _cache={})) are state shared by all calls.
        self.default_state = {id(f.node): _mutable_defaults(f) for f, _ in self.reached}
        # The function being analysed and the class its self stands for.
        placeholder = Func(ast.parse("lambda: None", mode="eval").body, "", None, [], None)  # type: ignore[arg-type]
        self.fn: Func = self.reached[0][0] if self.reached else placeholder
        self.self_cls: str | None = None
        self.global_decl: set[str] = set()

    # -- driver -------------------------------------------------------------------------------------
    def run(self) -> None:
        for f in self.program.entries():
            kept = self.default_state.get(id(f.node), set())
            self.params_in[id(f.node)] = {
                p: frozenset({("T", p), ("A", p)}) for p in f.params if p not in kept
            }
        for _ in range(ITERATIONS):
            before = self._size()
            self._pass()
            if self._size() == before:
                break
        self.emit = True
        self.used.clear()
        self.custom_calls = 0
        self._pass()
        self._finish()

    def _size(self) -> int:
        parts: list[Mapping[Any, Taint]] = [self.state, self.globals_, self.returns]
        parts += [*self.env.values(), *self.params_in.values()]
        return sum(len(t) for d in parts for t in d.values()) + sum(len(d) for d in parts)

    def _pass(self) -> None:
        for f, self_cls in self.reached:
            if f.is_triton:
                continue
            self.fn, self.self_cls = f, self_cls
            self.global_decl = {
                n for node in walk_body(f.node) if isinstance(node, ast.Global) for n in node.names
            }
            env = self.env.setdefault(id(f.node), {})
            for p, t in self.params_in.get(id(f.node), {}).items():
                env[p] = union(env.get(p, EMPTY), t)
            if self.emit:
                self._decorators(f)
            if isinstance(f.node, ast.Lambda):
                self.returns[id(f.node)] = union(self.returns.get(id(f.node), EMPTY), self.ev(f.node.body))
            else:
                self.block(f.node.body)

    def _finish(self) -> None:
        entries = [f for f, _ in self.reached if id(f.node) in self.entry_ids]
        forward = next((f for f in entries if f.name.endswith(".forward")), entries[0] if entries else None)
        if forward is None:
            return
        where = f"{self.path}:{line(forward.node)}"
        inputs = list(forward.params)
        if self.custom_calls == 0:
            self.hits.add(
                "D11.no-custom-call", "forward never calls the extension or a kernel of its own", where
            )
        if inputs and not (self.used & set(inputs)):
            self.hits.add("D11.ignores-inputs", "no input data reaches a kernel or the output", where)
        elif inputs:
            for p in inputs:
                if p not in self.used:
                    self.hits.add(
                        "D11.unused-input", f"input {p!r} never reaches a kernel or the output", where
                    )

    def _decorators(self, f: Func) -> None:
        for d in f.decorators:
            if d in TORCH_CODEGEN:
                self.hit("D11.torch-op", f"@{d} on {f.name}: PyTorch generates these kernels", f.node)
            if d in MEMO_DECORATORS:
                tainted = any(has(t, "T", "A", "V", "I") for t in self.params_in.get(id(f.node), {}).values())
                if tainted:
                    self.hit(
                        "D11.output-cache",
                        f"@{d} on {f.name} memoises results of input-derived arguments",
                        f.node,
                    )

    def _counters(self) -> set[str]:
        """Attributes and globals bumped by a constant on the forward path (call counters, cursors)."""
        out: set[str] = set()
        for f, _ in self.reached:
            for node in walk_body(f.node):
                target: ast.expr | None = None
                if isinstance(node, ast.AugAssign) and isinstance(node.op, ast.Add | ast.Sub):
                    if isinstance(node.value, ast.Constant):
                        target = node.target
                elif (
                    isinstance(node, ast.Assign)
                    and len(node.targets) == 1
                    and isinstance(node.value, ast.BinOp)
                ):
                    t = node.targets[0]
                    if any(
                        ast.dump(n) == ast.dump(t).replace("Store()", "Load()") for n in ast.walk(node.value)
                    ):
                        target = t
                if isinstance(target, ast.Attribute) and _is_name(target.value, f.self_name):
                    out.add("self." + target.attr)
                elif isinstance(target, ast.Name) and (
                    target.id in self.module_names
                    and any(isinstance(n, ast.Global) and target.id in n.names for n in walk_body(f.node))
                ):
                    out.add("g." + target.id)
        return out

    # -- helpers used by Evaluator ------------------------------------------------------------------
    def hit(self, rule: str, detail: str, node: ast.AST | None) -> None:
        if self.emit:
            self.hits.add(rule, detail, self.where(node))

    def is_self(self, node: ast.AST) -> bool:
        return _is_name(node, self.fn.self_name)

    def is_state(self, node: ast.AST) -> bool:
        """self.X, class attributes, module-level containers, and subscripts/attributes of them."""
        if isinstance(node, ast.Attribute):
            if self.is_self(node.value):
                return True
            if isinstance(node.value, ast.Name) and node.value.id in self.program.classes:
                return True
            if isinstance(node.value, ast.Call) and ast.unparse(node.value.func) == "type":
                return True
            return self.is_state(node.value)
        if isinstance(node, ast.Subscript):
            return self.is_state(node.value)
        if isinstance(node, ast.Name):
            if node.id in self.default_state.get(id(self.fn.node), set()):
                return True
            env = self.env.get(id(self.fn.node), {})
            local = node.id in env and node.id not in self.global_decl
            return not local and node.id in self.module_names and self.names.qualname(node) is None
        return False

    def state_type(self, node: ast.AST) -> str | None:
        if isinstance(node, ast.Attribute) and self.is_self(node.value) and self.self_cls:
            return self.program.attr_type(self.self_cls, node.attr)
        return None

    def lookup(self, name: str) -> Taint:
        env = self.env.get(id(self.fn.node), {})
        if name in env and name not in self.global_decl:
            return env[name]
        return self.globals_.get(name, EMPTY)

    def mentions_counter(self, node: ast.AST) -> bool:
        if not self.counters:
            return False
        for n in ast.walk(node):
            if isinstance(n, ast.Attribute) and self.is_self(n.value) and "self." + n.attr in self.counters:
                return True
            if isinstance(n, ast.Name) and "g." + n.id in self.counters:
                return True
        return False

    def custom(self, node: ast.Call, allt: Taint, what: str) -> Taint:
        self.custom_calls += 1
        self.used |= sources(data(allt))
        out = no_alias(data(allt))
        # Kernels write their outputs in place: the buffers passed in now hold input-derived data.
        for a in node.args:
            if isinstance(a, ast.Name) and a.id not in self.ext_aliases:
                held = self.lookup(a.id)
                if has(held, "M") and not has(held, "T", "A"):
                    continue  # a size or stride passed to a kernel (Triton's n_cols) is no buffer it writes
                self.write_into(a, out)
        return out

    def write_into(self, target: ast.AST, t: Taint) -> None:
        if isinstance(target, ast.Name):
            env = self.env.setdefault(id(self.fn.node), {})
            if target.id in env:
                env[target.id] = union(env[target.id], t)
        elif isinstance(target, ast.Attribute) and self.is_self(target.value):
            self.state[target.attr] = union(self.state.get(target.attr, EMPTY), t)
            self.used |= sources(data(t))

    def store_state(self, node: ast.AST, what: str, t: Taint) -> None:
        if has(t, "T", "A", "V"):
            self.hit("D11.output-cache", f"{what} keeps input-derived values across calls", node)
        if has(t, "I"):
            self.hit("D11.identity-key", f"{what} stores an input's identity (data_ptr/id/_version)", node)
        self.used |= sources(data(t))

    def local_call(self, node: ast.Call, targets: list[Func], args: list[Taint], allt: Taint) -> Taint:
        result = EMPTY
        via_class = isinstance(node.func, ast.Name) and node.func.id in self.program.classes
        for g in targets:
            if via_class and getattr(g.node, "name", "") != "__init__":
                continue
            slots = self.params_in.setdefault(id(g.node), {})
            star = any(isinstance(a, ast.Starred) for a in node.args) or any(
                k.arg is None for k in node.keywords
            )
            for i, p in enumerate(g.params):
                t = allt if star else (args[i] if i < len(args) else EMPTY)
                slots[p] = union(slots.get(p, EMPTY), t)
            for k in node.keywords:
                if k.arg in g.params:
                    slots[k.arg] = union(slots.get(k.arg, EMPTY), self.ev(k.value))
            if not via_class:
                result = union(result, self.returns.get(id(g.node), EMPTY))
        return result

    def test(self, node: ast.expr) -> None:
        """Checks on a branch condition: extension-missing fallbacks and call counters."""
        for n in ast.walk(node):
            if isinstance(n, ast.Name) and n.id in self.ext_aliases:
                self.hit(
                    "D11.fallback", f"branch on whether the extension exists: {ast.unparse(node)[:80]}", node
                )
                break
            probe = isinstance(n, ast.Call) and ast.unparse(n.func) in {"hasattr", "getattr"} and n.args
            if probe and isinstance(n.args[0], ast.Name) and n.args[0].id in self.ext_aliases:  # type: ignore[attr-defined]
                self.hit(
                    "D11.fallback", f"branch on the extension's contents: {ast.unparse(node)[:80]}", node
                )
                break
        if self.mentions_counter(node):
            self.hit(
                "D11.call-counter",
                f"a call counter decides what forward does: {ast.unparse(node)[:80]}",
                node,
            )
        self.ev(node)

    # -- statements ---------------------------------------------------------------------------------
    def block(self, stmts: list[ast.stmt]) -> None:
        for s in stmts:
            self.stmt(s)

    def stmt(self, s: ast.stmt) -> None:
        if isinstance(s, ast.Assign):
            t = self.ev(s.value)
            for target in s.targets:
                self.bind(target, t, s.value)
        elif isinstance(s, ast.AnnAssign):
            if s.value is not None:
                self.bind(s.target, self.ev(s.value), s.value)
        elif isinstance(s, ast.AugAssign):
            current = self.ev(s.target)
            t = self.binop(s, current, s.op, self.ev(s.value))
            if has(current, "A"):
                self.hit(
                    "D11.input-mutation", f"in-place {ast.unparse(s.target)} op= writes into an input", s
                )
            self.bind(s.target, t, None)
        elif isinstance(s, ast.Expr):
            self.ev(s.value)
        elif isinstance(s, ast.Return):
            self.ret(s)
        elif isinstance(s, ast.If | ast.While):
            if not _lazy_build(s, self.names):
                self.test(s.test)
            self.block(s.body)
            self.block(s.orelse)
        elif isinstance(s, ast.For | ast.AsyncFor):
            self.bind(s.target, self.ev(s.iter), None)
            self.block(s.body)
            self.block(s.orelse)
        elif isinstance(s, ast.With | ast.AsyncWith):
            for item in s.items:
                q = (
                    self.names.qualname(item.context_expr.func)
                    if isinstance(item.context_expr, ast.Call)
                    else None
                )
                if q == "contextlib.suppress":
                    self.hit(
                        "D11.fallback", "contextlib.suppress on the forward path swallows kernel errors", s
                    )
                t = self.ev(item.context_expr)
                if item.optional_vars is not None:
                    self.bind(item.optional_vars, t, None)
            self.block(s.body)
        elif isinstance(s, ast.Try | ast.TryStar):
            self.block(s.body)
            for h in s.handlers:
                self.handler(h)
                self.block(h.body)
            self.block(s.orelse)
            self.block(s.finalbody)
        elif isinstance(s, ast.Raise):
            self.ev(s.exc)
        elif isinstance(s, ast.Assert):
            self.ev(s.test)
        elif isinstance(s, ast.Match):
            t = self.ev(s.subject)
            for case in s.cases:
                for n in ast.walk(case.pattern):
                    if isinstance(n, ast.MatchAs | ast.MatchStar) and n.name:
                        self.lookup_env()[n.name] = t
                self.block(case.body)

    def lookup_env(self) -> dict[str, Taint]:
        return self.env.setdefault(id(self.fn.node), {})

    def handler(self, h: ast.ExceptHandler) -> None:
        reraises = bool(h.body) and isinstance(h.body[-1], ast.Raise)
        returns = any(isinstance(n, ast.Return) for n in ast.walk(ast.Module(body=h.body, type_ignores=[])))
        if reraises and not returns:
            self.hit("D11.try-except", "try/except on the forward path (the handler re-raises)", h)
        else:
            what = "returns a substitute result" if returns else "swallows the error and carries on"
            self.hit("D11.fallback", f"except handler on the forward path {what}", h)

    def ret(self, s: ast.Return) -> None:
        t = self.ev(s.value)
        key = id(self.fn.node)
        self.returns[key] = union(self.returns.get(key, EMPTY), t)
        if key not in self.entry_ids or s.value is None:
            return
        self.used |= sources(data(t))
        if self.returns_state(s.value):
            self.hit(
                "D11.stored-output", f"forward returns a tensor kept in state: {ast.unparse(s.value)[:80]}", s
            )
        if has(t, "A"):
            self.hit("D11.input-alias", f"forward returns a view of an input: {ast.unparse(s.value)[:80]}", s)

    def returns_state(self, e: ast.expr) -> bool:
        if isinstance(e, ast.Tuple | ast.List):
            return any(self.returns_state(x) for x in e.elts)
        if isinstance(e, ast.IfExp):
            return self.returns_state(e.body) or self.returns_state(e.orelse)
        if isinstance(e, ast.Name):
            return e.id in self.state_alias.get(id(self.fn.node), set()) or (
                self.is_state(e) and e.id in self.globals_
            )
        if isinstance(e, ast.Call) and isinstance(e.func, ast.Attribute):
            return e.func.attr in {"get", "pop", "__getitem__"} and self.is_state(e.func.value)
        if isinstance(e, ast.Attribute | ast.Subscript):
            if not self.is_state(e):
                return False
            if isinstance(e, ast.Attribute) and self.is_self(e.value) and self.self_cls:
                return self.program.method(self.self_cls, e.attr) is None
            return True
        return False

    def bind(self, target: ast.expr, t: Taint, value: ast.expr | None) -> None:
        env = self.lookup_env()
        if isinstance(target, ast.Name):
            if target.id in self.global_decl:
                self.globals_[target.id] = union(self.globals_.get(target.id, EMPTY), t)
                self.store_state(target, f"module global {target.id}", t)
            else:
                env[target.id] = union(env.get(target.id, EMPTY), t)
            if value is not None and self.returns_state_value(value):
                self.state_alias.setdefault(id(self.fn.node), set()).add(target.id)
        elif isinstance(target, ast.Attribute):
            if self.is_state(target):
                root = _state_root(target)
                if root is not None:
                    self.state[root] = union(self.state.get(root, EMPTY), t)
                self.store_state(target, ast.unparse(target)[:60], t)
            elif isinstance(target.value, ast.Name):
                env[target.value.id] = union(env.get(target.value.id, EMPTY), t)
        elif isinstance(target, ast.Subscript):
            idx = self.ev(target.slice)
            if self.is_state(target.value):
                root = _state_root(target)
                if root is not None:
                    self.state[root] = union(self.state.get(root, EMPTY), t)
                self.store_state(
                    target, ast.unparse(target.value)[:60] + "[...]", union(t, retag(idx, "I", ("I",)))
                )
                if self.mentions_counter(target.slice):
                    self.hit(
                        "D11.call-counter", "a call counter bumped in forward indexes stored results", target
                    )
            else:
                base = self.ev(target.value)
                if has(base, "A"):
                    self.hit(
                        "D11.input-mutation", f"assignment into an input: {ast.unparse(target)[:60]}", target
                    )
                if isinstance(target.value, ast.Name):
                    env[target.value.id] = union(env.get(target.value.id, EMPTY), no_alias(data(t)))
        elif isinstance(target, ast.Tuple | ast.List):
            for e in target.elts:
                self.bind(e, t, None)
        elif isinstance(target, ast.Starred):
            self.bind(target.value, t, None)

    def returns_state_value(self, value: ast.expr) -> bool:
        if isinstance(value, ast.Attribute | ast.Subscript):
            if isinstance(value, ast.Attribute) and self.is_self(value.value) and self.self_cls:
                return self.is_state(value) and self.program.method(self.self_cls, value.attr) is None
            return self.is_state(value)
        if isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute):
            return value.func.attr in {"get", "pop", "setdefault"} and self.is_state(value.func.value)
        return False


def _state_root(node: ast.AST) -> str | None:
    """The attribute of self (or module-level name) at the root of a state expression."""
    while isinstance(node, ast.Attribute | ast.Subscript):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            return node.attr
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def _is_name(node: ast.AST, name: str | None) -> bool:
    return name is not None and isinstance(node, ast.Name) and node.id == name


def _mutable_defaults(f: Func) -> set[str]:
    if isinstance(f.node, ast.Lambda):
        return set()
    a = f.node.args
    positional = a.posonlyargs + a.args
    pairs = list(zip(positional[len(positional) - len(a.defaults) :], a.defaults, strict=True))
    pairs += [(p, d) for p, d in zip(a.kwonlyargs, a.kw_defaults, strict=True) if d is not None]
    mutable = (ast.Dict, ast.List, ast.Set, ast.DictComp, ast.ListComp, ast.SetComp, ast.Call)
    return {p.arg for p, d in pairs if isinstance(d, mutable)}


def _module_names(tree: ast.Module) -> set[str]:
    out: set[str] = set()
    for stmt in tree.body:
        targets: list[ast.expr] = []
        if isinstance(stmt, ast.Assign):
            targets = stmt.targets
        elif isinstance(stmt, ast.AnnAssign | ast.AugAssign):
            targets = [stmt.target]
        for t in targets:
            out |= {n.id for n in ast.walk(t) if isinstance(n, ast.Name)}
    return out


def _lazy_build(s: ast.If | ast.While, names: Names) -> bool:
    """`if _ext is None: _ext = load_inline(...)`: the branch only decides when to build (a served build,
    whose failure is the Verifier's, never the candidate's), it chooses no fallback."""
    return (
        isinstance(s, ast.If)
        and not s.orelse
        and all(
            isinstance(b, ast.Assign | ast.Global)
            and (isinstance(b, ast.Global) or names.build_call_name(b.value))
            for b in s.body
        )
    )
