"""Writes model_new.py: a ModelNew with the reference's constructor and a forward that calls the extension.

The constructor is the reference's own `Model.__init__` (and the helpers it calls), so parameters
are created by the same modules in the same RNG order and the Verifier's seeded comparison is exact.
Module-level constants the constructor reads are inlined as literals (the candidate never redefines
the problem's names), and the forward does nothing but hand tensors and scalars to `ext.forward`.
"""

from __future__ import annotations

import ast
import builtins
import keyword
from dataclasses import dataclass
from typing import Any

from stitchcuda.coder.synth.ir import Attr, Graph, Unsupported
from stitchcuda.shared.candidate import import_line

PROBLEM_NAMES = frozenset({"Model", "get_inputs", "get_init_inputs"})
IMPORT_MARK = "# <stitch-extension-import>"


@dataclass
class Reference:
    tree: ast.Module
    model: ast.ClassDef
    init: ast.FunctionDef | None
    forward: ast.FunctionDef
    imports: dict[str, ast.stmt]
    defs: dict[str, ast.stmt]


def parse_reference(source: str) -> Reference:
    tree = ast.parse(source)
    model = next((s for s in tree.body if isinstance(s, ast.ClassDef) and s.name == "Model"), None)
    if model is None:
        raise Unsupported("the reference defines no class Model")
    methods = {s.name: s for s in model.body if isinstance(s, ast.FunctionDef)}
    if "forward" not in methods:
        raise Unsupported("Model has no forward method")
    imports: dict[str, ast.stmt] = {}
    defs: dict[str, ast.stmt] = {}
    for stmt in tree.body:
        if isinstance(stmt, ast.ImportFrom) and stmt.module == "__future__":
            continue
        if isinstance(stmt, ast.Import):
            for alias in stmt.names:
                imports[alias.asname or alias.name.split(".")[0]] = ast.Import(names=[alias])
        elif isinstance(stmt, ast.ImportFrom):
            for alias in stmt.names:
                imports[alias.asname or alias.name] = ast.ImportFrom(
                    module=stmt.module, names=[alias], level=stmt.level
                )
        elif isinstance(stmt, ast.ClassDef | ast.FunctionDef) and stmt.name not in PROBLEM_NAMES:
            defs[stmt.name] = stmt
        elif _is_made_helper(stmt):
            defs[stmt.targets[0].id] = stmt  # type: ignore[attr-defined]
    return Reference(tree, model, methods.get("__init__"), methods["forward"], imports, defs)


def _is_made_helper(stmt: ast.stmt) -> bool:
    """`to_2tuple = _ntuple(2)`: a module-level helper made by a call (constants are inlined instead)."""
    return (
        isinstance(stmt, ast.Assign)
        and len(stmt.targets) == 1
        and isinstance(stmt.targets[0], ast.Name)
        and stmt.targets[0].id not in PROBLEM_NAMES
        and isinstance(stmt.value, ast.Call)
    )


class _Inline(ast.NodeTransformer):
    """Replaces reads of module-level literal constants by their values; renames Model to ModelNew."""

    def __init__(
        self, literals: dict[str, Any], bound: set[str] | None = None, made: set[str] | None = None
    ) -> None:
        self.literals = literals
        self.bound = bound or set()
        self.made = made or set()

    def visit_Name(self, node: ast.Name) -> ast.AST:
        if isinstance(node.ctx, ast.Load) and node.id not in self.bound:
            if node.id == "Model":
                return ast.copy_location(ast.Name("ModelNew", ast.Load()), node)
            if node.id in self.made:
                return ast.copy_location(ast.Name(made_name(node.id), ast.Load()), node)
            if node.id in self.literals:
                return ast.copy_location(_literal_node(self.literals[node.id]), node)
        return node


def made_name(name: str) -> str:
    """The copy's name for a helper made by a call: the candidate never reassigns the problem's names."""
    return f"stitch_{name}"


def _literal_node(value: Any) -> ast.expr:
    if isinstance(value, list):
        return ast.Tuple([_literal_node(v) for v in value], ast.Load())
    if isinstance(value, dict) and "float" in value:
        return ast.Call(ast.Name("float", ast.Load()), [ast.Constant(value["float"])], [])
    return ast.Constant(value)


def _def_name(node: ast.stmt) -> str:
    if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
        return node.targets[0].id
    return getattr(node, "name", "")


def _names(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}


def _self_calls(node: ast.AST) -> set[str]:
    found = set()
    for n in ast.walk(node):
        if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "self":
            found.add(n.attr)
    return found


def _bound_names(node: ast.AST) -> set[str]:
    """Names a function or class binds anywhere inside it: parameters (its own, nested functions' and
    lambdas'), nested def/class names, assignments, loop/with/comprehension targets, except and import names.
    A name bound anywhere counts as bound everywhere in it (the scan errs towards fewer free names; a wrong
    guess fails the candidate's import, never its correctness)."""
    bound: set[str] = set()
    for n in ast.walk(node):
        if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            args = n.args
            bound |= {a.arg for a in [*args.args, *args.kwonlyargs, *args.posonlyargs]}
            bound |= {a.arg for a in (args.vararg, args.kwarg) if a is not None}
        if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) and n is not node:
            bound.add(n.name)
        elif isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
            bound.add(n.id)
        elif isinstance(n, ast.ExceptHandler) and n.name:
            bound.add(n.name)
        elif isinstance(n, ast.Import | ast.ImportFrom):
            bound |= {(a.asname or a.name).split(".")[0] for a in n.names}
    return bound


def attribute_expr(path: str) -> str:
    """`self.linear.weight`, or get_submodule for paths that are not identifiers (`block.0.weight`)."""
    parts = path.split(".")
    if all(p.isidentifier() and not keyword.iskeyword(p) for p in parts):
        return "self." + ".".join(parts)
    owner, attr = ".".join(parts[:-1]), parts[-1]
    if not attr.isidentifier():
        raise Unsupported(f"attribute path {path} cannot be written as an attribute")
    return f"self.get_submodule({owner!r}).{attr}" if owner else f"self.{attr}"


def _baked_guards(baked: dict[str, int]) -> list[ast.stmt]:
    """Constructor checks that the int attributes read as constants when tracing still hold those values."""
    lines = []
    for path, value in sorted(baked.items()):
        expr = attribute_expr(path)
        message = (
            f"ModelNew was generated for {path}={value} (its kernels are built around that value), "
            f"not {path}={{{expr}!r}}: generate it again for these constructor arguments"
        )
        lines += [f"if {expr} != {value}:", f"    raise ValueError(f{message!r})"]
    return ast.parse("\n".join(lines)).body


# ModelNew's calls replayed from a CUDA graph (graph_pays): inputs copied in and outputs copied out on every
# call, the graph captured on the second call with the first call's shapes (the first runs the extension
# directly: lazy initialisation, device probes), so each call runs every kernel exactly once (a training-mode
# batch norm's running statistics move once a call, as the reference's do).
REPLAY_METHODS = '''
    def _stitch_replay(self, inputs, state):
        """ext.forward(*inputs, *state) (the forward's tensors, the model's tensors and settings), replayed
        from a CUDA graph once a call repeats the previous call's shapes, strides and devices with the same
        model tensors. The inputs are copied into the graph's own buffers on every call and the outputs copied
        out, so a call costs two copies and one launch of the graph, not the host work of every launch."""
        shapes = [(t.shape, t.stride(), t.dtype, t.device) for t in inputs]
        known = getattr(self, "_stitch_shapes", None)
        held = getattr(self, "_stitch_state", None)
        same = known == shapes and held is not None and all(a is b for a, b in zip(held, state))
        if not same:
            self._stitch_shapes = shapes
            self._stitch_state = state
            self._stitch_graph = None
            return ext.forward(*inputs, *state)
        if self._stitch_graph is None:
            self._stitch_inputs = [torch.empty_like(t) for t in inputs]
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, capture_error_mode="relaxed"):
                self._stitch_outputs = ext.forward(*self._stitch_inputs, *state)
            self._stitch_graph = graph
        for i, t in enumerate(inputs):
            self._stitch_inputs[i].copy_(t)
        self._stitch_graph.replay()
        outputs = self._stitch_outputs
        if isinstance(outputs, torch.Tensor):
            return outputs.clone()
        return tuple(o.clone() for o in outputs)
'''


def forward_args(ref: Reference) -> list[str]:
    fn = ref.forward
    if fn.args.vararg or fn.args.kwarg or fn.args.kwonlyargs or fn.args.posonlyargs:
        raise Unsupported("Model.forward takes *args, **kwargs or keyword-only arguments")
    names = [a.arg for a in fn.args.args]
    if not names or names[0] != "self":
        raise Unsupported("Model.forward is not a method taking self")
    return names[1:]


def build_source(
    reference_source: str,
    graph: Graph | None,
    attrs: list[Attr],
    literals: dict[str, Any] | None,
    *,
    ext_name: str,
    doc: str,
    baked: dict[str, int] | None = None,
    replay: bool = False,
) -> str:
    """model_new.py; with graph=None the forward is a stub (used to check the constructor alone).
    `replay`: the forward replays the extension's calls from a CUDA graph (REPLAY_METHODS).

    literals=None leaves module-level names as they are (the tracing process supplies them).
    `baked`: int attributes the kernels were generated around; the constructor refuses other values.
    """
    ref = parse_reference(reference_source)
    lenient = literals is None
    literals = literals or {}
    for base in ref.model.bases:
        text = ast.unparse(base)
        if text not in ("nn.Module", "torch.nn.Module", "Module"):
            raise Unsupported(f"Model derives from {text}, not nn.Module")
    methods = {s.name: s for s in ref.model.body if isinstance(s, ast.FunctionDef)}
    keep: list[ast.FunctionDef] = []
    pending = ["__init__"] if ref.init is not None else []
    while pending:
        name = pending.pop()
        if name in {m.name for m in keep} or name not in methods or name == "forward":
            continue
        keep.append(methods[name])
        pending += sorted(_self_calls(methods[name]) & set(methods))
    copied: list[ast.FunctionDef] = []
    needed: set[str] = set()
    # Class-level attributes (`expansion = 4`) that the constructor or a helper may read through self.
    made = {name for name, stmt in ref.defs.items() if _is_made_helper(stmt)}
    unmade = {made_name(name): name for name in made}
    class_attrs = [
        _Inline(literals, set(), made).visit(ast.parse(ast.unparse(stmt)).body[0])
        for stmt in ref.model.body
        if isinstance(stmt, ast.Assign | ast.AnnAssign)
    ]
    for stmt in class_attrs:
        needed |= _names(stmt)
    for fn in keep:
        new = _Inline(literals, _bound_names(fn), made).visit(ast.parse(ast.unparse(fn)).body[0])
        assert isinstance(new, ast.FunctionDef)
        if new.name == "__init__" and baked:
            new.body += _baked_guards(baked)
        copied.append(new)
        needed |= _names(new) - _bound_names(new)
    # Module-level helpers (classes, functions) the constructor reaches, with their own dependencies.
    helper_defs: list[ast.stmt] = []
    seen: set[str] = set()
    queue = sorted(needed)
    imports: dict[str, ast.stmt] = {}
    while queue:
        name = queue.pop(0)
        name = unmade.get(name, name)  # the copied code reads a made helper by its new name
        if name in seen:
            continue
        seen.add(name)
        if name in ref.imports:
            imports[name] = ref.imports[name]
        elif name in ref.defs:
            original = ref.defs[name]
            bound = _bound_names(original)
            node = _Inline(literals, bound, made).visit(ast.parse(ast.unparse(original)).body[0])
            if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
                node.targets[0].id = made_name(node.targets[0].id)
            if isinstance(node, ast.ClassDef):
                # A submodule class is copied for its constructor (the same parameters, in the same RNG
                # order); its forward is the extension's work and must not ship as torch code.
                node.body = [
                    s for s in node.body if not (isinstance(s, ast.FunctionDef) and s.name == "forward")
                ] or [ast.Pass()]
            helper_defs.append(node)
            queue += sorted(_names(node) - bound - seen)
        elif name in literals or name in ("ModelNew", "self", "super") or hasattr(builtins, name) or lenient:
            continue
        elif name in PROBLEM_NAMES:
            raise Unsupported(f"the constructor refers to {name}")
        else:
            raise Unsupported(
                f"the constructor reads the module-level name {name!r}, which is not a constant"
            )
    header = [f'"""{doc}"""', "", "import torch"]
    for stmt in imports.values():
        text = ast.unparse(stmt)
        if text != "import torch":
            header.append(text)
    header += [IMPORT_MARK, ""]
    body: list[str] = []
    # In the reference's order: a helper made by a call follows the function that makes it.
    order = {made_name(name) if name in made else name: i for i, name in enumerate(ref.defs)}
    helper_defs.sort(key=lambda node: order.get(_def_name(node), len(order)))
    for node in helper_defs:
        body += [ast.unparse(node), "", ""]
    init_text = [ast.unparse(fn) for fn in copied]
    args = forward_args(ref)
    if graph is None:
        call = "raise NotImplementedError"
        fwd = (
            f"    def forward(self, {', '.join(args)}):\n        {call}"
            if args
            else "    def forward(self):\n        raise NotImplementedError"
        )
    else:
        call_args = [name for _, name in graph.inputs]
        call_args += [attribute_expr(path) for path in graph.params.values()]
        call_args += [attribute_expr(a.path) for a in attrs]
        signature = ast.unparse(ref.forward.args)
        returns = f" -> {ast.unparse(ref.forward.returns)}" if ref.forward.returns is not None else ""
        if replay:
            n = len(graph.inputs)
            call = f"self._stitch_replay([{', '.join(call_args[:n])}], [{', '.join(call_args[n:])}])"
            note = (
                "        # All the work happens in the extension's fused kernels, replayed from a CUDA graph."
            )
        else:
            call = f"ext.forward({', '.join(call_args)})"
            note = "        # All the work happens in the extension's fused kernels."
        fwd = "\n".join([f"    def forward({signature}){returns}:", note, f"        return {call}"])
        if replay:
            fwd += "\n" + REPLAY_METHODS.rstrip()
    cls = ["class ModelNew(torch.nn.Module):"]
    cls += ["    " + ast.unparse(stmt) for stmt in class_attrs] + ([""] if class_attrs else [])
    for text in init_text:
        cls += ["    " + line if line else line for line in text.splitlines()] + [""]
    if not init_text:
        cls += ["    def __init__(self):", "        super().__init__()", ""]
    cls.append(fwd)
    source = "\n".join([*header, *body, *cls, ""])
    return source.replace(IMPORT_MARK, import_line(ext_name) if graph is not None else "")
