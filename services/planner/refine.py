"""LLM refinement of fusion boundaries and orchestration: the prompt, the answer's schema, its validation."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from stitchcuda.api.v1 import plan_pb2
from stitchcuda.planner.fusion import ANCHOR_KINDS, LIBRARY_KINDS, CycleError, Fuser, Group
from stitchcuda.planner.graph import Graph
from stitchcuda.planner.llm import Message

KINDS = ["elementwise", "gemm", "conv", "reduction", "norm", "softmax", "pool", "attention", "rnn", "opaque"]
MAX_TEXT = 600
MAX_SUBTASKS = 256

SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "required": ["subtasks"],
    "properties": {
        "subtasks": {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": "object",
                "additionalProperties": False,
                "required": ["ops"],
                "properties": {
                    "ops": {"type": "array", "items": {"type": "string"}, "minItems": 1},
                    "kind": {"type": "string", "enum": KINDS},
                    "anchor": {"type": "string"},
                    "library_call": {"type": "boolean"},
                    "notes": {"type": "string"},
                },
            },
        },
        "orchestration": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "cuda_graphs": {"type": "boolean"},
                "init_time_transforms": {"type": "array", "items": {"type": "string"}},
                "notes": {"type": "array", "items": {"type": "string"}},
            },
        },
        "rationale": {"type": "string"},
    },
}

SYSTEM = (
    "You are the fusion planner of StitchCUDA, which rewrites a PyTorch program as custom CUDA kernels. "
    "You get the program's captured graph (op names, shapes, FLOPs, bytes, measured times) and a "
    "deterministic "
    "plan that groups ops into kernels. Improve the grouping where a better kernel split exists (fewer round "
    "trips to memory, anchors that fuse their epilogues, library GEMM/conv kept where they win) and add host "
    "orchestration advice. Rules: list every compute op name exactly once across subtasks, spelled as given; "
    "a subtask must not read another subtask's output if that one reads its own (no cycles); "
    "cuBLAS/cuDNN calls "
    "(library_call) cannot take an elementwise prologue. Answer with one JSON object following the schema, "
    "nothing else."
)


class InvalidAnswer(ValueError):
    """The LLM's answer is not a usable refinement; the deterministic plan stands."""


@dataclass
class Refinement:
    groups: list[Group]
    fuser: Fuser
    cuda_graphs: bool | None = None
    init_time_transforms: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def messages(plan: plan_pb2.Plan, graph: Graph) -> list[Message]:
    ops = [
        {
            "name": n.name,
            "op": n.target,
            "kind": n.kind,
            "reads": [p.name for p in graph.inputs_of(n)],
            "shape": [t.shape for t in n.outputs],
            "flops": n.flops,
            "bytes": n.bytes,
        }
        for n in graph.nodes
        if n.compute
    ]
    times = {p.node: p.time_ms for p in plan.profile}
    for op in ops:
        op["time_ms"] = times.get(str(op["name"]), 0.0)
    current = [
        {
            "id": st.id,
            "kind": plan_pb2.SubtaskKind.Name(st.kind).removeprefix("SUBTASK_KIND_").lower(),
            "anchor": st.anchor,
            "ops": [o.name for o in st.ops if graph.by_name.get(o.name) and graph.node(o.name).compute],
            "library_call": st.library_call,
            "floor_ms": st.floor_ms,
            "time_share": st.time_share,
        }
        for st in plan.subtasks
    ]
    context = {
        "problem": plan.problem_name,
        "device": plan.ceilings.device_name,
        "dtype": plan.dtype,
        "compute_ops": ops,
        "deterministic_plan": current,
        "eager_ms": plan.eager_ms,
        "floor_ms": plan.floor_ms,
    }
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": json.dumps(context)}]


def _text(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise InvalidAnswer(f"{where} must be a string")
    return value[:MAX_TEXT]


def _texts(value: Any, where: str) -> list[str]:
    if not isinstance(value, list):
        raise InvalidAnswer(f"{where} must be a list of strings")
    return [_text(v, where) for v in value[:32]]


def parse(answer: str, graph: Graph, *, library_gemm: bool = True) -> Refinement:
    """Validates an answer against the schema and the graph; raises InvalidAnswer with the first problem."""
    try:
        doc = json.loads(answer)
    except json.JSONDecodeError as exc:
        raise InvalidAnswer(f"not JSON ({exc.msg} at char {exc.pos})") from exc
    if not isinstance(doc, dict):
        raise InvalidAnswer("the answer is not a JSON object")
    unknown = set(doc) - set(SCHEMA["properties"])
    if unknown:
        raise InvalidAnswer(f"unexpected keys {sorted(unknown)}")
    items = doc.get("subtasks")
    if not isinstance(items, list) or not items:
        raise InvalidAnswer("'subtasks' must be a non-empty list")
    if len(items) > MAX_SUBTASKS:
        raise InvalidAnswer(f"{len(items)} subtasks (limit {MAX_SUBTASKS})")
    compute = {n.name for n in graph.compute_nodes()}
    seen: dict[str, int] = {}
    groups = []
    for i, item in enumerate(items):
        groups.append(_group(item, i, graph, compute, seen, library_gemm))
    missing = sorted(compute - set(seen), key=lambda n: graph.node(n).index)
    if missing:
        raise InvalidAnswer(f"compute ops missing from every subtask: {', '.join(missing[:8])}")
    try:
        fuser = Fuser.from_groups(graph, groups, library_gemm=library_gemm)
    except CycleError as exc:
        raise InvalidAnswer(str(exc)) from exc
    refinement = Refinement(groups=fuser.groups, fuser=fuser)
    orch = doc.get("orchestration", {})
    if not isinstance(orch, dict) or set(orch) - {"cuda_graphs", "init_time_transforms", "notes"}:
        raise InvalidAnswer("'orchestration' must be an object with cuda_graphs, init_time_transforms, notes")
    if "cuda_graphs" in orch:
        if not isinstance(orch["cuda_graphs"], bool):
            raise InvalidAnswer("orchestration.cuda_graphs must be a boolean")
        refinement.cuda_graphs = orch["cuda_graphs"]
    refinement.init_time_transforms = _texts(orch.get("init_time_transforms", []), "init_time_transforms")
    refinement.notes = _texts(orch.get("notes", []), "orchestration.notes")
    if "rationale" in doc:
        refinement.notes.append("rationale: " + _text(doc["rationale"], "rationale"))
    return refinement


def _group(
    item: Any, i: int, graph: Graph, compute: set[str], seen: dict[str, int], library_gemm: bool
) -> Group:
    where = f"subtasks[{i}]"
    if not isinstance(item, dict):
        raise InvalidAnswer(f"{where} is not an object")
    extra = set(item) - {"ops", "kind", "anchor", "library_call", "notes"}
    if extra:
        raise InvalidAnswer(f"{where} has unexpected keys {sorted(extra)}")
    ops = item.get("ops")
    if not isinstance(ops, list) or not all(isinstance(o, str) for o in ops):
        raise InvalidAnswer(f"{where}.ops must be a list of op names")
    names = []
    for name in ops:
        if name not in graph.by_name:
            raise InvalidAnswer(f"{where} names an op the graph does not have: {name!r}")
        if name not in compute:
            continue  # layout ops are re-attached deterministically
        if name in seen:
            raise InvalidAnswer(f"op {name!r} is in subtasks[{seen[name]}] and {where}")
        seen[name] = i
        names.append(name)
    if not names:
        raise InvalidAnswer(f"{where} has no compute op")
    nodes = sorted((graph.node(n) for n in names), key=lambda n: n.index)
    anchor_name = item.get("anchor", "")
    if not isinstance(anchor_name, str):
        raise InvalidAnswer(f"{where}.anchor must be a string")
    if anchor_name and anchor_name not in names:
        raise InvalidAnswer(f"{where}.anchor {anchor_name!r} is not one of its compute ops")
    anchors = [n for n in nodes if n.kind in ANCHOR_KINDS]
    anchor = graph.node(anchor_name) if anchor_name else max(anchors, key=lambda n: n.flops, default=None)
    kind = anchor.kind if anchor is not None and anchor.kind in ANCHOR_KINDS else "elementwise"
    wanted = item.get("kind")
    if wanted is not None and wanted not in KINDS:
        raise InvalidAnswer(f"{where}.kind {wanted!r} is not one of {KINDS}")
    softmaxes = sum(n.kind == "softmax" for n in nodes)
    gemms = sum(n.kind == "gemm" for n in nodes)
    if wanted == "attention" and softmaxes and gemms >= 2:
        kind = "attention"
    library = item.get("library_call", library_gemm and kind in LIBRARY_KINDS)
    if not isinstance(library, bool):
        raise InvalidAnswer(f"{where}.library_call must be a boolean")
    group = Group(
        nodes=[n.name for n in nodes],
        kind=kind,
        anchor=anchor.name if anchor is not None and kind != "elementwise" else "",
        library_call=library and kind in LIBRARY_KINDS,
    )
    if kind in ("conv", "gemm"):
        group.folded = [
            n.name
            for n in nodes
            if n.target == "batch_norm"
            and n.info.module is not None
            and n.info.module.constants.get("training") == "False"
        ]
    if anchor is not None and group.library_call and any(n.index < anchor.index for n in nodes):
        raise InvalidAnswer(f"{where}: a library call ({anchor.name}) cannot take a prologue")
    notes = item.get("notes")
    if notes:
        group.notes.append("llm: " + _text(notes, f"{where}.notes"))
    return group
