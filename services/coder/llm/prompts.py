"""Renders the generate and optimize prompts from the jinja2 templates kept beside this module."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jinja2

from stitchcuda.api.v1 import code_pb2, plan_pb2, verify_pb2

TEMPLATES = Path(__file__).with_name("templates")
_LANG = {
    ".py": "python",
    ".cu": "cuda",
    ".cuh": "cuda",
    ".cpp": "cpp",
    ".cc": "cpp",
    ".h": "cpp",
    ".hpp": "cpp",
}


@dataclass
class Doc:
    title: str
    text: str


def environment() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATES)),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=False,
        autoescape=False,
    )


_ENV = environment()


def plan_text(plan: plan_pb2.Plan | None, *, limit: int = 6000) -> str:
    """A compact, readable rendering of the plan: subtasks, their ops, shapes, bounds and priorities."""
    if plan is None or not (plan.subtasks or plan.inputs):
        return ""
    lines: list[str] = []
    if plan.inputs:
        lines.append("Inputs: " + ", ".join(f"{t.name}{list(t.shape)} {t.dtype}" for t in plan.inputs))
    if plan.outputs:
        lines.append("Outputs: " + ", ".join(f"{t.name}{list(t.shape)} {t.dtype}" for t in plan.outputs))
    if plan.eager_ms:
        lines.append(
            f"Reference: eager {plan.eager_ms:.3f} ms, torch.compile {plan.compile_ms:.3f} ms, "
            f"floor {plan.floor_ms:.3f} ms"
        )
    for st in sorted(plan.subtasks, key=lambda s: s.priority):
        kind = plan_pb2.SubtaskKind.Name(st.kind).replace("SUBTASK_KIND_", "").lower()
        ops = ", ".join(f"{o.name}={o.target}" for o in st.ops)
        extra = []
        if st.anchor:
            extra.append(f"anchor {st.anchor}")
        if st.library_call:
            extra.append("library call with fused epilogue")
        if st.time_share:
            extra.append(f"{100 * st.time_share:.0f}% of time")
        if st.bound:
            extra.append(f"{st.bound}-bound")
        lines.append(f"- {st.id} [{kind}] {ops}" + (f" ({'; '.join(extra)})" if extra else ""))
        if st.notes:
            lines.append(f"  {st.notes}")
    for note in plan.orchestration.notes:
        lines.append(f"Note: {note}")
    for w in plan.warnings:
        lines.append(f"Warning: {w}")
    text = "\n".join(lines)
    return text if len(text) <= limit else text[:limit] + "\n(plan truncated)"


def verdict_summary(verdict: verify_pb2.Verdict) -> str:
    parts = [
        ("accepted" if verdict.accepted else "rejected") + (f" ({verdict.reason})" if verdict.reason else "")
    ]
    if verdict.compiled and verdict.correctness.trials:
        parts.append(
            f"max rel_l2 {verdict.correctness.max_rel_l2:.2e} (tolerance {verdict.correctness.tolerance:.1e})"
        )
    if verdict.speedup_vs_eager:
        parts.append(
            f"{verdict.speedup_vs_eager:.2f}x vs eager, {verdict.speedup_vs_compile:.2f}x vs torch.compile"
        )
    if verdict.custom_kernel_share:
        parts.append(f"custom kernels {100 * verdict.custom_kernel_share:.0f}% of device time")
    return "; ".join(parts)


def feedback_text(verdict: verify_pb2.Verdict, *, limit: int = 8000) -> str:
    text = verdict.feedback.strip()
    if not text:
        lines = []
        if verdict.build.error:
            lines.append("Build error:\n" + verdict.build.error)
        for f in verdict.findings:
            lines.append(f"[{f.rule}] {f.detail}" + (f" ({f.where})" if f.where else ""))
        for k in verdict.profile.kernels[:8]:
            lines.append(f"kernel {k.name} ({k.origin}): {k.time_ms:.3f} ms, {100 * k.share:.0f}% {k.bound}")
        text = "\n".join(lines)
    return text if len(text) <= limit else text[:limit] + "\n(feedback truncated)"


def _files(candidate: code_pb2.Candidate, limit: int) -> list[dict[str, str]]:
    out = []
    budget = limit
    for f in candidate.files:
        content = f.content if len(f.content) <= budget else f.content[: max(budget, 0)] + "\n// (truncated)"
        budget -= len(content)
        suffix = Path(f.path).suffix
        out.append({"path": f.path, "content": content, "lang": _LANG.get(suffix, "")})
    return out


def render_system(
    *, target: str, dtype: str = "float32", structured: bool = False, library_policy: bool = False
) -> str:
    return _ENV.get_template("system.j2").render(
        target=target, dtype=dtype or "float32", structured=structured, library_policy=library_policy
    )


def render_generate(
    *, reference: str, plan: plan_pb2.Plan | None, target: str, docs: list[Doc], problem: str = ""
) -> str:
    return _ENV.get_template("generate.j2").render(
        reference=reference.strip(), plan_text=plan_text(plan), target=target, docs=docs, problem=problem
    )


def render_optimize(
    *,
    reference: str,
    plan: plan_pb2.Plan | None,
    target: str,
    previous: code_pb2.Candidate,
    verdict: verify_pb2.Verdict,
    docs: list[Doc],
    problem: str = "",
    file_budget: int = 40_000,
) -> str:
    variant: dict[str, Any] = {k: v for k, v in previous.variant.items() if k != "tried"}
    return _ENV.get_template("optimize.j2").render(
        reference=reference.strip(),
        plan_text=plan_text(plan),
        target=target,
        previous_files=_files(previous, file_budget),
        previous_variant=", ".join(f"{k}={v}" for k, v in sorted(variant.items())),
        verdict_summary=verdict_summary(verdict),
        feedback=feedback_text(verdict),
        accepted=verdict.accepted,
        docs=docs,
        problem=problem,
    )
