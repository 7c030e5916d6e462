"""Finds a candidate's own torch.utils.cpp_extension build calls (load_inline, load) and reads their arguments

The Verifier builds every extension itself before the candidate runs (so a candidate can never catch its own
build failure, and nothing builds twice); inside the run each build call is served from that build. This needs
each call's arguments statically: literals, module or function-local constants, `+` of those,
textwrap.dedent of a literal, and for `load` source paths whose file name names one of the candidate's files.
Anything computed at run time is refused, naming the call.
"""

from __future__ import annotations

import ast
import hashlib
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from stitchcuda.shared.errors import InvalidRequest

BUILD_FUNCS = {
    "torch.utils.cpp_extension.load_inline": "load_inline",
    "torch.utils.cpp_extension.load": "load",
}
_PARAMS = {
    "load_inline": [
        "name",
        "cpp_sources",
        "cuda_sources",
        "functions",
        "extra_cflags",
        "extra_cuda_cflags",
        "extra_ldflags",
        "extra_include_paths",
        "build_directory",
        "verbose",
        "with_cuda",
        "is_python_module",
        "with_pytorch_error_handling",
        "keep_intermediates",
        "use_pch",
    ],
    "load": [
        "name",
        "sources",
        "extra_cflags",
        "extra_cuda_cflags",
        "extra_ldflags",
        "extra_include_paths",
        "build_directory",
        "verbose",
        "with_cuda",
        "is_python_module",
        "is_standalone",
        "keep_intermediates",
    ],
}
# Arguments that change where or how loudly torch builds, never what: the Verifier's builder decides those.
_IGNORED = {"build_directory", "verbose", "with_pytorch_error_handling", "keep_intermediates", "use_pch"}
CACHE_DECORATORS = {"functools.cache", "functools.lru_cache", "cache", "lru_cache"}
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,100}")


def call_digest(
    kind: str,
    name: str,
    texts: list[list[str]],
    functions: list[str],
    cflags: list[str],
    cuda_cflags: list[str],
    ldflags: list[str],
) -> str:
    """The digest of one build call's arguments. harness/candidate_runner.py computes the same digest from the
    arguments the code passes at run time (a test keeps the two equal): a call served from the Verifier's
    build must ask for exactly what was built."""
    doc = [kind, name, texts, functions, cflags, cuda_cflags, ldflags]
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()


@dataclass
class BuildCall:
    """One build call as the candidate's code makes it."""

    kind: str
    name: str
    line: int
    where: str
    in_try: bool
    # (path, content) of what to compile; load_inline's become binding.cpp/kernels.cu under ext/<name>/.
    files: list[tuple[str, str]] = field(default_factory=list)
    functions: list[str] = field(default_factory=list)
    cflags: list[str] = field(default_factory=list)
    cuda_cflags: list[str] = field(default_factory=list)
    ldflags: list[str] = field(default_factory=list)
    with_cuda: bool = False
    digest: str = ""


def build_funcs(tree: ast.Module) -> dict[str, str]:
    """Local dotted prefixes that name torch.utils.cpp_extension's build functions: {"load_inline": ...}."""
    out: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module in {"torch.utils.cpp_extension", "torch.utils"}:
            for a in node.names:
                full = f"{node.module}.{a.name}"
                out[a.asname or a.name] = full
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name == "torch" or a.name.startswith("torch.utils"):
                    out[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
    return out


def dotted(node: ast.AST, imports: dict[str, str]) -> str | None:
    if isinstance(node, ast.Name):
        return imports.get(node.id)
    if isinstance(node, ast.Attribute):
        base = dotted(node.value, imports)
        return f"{base}.{node.attr}" if base else None
    return None


def is_build_call(node: ast.AST, imports: dict[str, str]) -> str:
    """ "load_inline"/"load" when node calls one of the build functions, else ""."""
    if not isinstance(node, ast.Call):
        return ""
    return BUILD_FUNCS.get(dotted(node.func, imports) or "", "")


def static_name(call: ast.Call, imports: dict[str, str]) -> str | None:
    """The extension name a build call passes, when it is a literal (for the D11 scan's name resolution)."""
    kind = is_build_call(call, imports)
    if not kind:
        return None
    expr = _argument(call, kind, "name")
    if isinstance(expr, ast.Constant) and isinstance(expr.value, str):
        return expr.value
    return None


def find(source: str, files: dict[str, str]) -> list[BuildCall]:
    """Every build call of the entry's source, arguments resolved; InvalidRequest names one it cannot read."""
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        raise InvalidRequest(f"candidate does not parse: line {exc.lineno}: {exc.msg}") from exc
    imports = build_funcs(tree)
    module_consts = _constants(tree.body)
    out: list[BuildCall] = []
    for call, scope, in_try in _calls(tree, imports):
        kind = is_build_call(call, imports)
        consts = dict(module_consts)
        if scope is not None:
            consts.update(_constants(list(ast.walk(scope))))
        out.append(_read(call, kind, scope, in_try, consts, files))
    return out


def describe(calls: list[BuildCall]) -> str:
    """ "load_inline x2 in __init__", "cpp_extension.load of 2 files at module level", ..."""
    parts: list[str] = []
    for kind in ("load_inline", "load"):
        mine = [c for c in calls if c.kind == kind]
        if not mine:
            continue
        wheres = sorted({c.where for c in mine}, key=[c.where for c in mine].index)
        label = "load_inline" if kind == "load_inline" else "cpp_extension.load"
        count = f" \u00d7{len(mine)}" if len(mine) > 1 else ""
        if kind == "load":
            n = sum(len(c.files) for c in mine)
            count += f" of {n} file{'s' if n != 1 else ''}"
        parts.append(f"{label}{count} {', '.join(wheres)}")
    return " + ".join(parts)


# -- reading one call -----------------------------------------------------------------------------------


def _argument(call: ast.Call, kind: str, param: str) -> ast.expr | None:
    for kw in call.keywords:
        if kw.arg == param:
            return kw.value
    if param not in _PARAMS[kind]:
        return None
    index = _PARAMS[kind].index(param)
    if index < len(call.args) and not any(isinstance(a, ast.Starred) for a in call.args[: index + 1]):
        return call.args[index]
    return None


def _read(
    call: ast.Call,
    kind: str,
    scope: ast.AST | None,
    in_try: bool,
    consts: dict[str, ast.expr],
    files: dict[str, str],
) -> BuildCall:
    label = f"the {kind} call at line {call.lineno}"
    if any(isinstance(a, ast.Starred) for a in call.args) or any(kw.arg is None for kw in call.keywords):
        raise InvalidRequest(f"{label} passes *args/**kwargs: the Verifier needs its arguments statically")
    known = set(_PARAMS[kind])
    for kw in call.keywords:
        if kw.arg not in known:
            raise InvalidRequest(f"{label} passes an argument {kind} does not take: {kw.arg}")

    def value(param: str) -> object:
        expr = _argument(call, kind, param)
        if expr is None:
            return None
        try:
            return _literal(expr, consts, 0)
        except (ValueError, TypeError, SyntaxError, KeyError, RecursionError) as exc:
            raise InvalidRequest(
                f"{label}: its {param} argument is computed at run time ({ast.unparse(expr)[:80]}); "
                "the Verifier builds every extension before the candidate runs, so build arguments must be "
                "literals or constants"
            ) from exc

    name = value("name")
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise InvalidRequest(f"{label}: the extension name must be a literal identifier, not {name!r}")
    for param in ("extra_include_paths",):
        if value(param):
            raise InvalidRequest(f"{label}: {param} is not supported (ship headers beside the sources)")
    if value("is_python_module") is False or value("is_standalone"):
        raise InvalidRequest(f"{label}: only Python-module extensions are supported")
    cflags, cuda_cflags, ldflags = (_strings(value(p), label, p) for p in _FLAG_PARAMS)
    with_cuda = bool(value("with_cuda"))
    bc = BuildCall(kind, name, call.lineno, _where(scope), in_try, cflags=cflags)
    bc.cuda_cflags, bc.ldflags = cuda_cflags, ldflags
    if kind == "load_inline":
        cpp, cuda = _text(value("cpp_sources"), label), _text(value("cuda_sources"), label)
        raw = value("functions")
        if isinstance(raw, dict):
            raw = list(raw)
        functions = _strings(raw, label, "functions")
        binding = "#include <torch/extension.h>\n" + cpp
        if functions:
            binds = "\n".join(f'  m.def("{f}", &{f}, "{f}");' for f in functions)
            binding += f"\n\nPYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {{\n{binds}\n}}\n"
        bc.files.append((f"ext/{name}/binding.cpp", binding))
        if cuda:
            prelude = "#include <torch/types.h>\n#include <cuda.h>\n#include <cuda_runtime.h>\n"
            bc.files.append((f"ext/{name}/kernels.cu", prelude + cuda))
        bc.functions = functions
        texts = [["cpp", cpp], ["cuda", cuda]]
        bc.with_cuda = with_cuda or bool(cuda)
    else:
        expr = _argument(call, kind, "sources")
        elements = _elements(expr, consts) if expr is not None else None
        if not elements:
            raise InvalidRequest(f"{label}: its sources must be a literal list of paths")
        texts = []
        for element in elements:
            path = _shipped(element, consts, files)
            if path is None:
                raise InvalidRequest(
                    f"{label}: cannot tell which of the candidate's files {ast.unparse(element)[:80]} is "
                    f"(files: {', '.join(sorted(files)) or 'none'}); a single-file candidate ships no "
                    "sources, give a folder with them"
                )
            bc.files.append((path, files[path]))
            texts.append([path.rsplit(".", 1)[-1], files[path]])
        bc.with_cuda = with_cuda or any(p.endswith((".cu", ".cuh")) for p, _ in bc.files)
    bc.digest = call_digest(kind, name, texts, bc.functions, cflags, cuda_cflags, ldflags)
    return bc


_FLAG_PARAMS = ("extra_cflags", "extra_cuda_cflags", "extra_ldflags")


def _text(value: object, label: str) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return "\n".join(value)
    raise InvalidRequest(f"{label}: sources must be a string or a list of strings")


def _strings(value: object, label: str, param: str) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return list(value)
    raise InvalidRequest(f"{label}: {param} must be a list of strings")


def _literal(node: ast.expr, consts: dict[str, ast.expr], depth: int) -> object:
    if depth > 20:
        raise RecursionError("constant chain too deep")
    if isinstance(node, ast.Name):
        return _literal(consts[node.id], consts, depth + 1)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _literal(node.left, consts, depth + 1), _literal(node.right, consts, depth + 1)
        if isinstance(left, str) and isinstance(right, str):
            return left + right
        if isinstance(left, list) and isinstance(right, list):
            return left + right
        raise TypeError("only str + str or list + list")
    if isinstance(node, ast.List | ast.Tuple):
        return [_literal(e, consts, depth + 1) for e in node.elts]
    if isinstance(node, ast.Dict):
        return {
            _literal(k, consts, depth + 1): _literal(v, consts, depth + 1)
            for k, v in zip(node.keys, node.values, strict=True)
            if k is not None
        }
    if isinstance(node, ast.JoinedStr) and all(isinstance(v, ast.Constant) for v in node.values):
        return "".join(str(v.value) for v in node.values)  # type: ignore[attr-defined]
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "dedent"
        and len(node.args) == 1
        and not node.keywords
    ):
        import textwrap

        text = _literal(node.args[0], consts, depth + 1)
        if isinstance(text, str):
            return textwrap.dedent(text)
    return ast.literal_eval(node)


def _elements(expr: ast.expr, consts: dict[str, ast.expr]) -> list[ast.expr] | None:
    for _ in range(10):
        if isinstance(expr, ast.Name) and expr.id in consts:
            expr = consts[expr.id]
        else:
            break
    if isinstance(expr, ast.List | ast.Tuple):
        return list(expr.elts)
    return None


def _shipped(element: ast.expr, consts: dict[str, ast.expr], files: dict[str, str]) -> str | None:
    """The candidate file a source path names: a literal path, or the last literal of a path expression
    (os.path.join(os.path.dirname(__file__), "k.cpp"), Path(__file__).parent / "csrc/k.cu", f"{d}/k.cpp")."""
    if isinstance(element, ast.Name) and element.id in consts:
        element = consts[element.id]
    literals = [
        n.value for n in ast.walk(element) if isinstance(n, ast.Constant) and isinstance(n.value, str)
    ]
    if not literals:
        return None
    tail = literals[-1].lstrip("/")
    tail = tail[2:] if tail.startswith("./") else tail
    if tail in files:
        return tail
    matches = [p for p in files if p.endswith("/" + tail)]
    return matches[0] if len(matches) == 1 else None


# -- where the calls are -------------------------------------------------------------------------------


def _constants(body: Sequence[ast.AST]) -> dict[str, ast.expr]:
    """Names assigned exactly once in these statements (assigned twice or augmented is not constant)."""
    seen: dict[str, ast.expr] = {}
    twice: set[str] = set()

    def bind(name: str, value: ast.expr) -> None:
        if name in seen:
            twice.add(name)
        seen[name] = value

    for stmt in body:
        if isinstance(stmt, ast.Assign):
            for target in stmt.targets:
                if isinstance(target, ast.Name):
                    bind(target.id, stmt.value)
        elif isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and stmt.value is not None:
            bind(stmt.target.id, stmt.value)
        elif isinstance(stmt, ast.AugAssign) and isinstance(stmt.target, ast.Name):
            twice.add(stmt.target.id)
    return {k: v for k, v in seen.items() if k not in twice}


def _calls(tree: ast.Module, imports: dict[str, str]) -> list[tuple[ast.Call, ast.AST | None, bool]]:
    """(call, enclosing function or None, inside a try) for every build call, in source order."""
    out: list[tuple[ast.Call, ast.AST | None, bool]] = []
    todo: list[tuple[ast.AST, ast.AST | None, bool]] = [(tree, None, False)]
    while todo:
        node, scope, in_try = todo.pop()
        if is_build_call(node, imports):
            out.append((node, scope, in_try))  # type: ignore[arg-type]
        inner_scope = node if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda) else scope
        nested_try = in_try or isinstance(node, ast.Try | ast.TryStar)
        for child in ast.iter_child_nodes(node):
            todo.append((child, inner_scope, nested_try))
    for node in ast.walk(tree):
        for child in ast.iter_child_nodes(node):
            child.parent = node  # type: ignore[attr-defined]
    return sorted(out, key=lambda c: (c[0].lineno, c[0].col_offset))


def _where(scope: ast.AST | None) -> str:
    if scope is None:
        return "at module level"
    if isinstance(scope, ast.Lambda):
        return "in a lambda"
    name = getattr(scope, "name", "?")
    decorators = [ast.unparse(d.func if isinstance(d, ast.Call) else d) for d in scope.decorator_list]  # type: ignore[attr-defined]
    if any(d in CACHE_DECORATORS for d in decorators):
        return f"in cached helper {name}"
    owner = getattr(scope, "parent", None)
    if isinstance(owner, ast.ClassDef):
        return f"in {name}" if name in {"__init__", "forward"} else f"in {owner.name}.{name}"
    if isinstance(owner, ast.Module):
        return f"in helper {name}"
    return f"in {name}"
