"""KernelBench-format reference programs: static validation and loading a problem from a file."""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

from stitchcuda.shared.artifacts import sha256_hex
from stitchcuda.shared.errors import ProblemError

REQUIRED = ("Model", "get_inputs", "get_init_inputs")


@dataclass(frozen=True)
class Problem:
    name: str
    source: str
    sha256: str


def validate_source(source: str, *, max_bytes: int = 256 * 1024, name: str = "reference") -> ast.Module:
    """Static checks that need no execution: size, syntax, and the three required definitions.

    Returns the parsed module, for callers with checks of their own.

    Raises ProblemError with a one-line reason naming the problem (execution errors are found by the
    Planner, which runs the reference in a subprocess and names the failing line).
    """
    if not source.strip():
        raise ProblemError(f"{name}: the reference program is empty")
    size = len(source.encode())
    if size > max_bytes:
        raise ProblemError(f"{name}: the reference program is {size} bytes (limit {max_bytes})")
    try:
        tree = ast.parse(source, filename=name)
    except SyntaxError as exc:
        raise ProblemError(f"{name}: syntax error at line {exc.lineno}: {exc.msg}") from exc
    defined = set()
    for stmt in tree.body:
        if isinstance(stmt, ast.ClassDef | ast.FunctionDef):
            defined.add(stmt.name)
        elif isinstance(stmt, ast.Assign):
            defined.update(t.id for t in stmt.targets if isinstance(t, ast.Name))
    missing = [n for n in REQUIRED if n not in defined]
    if missing:
        raise ProblemError(f"{name}: the reference program does not define {', '.join(missing)}")
    return tree


def load(path: Path, *, max_bytes: int = 256 * 1024) -> Problem:
    try:
        source = path.read_text()
    except FileNotFoundError:
        raise ProblemError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ProblemError(f"{path}: cannot read the reference program: {exc}") from exc
    validate_source(source, max_bytes=max_bytes, name=path.name)
    return Problem(name=path.stem, source=source, sha256=sha256_hex(source))
