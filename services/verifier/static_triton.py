"""D11 checks only Triton candidates need: a kernel launched only behind a dtype gate never taken.

The rest of Triton's ways of not doing the work are the general scan's: a @triton.jit kernel never launched
from forward (D11.unlaunched-kernel, static_module), torch compute in the launcher (D11.torch-op, the taint
analysis counts `kernel[grid](...)` as the candidate's own call), TF32 in `tl.dot` or in the process-wide
flags (D11.precision, D11.tf32-default, D11.global-state), shape gates (D11.shape-gate).
"""

from __future__ import annotations

import ast

from stitchcuda.verifier.static_graph import Program, walk_body
from stitchcuda.verifier.static_module import Reference
from stitchcuda.verifier.static_names import Names, line
from stitchcuda.verifier.static_report import Hits

# Dtypes a float32 benchmark never passes; a launch gated on one of them never runs there.
_NOT_FP32 = {
    "float16",
    "half",
    "bfloat16",
    "float64",
    "double",
    "float8_e4m3fn",
    "float8_e5m2",
    "int8",
    "uint8",
}


def scan_triton(program: Program, names: Names, ref: Reference, hits: Hits, path: str) -> None:
    """Row 4: every launch of a function's Triton kernels sits under `if <input>.dtype == <dtype>` for a
    dtype the float32 reference never has; the function's other paths launch none."""
    kernels = program.triton_names()
    if not kernels or not ref.fp32:
        return
    for f, _ in program.reach():
        if f.is_triton or isinstance(f.node, ast.Lambda):
            continue
        body = walk_body(f.node)
        launches = [n for n in body if _launch(n, kernels)]
        if not launches:
            continue
        for node in body:
            if isinstance(node, ast.If) and (dtype := _dtype_gate(node.test, names)):
                inside = {id(n) for stmt in node.body for n in ast.walk(stmt)}
                if all(id(n) in inside for n in launches):
                    hits.add(
                        "D11.no-kernel-launch",
                        f"Triton kernels run only when an input's dtype is {dtype}, which the float32 "
                        f"benchmark never passes: {ast.unparse(node.test)[:80]}",
                        f"{path}:{line(node)}",
                    )


def _launch(node: ast.AST, kernels: set[str]) -> bool:
    """`kernel[grid](...)` of one of the module's Triton kernels."""
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Subscript)
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id in kernels
    )


def _dtype_gate(test: ast.expr, names: Names) -> str:
    """The dtype of `x.dtype == torch.float16` (either side, in an `and`), when not float32; else ""."""
    if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And):
        return next((d for v in test.values if (d := _dtype_gate(v, names))), "")
    if not (
        isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq | ast.Is)
    ):
        return ""
    left, right = test.left, test.comparators[0]
    for a, b in ((left, right), (right, left)):
        if isinstance(a, ast.Attribute) and a.attr == "dtype":
            q = names.qualname(b) or ""
            last = q.rsplit(".", 1)[-1]
            if q.startswith("torch.") and last in _NOT_FP32:
                return q
    return ""
