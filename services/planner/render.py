"""A plan for people: a text table (render_plan) and a JSON-ready dict (plan_to_json) for the CLI."""

from __future__ import annotations

from typing import Any

from google.protobuf import json_format

from stitchcuda.api.v1 import plan_pb2


def kind_name(kind: int) -> str:
    return plan_pb2.SubtaskKind.Name(kind).removeprefix("SUBTASK_KIND_").lower()  # type: ignore[arg-type]


def _si(x: float, unit: str = "") -> str:
    for scale, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= scale:
            return f"{x / scale:.2f}{prefix}{unit}"
    return f"{x:.0f}{unit}"


def _ms(value: float) -> str:
    return f"{value:.4f} ms" if value > 0 else "not measured"


def _tensor(t: plan_pb2.TensorSpec) -> dict[str, Any]:
    return {"name": t.name, "shape": list(t.shape), "dtype": t.dtype, "layout": t.layout}


def _op(o: plan_pb2.OpNode) -> dict[str, Any]:
    return {
        "name": o.name,
        "target": o.target,
        "args": list(o.args),
        "kwargs": dict(o.kwargs),
        "outputs": [_tensor(t) for t in o.outputs],
        "aten_ops": list(o.aten_ops),
        "line": o.line,
    }


def _profile(p: plan_pb2.OpProfile) -> dict[str, Any]:
    return {
        "node": p.node,
        "op": p.op,
        "flops": p.flops,
        "bytes": p.bytes,
        "time_ms": p.time_ms,
        "time_share": p.time_share,
        "bound": p.bound,
    }


def plan_to_json(plan: plan_pb2.Plan) -> dict[str, Any]:
    """The plan as plain JSON types: subtasks (ops, inputs, outputs, flops, bytes, time_share...), totals,
    floor_ms and the measured profile."""
    return {
        "problem_name": plan.problem_name,
        "device": plan.ceilings.device_name,
        "dtype": plan.dtype,
        "capture": plan.capture,
        "planner": plan.planner,
        "last_resort": plan.last_resort,
        "subtasks": [
            {
                "id": st.id,
                "kind": kind_name(st.kind),
                "anchor": st.anchor,
                "library_call": st.library_call,
                "ops": [_op(o) for o in st.ops],
                "inputs": [_tensor(t) for t in st.inputs],
                "outputs": [_tensor(t) for t in st.outputs],
                "flops": st.flops,
                "bytes": st.bytes,
                "time_share": st.time_share,
                "floor_ms": st.floor_ms,
                "priority": st.priority,
                "bound": st.bound,
                "depends_on": list(st.depends_on),
                "notes": st.notes,
            }
            for st in plan.subtasks
        ],
        "inputs": [_tensor(t) for t in plan.inputs],
        "outputs": [_tensor(t) for t in plan.outputs],
        "parameters": [_tensor(t) for t in plan.parameters],
        "total_flops": plan.total_flops,
        "total_bytes": plan.total_bytes,
        "floor_ms": plan.floor_ms,
        "profile": {
            "eager_ms": plan.eager_ms,
            "compile_ms": plan.compile_ms,
            "profiler": plan.profiler,
            "ops": [_profile(p) for p in plan.profile],
            "kernels": [_profile(p) for p in plan.kernels],
        },
        "ceilings": json_format.MessageToDict(plan.ceilings, preserving_proto_field_name=True),
        "orchestration": json_format.MessageToDict(plan.orchestration, preserving_proto_field_name=True),
        "warnings": list(plan.warnings),
    }


def render_plan(plan: plan_pb2.Plan) -> str:
    """A table of subtasks with totals, orchestration and warnings."""
    c = plan.ceilings
    lines = [
        f"Plan for {plan.problem_name} on {c.device_name} ({plan.dtype}, capture: {plan.capture or 'none'}, "
        f"planner: {plan.planner}){'  [LAST RESORT]' if plan.last_resort else ''}",
        f"total {_si(plan.total_flops, 'FLOP')}, {_si(plan.total_bytes, 'B')} min traffic, floor "
        f"{plan.floor_ms:.4f} ms on {c.bandwidth_gbps:.0f} GB/s / "
        f"{c.vector_tflops:g}+{c.matrix_tflops:g} TFLOP/s; "
        f"eager {_ms(plan.eager_ms)}, torch.compile {_ms(plan.compile_ms)}",
        "",
    ]
    header = ("id", "kind", "anchor", "ops", "flops", "bytes", "share", "floor_ms", "prio", "lib", "bound")
    rows = [header]
    for st in plan.subtasks:
        ops = ", ".join(o.name for o in st.ops)
        rows.append(
            (
                st.id,
                kind_name(st.kind),
                st.anchor or "-",
                ops if len(ops) <= 48 else ops[:45] + "...",
                _si(st.flops),
                _si(st.bytes, "B"),
                f"{st.time_share * 100:.1f}%",
                f"{st.floor_ms:.4f}",
                str(st.priority),
                "yes" if st.library_call else "",
                st.bound,
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    for r in rows:
        lines.append("  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip())
    lines.append("")
    for st in plan.subtasks:
        if st.notes:
            lines.append(f"{st.id}: {st.notes}")
    orch = plan.orchestration
    lines.append("")
    lines.append(
        f"orchestration: preallocate={orch.preallocate_intermediates} cuda_graphs={orch.cuda_graphs}"
        + (f" concurrent={list(orch.concurrent_groups)}" if orch.concurrent_groups else "")
    )
    lines.extend(f"  init: {t}" for t in orch.init_time_transforms)
    lines.extend(f"  note: {n}" for n in orch.notes)
    if plan.kernels:
        lines.append("top kernels: " + ", ".join(f"{k.op} {k.time_ms:.4f} ms" for k in plan.kernels[:5]))
    lines.extend(f"warning: {w}" for w in plan.warnings)
    return "\n".join(lines)
