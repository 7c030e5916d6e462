"""Finds a candidate's Triton kernels: functions decorated with triton.jit (autotuned or not).

A Triton candidate builds nothing before its run: each kernel compiles on its first launch (and autotunes
then), inside the sandboxed run's warm-up. What the Verifier needs statically is only that the format is
Triton and which kernels it defines (the run marks their launches as the candidate's own work, D6).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

from stitchcuda.shared.errors import InvalidRequest

# Decorators that make a function a Triton kernel (or wrap one): the qualified names as imported.
JIT = ("triton.jit", "triton.language.jit", "triton.runtime.jit")


@dataclass(frozen=True)
class TritonKernel:
    name: str
    line: int
    autotuned: bool


def _imports(tree: ast.Module) -> dict[str, str]:
    """Local names bound to triton modules or objects: {"tl": "triton.language", "jit": "triton.jit"}."""
    out: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name == "triton" or a.name.startswith("triton."):
                    out[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "triton":
            for a in node.names:
                out[a.asname or a.name] = f"{node.module}.{a.name}"
    return out


def _qualname(node: ast.expr, imports: dict[str, str]) -> str:
    if isinstance(node, ast.Call):
        return _qualname(node.func, imports)
    if isinstance(node, ast.Name):
        return imports.get(node.id, "")
    if isinstance(node, ast.Attribute):
        base = _qualname(node.value, imports)
        return f"{base}.{node.attr}" if base else ""
    return ""


def find(source: str) -> list[TritonKernel]:
    """Every function of the module decorated with triton.jit (directly or under autotune/heuristics)."""
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        raise InvalidRequest(f"candidate does not parse: line {exc.lineno}: {exc.msg}") from exc
    imports = _imports(tree)
    if not imports:
        return []
    out: list[TritonKernel] = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.FunctionDef):
            continue
        names = [_qualname(d, imports) for d in node.decorator_list]
        if any(n in JIT for n in names):
            autotuned = any(n in ("triton.autotune", "triton.runtime.autotune") for n in names)
            out.append(TritonKernel(node.name, node.lineno, autotuned))
    return sorted(out, key=lambda k: k.line)


def describe(kernels: list[TritonKernel]) -> str:
    """ "triton: 1 @triton.jit kernel (softmax_kernel)", "triton: 2 @triton.jit kernels (a, b), autotuned"."""
    n = len(kernels)
    names = ", ".join(k.name for k in kernels[:4]) + (", ..." if n > 4 else "")
    tuned = ", autotuned" if any(k.autotuned for k in kernels) else ""
    return f"triton: {n} @triton.jit kernel{'s' if n != 1 else ''} ({names}){tuned}"
