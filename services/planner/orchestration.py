"""Host-side orchestration notes: preallocation, concurrency, CUDA graphs and init-time weight transforms."""

from __future__ import annotations

from stitchcuda.api.v1 import plan_pb2
from stitchcuda.planner.fusion import Fuser, Group
from stitchcuda.planner.graph import Graph

HOST_SYNC_OPS = frozenset({"item", "tolist", "nonzero", "masked_select", "unique", "_local_scalar_dense"})
LAUNCH_US = 4.0  # a kernel launch costs a few microseconds of host time; CUDA graphs remove most of it


def _mib(n: float) -> str:
    return f"{n / (1 << 20):.2f} MiB" if n >= 1 << 20 else f"{n / 1024:.1f} KiB"


def levels(groups: list[Group], fuser: Fuser) -> dict[str, int]:
    """Depth of each group in the dependency DAG: groups of equal depth never depend on each other."""
    depth: dict[str, int] = {}
    for group in groups:  # already in topological order
        deps = fuser.dependencies(group)
        depth[group.id] = 1 + max((depth[d.id] for d in deps), default=0)
    return depth


def orchestrate(
    graph: Graph,
    groups: list[Group],
    fuser: Fuser,
    subtasks: list[plan_pb2.Subtask],
    *,
    device: str,
    capture: str,
    program_outputs: set[str],
) -> plan_pb2.Orchestration:
    orch = plan_pb2.Orchestration()
    # Intermediates: tensors one subtask writes and another reads; shapes are static, so each can be
    # allocated once (at init or the first call) and reused, never per call.
    intermediates = [
        (st.id, t)
        for st in subtasks
        for t in st.outputs
        if t.name not in program_outputs and len(subtasks) > 1
    ]
    if intermediates:
        orch.preallocate_intermediates = True
        total = 0.0
        items = []
        for st_id, t in intermediates:
            n = 1
            for d in t.shape:
                n *= d
            size = n * _itemsize(t.dtype)
            total += size
            items.append(f"{t.name}{list(t.shape)} from {st_id}")
        orch.notes.append(
            f"preallocate {len(items)} intermediate buffer(s), {_mib(total)} in all, once: "
            + ", ".join(items[:12])
        )
    else:
        orch.notes.append("single subtask: only the output is allocated per call")

    depth = levels(groups, fuser)
    by_level: dict[int, list[str]] = {}
    for group in groups:
        by_level.setdefault(depth[group.id], []).append(group.id)
    for ids in by_level.values():
        if len(ids) > 1:
            orch.concurrent_groups.append(",".join(ids))
    if orch.concurrent_groups:
        orch.notes.append(
            "subtasks listed together in concurrent_groups are independent: they may run on separate streams"
        )

    host_sync = [n.name for n in graph.nodes if n.target in HOST_SYNC_OPS]
    static = capture in ("fx", "export") and not host_sync
    if device == "cuda" and static:
        orch.cuda_graphs = True
        floor_us = sum(st.floor_ms for st in subtasks) * 1e3
        orch.notes.append(
            f"static shapes and control flow: capture the {len(subtasks)}-kernel forward in a CUDA graph "
            "after "
            f"warm-up (launch cost ~{LAUNCH_US * len(subtasks):.0f} us against a floor of {floor_us:.1f} us)"
        )
    elif device == "cuda":
        why = (
            f"host synchronisation in {', '.join(host_sync)}"
            if host_sync
            else "control flow was not captured"
        )
        orch.notes.append(f"no CUDA graph: {why}")
    else:
        orch.notes.append("CPU backend: no CUDA graphs; keep intermediates in preallocated buffers")
    if host_sync:
        orch.notes.append(
            f"host synchronisation points (keep them out of the hot path): {', '.join(host_sync)}"
        )

    orch.init_time_transforms.extend(_init_transforms(graph, groups, device))
    host = [
        n for n in graph.nodes if n.kind == "host" and n.target not in ("getattr", "getitem", "size", "dim")
    ]
    if host:
        names = ", ".join(f"{n.name} ({n.target})" for n in host[:8])
        orch.notes.append(
            f"scalar arithmetic on shapes is host-side and constant per shape: compute it once ({names})"
        )
    return orch


def _itemsize(dtype: str) -> int:
    for token, size in (("64", 8), ("32", 4), ("16", 2), ("8", 1), ("bool", 1)):
        if token in dtype:
            return size
    return 4


def _init_transforms(graph: Graph, groups: list[Group], device: str) -> list[str]:
    transforms: list[str] = []
    for group in groups:
        anchor = graph.by_name.get(group.anchor)
        for bn in group.folded:
            transforms.append(
                f"{group.id}: fold {bn} (inference batch norm: running_mean, running_var, weight, bias, "
                "eps) into "
                f"{anchor.name if anchor else 'the anchor'}'s weight and a per-channel bias, once at init"
            )
        if anchor is None or anchor.info.module is None:
            continue
        params = {p.name: p for p in anchor.info.module.params}
        cls = anchor.info.module.class_
        if anchor.kind == "conv" and device == "cuda":
            weight = next((p for name, p in params.items() if name.endswith(".weight")), None)
            if weight is not None:
                transforms.append(
                    f"{group.id}: {weight.name}{list(weight.shape)} to channels_last once at init if the "
                    "conv runs "
                    "NHWC (tensor-core implicit GEMM); the input then needs the same layout"
                )
        if anchor.kind == "gemm" and not group.library_call:
            weight = next((p for name, p in params.items() if name.endswith(".weight")), None)
            if weight is not None and len(weight.shape) == 2:
                transforms.append(
                    f"{group.id}: pre-transpose {weight.name}{list(weight.shape)} to [in, out] (K-major) "
                    "at init "
                    "for coalesced tile loads"
                )
        if cls in ("LSTM", "GRU", "RNN"):
            gates = {"LSTM": 4, "GRU": 3}.get(cls, 1)
            transforms.append(
                f"{group.id}: per layer, concatenate weight_ih and weight_hh into one [{gates}H, I+H] "
                "matrix and "
                f"pre-add bias_ih + bias_hh at init, so each time step is one GEMM plus a fused gate kernel"
            )
    for node in graph.nodes:
        if node.kind != "param":
            continue
        for t in node.outputs:
            if len(t.shape) >= 2 and all(d == 1 for d in t.shape[1:]):
                transforms.append(
                    f"{node.name}{list(t.shape)} is a per-channel vector: flatten to [{t.shape[0]}] at "
                    "init for "
                    "the epilogue"
                )
    return transforms
