"""The job report: one dict built from the job's artifacts, rendered as JSON and as a self-contained page."""

from __future__ import annotations

import json
from importlib import resources
from typing import Any

import jinja2
from google.protobuf.json_format import MessageToDict

from stitchcuda.api.v1 import jobs_pb2, plan_pb2, verify_pb2
from stitchcuda.shared import pipeline
from stitchcuda.shared.artifacts import ArtifactStore, Keys
from stitchcuda.shared.errors import NotFound

SEVERITY = {0: "", 1: "info", 2: "warning", 3: "reject"}


def _verdict_row(round_: int, index: int, verdict: verify_pb2.Verdict) -> dict[str, Any]:
    return {
        "round": round_,
        "index": index,
        "candidate_id": verdict.candidate_id,
        "accepted": verdict.accepted,
        "compiled": verdict.compiled,
        "correct": verdict.correct,
        "speedup_vs_eager": verdict.speedup_vs_eager,
        "speedup_vs_compile": verdict.speedup_vs_compile,
        "custom_kernel_share": verdict.custom_kernel_share,
        "median_ms": verdict.timing.median_ms,
        "speedup_vs_eager_low": verdict.timing.speedup_vs_eager_low,
        "speedup_vs_eager_high": verdict.timing.speedup_vs_eager_high,
        "speedup_vs_compile_low": verdict.timing.speedup_vs_compile_low,
        "speedup_vs_compile_high": verdict.timing.speedup_vs_compile_high,
        "timing_rounds": verdict.timing.rounds,
        "eager_source": verdict.timing.eager_source,
        "compile_source": verdict.timing.compile_source,
        "noisy": verdict.timing.noisy,
        "eager_ms": verdict.timing.eager_ms,
        "compile_ms": verdict.timing.compile_ms,
        "reason": verdict.reason,
    }


def _verdict_detail(verdict: verify_pb2.Verdict) -> dict[str, Any]:
    return {
        "candidate_id": verdict.candidate_id,
        "reason": verdict.reason,
        "findings": [
            {"rule": f.rule, "severity": SEVERITY.get(f.severity, ""), "detail": f.detail, "where": f.where}
            for f in verdict.findings
        ],
        "trials": [
            {"name": t.name, "ok": t.ok, "rel_l2": t.rel_l2, "tolerance": t.tolerance, "detail": t.detail}
            for t in verdict.correctness.trials
        ],
        "timing": MessageToDict(verdict.timing, preserving_proto_field_name=True),
        "kernels": [
            {"name": k.name, "origin": k.origin, "time_ms": k.time_ms, "share": k.share, "bound": k.bound}
            for k in verdict.profile.kernels
        ],
        "profile": {
            "custom_share": verdict.profile.custom_share,
            "library_share": verdict.profile.library_share,
            "torch_share": verdict.profile.torch_share,
            "floor_ms": verdict.profile.floor_ms,
            "bound": verdict.profile.bound,
        },
        "environment": MessageToDict(verdict.environment, preserving_proto_field_name=True),
        "feedback": verdict.feedback,
        "build": {"ok": verdict.build.ok, "cached": verdict.build.cached, "seconds": verdict.build.seconds,
                  "error": verdict.build.error},
    }  # fmt: skip


def build(
    job: jobs_pb2.Job,
    artifacts: ArtifactStore,
    state: pipeline.LoopState | None,
    reason: str,
    *,
    final_state: jobs_pb2.JobState.ValueType | None = None,
) -> dict[str, Any]:
    """Collects what a person wants to see about a finished (or failed) job."""
    plan: dict[str, Any] | None = None
    plan_key = job.artifacts.get("plan")
    if plan_key:
        p = plan_pb2.Plan.FromString(artifacts.get(plan_key))
        plan = {
            "subtasks": [
                {"id": s.id, "kind": plan_pb2.SubtaskKind.Name(s.kind).removeprefix("SUBTASK_KIND_").lower(),
                 "ops": [o.target for o in s.ops], "flops": s.flops, "bytes": s.bytes,
                 "time_share": s.time_share, "library_call": s.library_call}
                for s in p.subtasks
            ],
            "total_flops": p.total_flops,
            "total_bytes": p.total_bytes,
            "floor_ms": p.floor_ms,
            "eager_ms": p.eager_ms,
            "warnings": list(p.warnings),
            "last_resort": p.last_resort,
        }  # fmt: skip
    rows: list[dict[str, Any]] = []
    details: dict[str, dict[str, Any]] = {}
    prefix = Keys.job(job.tenant_id, job.job_id) + "/rounds/"
    for key in artifacts.list(prefix):
        name = key.rsplit("/", 1)[-1]
        if not name.startswith("verdict-"):
            continue
        round_ = int(key.split("/")[-2])
        index = int(name.removeprefix("verdict-").removesuffix(".pb"))
        try:
            verdict = verify_pb2.Verdict.FromString(artifacts.get(key))
        except NotFound:
            continue
        rows.append(_verdict_row(round_, index, verdict))
        details[f"r{round_}c{index}"] = _verdict_detail(verdict)
    rows.sort(key=lambda r: (r["round"], r["index"]))
    max_rounds = job.spec.options.max_rounds if job.spec.HasField("options") else 0
    if state is not None:
        max_rounds, run = state.limits.max_rounds, pipeline.rounds_run(state)
    else:
        run = max((r["round"] for r in rows), default=-1) + 1
    best_id = f"r{state.best.round}c{state.best.index}" if state and state.best else ""
    return {
        "job_id": job.job_id,
        "tenant_id": job.tenant_id,
        "problem": job.spec.problem_name,
        "device": jobs_pb2.Device.Name(job.spec.device).removeprefix("DEVICE_").lower(),
        "state": jobs_pb2.JobState.Name(final_state if final_state is not None else job.status.state)
        .removeprefix("JOB_STATE_")
        .lower(),
        "succeeded": bool(best_id),
        "reason": reason,
        "best": details.get(best_id),
        "best_row": next((r for r in rows if f"r{r['round']}c{r['index']}" == best_id), None),
        "rounds": rows,
        "rounds_run": run,
        "rounds_total": pipeline.rounds_total(max_rounds),
        "rounds_text": pipeline.rounds_text(max_rounds),
        "replans": int(job.status.replans),
        "error_code": job.status.error_code,
        "last_rejection": None if best_id else next(reversed(details.values()), None),
        "plan": plan,
    }  # fmt: skip


def to_json(data: dict[str, Any]) -> str:
    return json.dumps(data, indent=2, sort_keys=True) + "\n"


def to_html(data: dict[str, Any]) -> str:
    template = resources.files("stitchcuda.shared").joinpath("templates/report.html.j2").read_text()
    env = jinja2.Environment(autoescape=True, undefined=jinja2.StrictUndefined)
    env.filters["pct"] = lambda v: f"{100 * float(v or 0):.1f}%"
    env.filters["x"] = lambda v: speedup_text(float(v or 0))
    env.filters["interval"] = lambda row, which: interval_text(
        float(row.get(f"speedup_vs_{which}_low") or 0), float(row.get(f"speedup_vs_{which}_high") or 0)
    )
    env.filters["ms"] = lambda v: f"{float(v or 0):.4f} ms"
    env.filters["si"] = _si
    return env.from_string(template).render(r=data)


def speedup_text(value: float) -> str:
    """A speedup as people read it; 0 means the baseline was not measured (or not available)."""
    return f"{value:.2f}x" if value > 0 else "n/a"


def interval_text(low: float, high: float) -> str:
    """'1.18-1.30x', the speedup's confidence interval, or '' when the verdict has none."""
    return f"{low:.2f}-{high:.2f}x" if high > low > 0 else ""


def vs_compile(value: float) -> str:
    """'1.42x vs torch.compile', or why there is no such number."""
    return f"{value:.2f}x vs torch.compile" if value > 0 else "torch.compile not timed"


def _si(value: float) -> str:
    value = float(value or 0)
    for unit, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(value) >= scale:
            return f"{value / scale:.2f} {unit}"
    return f"{value:.0f}"
