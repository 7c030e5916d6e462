"""Builds the Plan message from the analysis, the fusion groups, the cost model and the measured profile."""

from __future__ import annotations

from dataclasses import dataclass, field

from stitchcuda.api.v1 import plan_pb2
from stitchcuda.planner.analysis import Analysis, KernelTime, RunResult, TensorInfo
from stitchcuda.planner.cost import MATRIX_KINDS, Ceilings
from stitchcuda.planner.fusion import Fuser, Group
from stitchcuda.planner.graph import MATERIALIZING, Graph, Node
from stitchcuda.planner.orchestration import orchestrate
from stitchcuda.shared import devices

SCHEMA_VERSION = 1
K = plan_pb2.SubtaskKind
PROTO_KIND = {
    "elementwise": K.SUBTASK_KIND_ELEMENTWISE, "layout": K.SUBTASK_KIND_ELEMENTWISE,
    "gemm": K.SUBTASK_KIND_GEMM,
    "conv": K.SUBTASK_KIND_CONV, "reduction": K.SUBTASK_KIND_REDUCTION, "norm": K.SUBTASK_KIND_NORM,
    "softmax": K.SUBTASK_KIND_SOFTMAX, "pool": K.SUBTASK_KIND_POOL, "attention": K.SUBTASK_KIND_ATTENTION,
    "rnn": K.SUBTASK_KIND_RNN, "opaque": K.SUBTASK_KIND_OPAQUE,
}  # fmt: skip


@dataclass
class Context:
    """Everything the assembly reads besides the graph."""

    problem_name: str
    reference_sha256: str
    device: str
    analysis: Analysis
    ceilings: Ceilings
    run: RunResult | None = None
    eager_ms: float = 0.0
    compile_ms: float = 0.0
    kernels: list[KernelTime] = field(default_factory=list)
    profiler: str = ""
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def tensor_spec(t: TensorInfo, name: str | None = None) -> plan_pb2.TensorSpec:
    return plan_pb2.TensorSpec(name=name or t.name, shape=t.shape, dtype=t.dtype, layout=t.layout)


def op_node(node: Node) -> plan_pb2.OpNode:
    info = node.info
    kwargs = dict(info.kwargs)
    if info.module is not None:
        kwargs.update({k: v for k, v in info.module.constants.items() if k not in kwargs})
    return plan_pb2.OpNode(
        name=info.name,
        target=node.target,
        args=info.args,
        kwargs=kwargs,
        outputs=[tensor_spec(t) for t in node.outputs],
        aten_ops=info.aten,
        line=info.line or 0,
    )


def problem_dtype(analysis: Analysis) -> str:
    """The floating dtype the problem computes in: its first floating input, else its first parameter."""
    for t in [*analysis.inputs, *analysis.parameters]:
        if t.is_tensor and ("float" in t.dtype or t.dtype.startswith("bfloat") or "complex" in t.dtype):
            return t.dtype
    return "float32"


class Assembler:
    def __init__(self, graph: Graph, fuser: Fuser, groups: list[Group], ctx: Context) -> None:
        self.graph = graph
        self.fuser = fuser
        self.groups = groups
        self.ctx = ctx
        self.node_ms = dict(ctx.run.node_ms) if ctx.run else {}

    def _source(self, node: Node, inside: set[str] | None = None) -> str:
        """Looks through views to the node whose memory they alias (within `inside`, when given)."""
        while node.kind == "layout" and node.target not in MATERIALIZING:
            parents = self.graph.inputs_of(node)
            if not parents or (inside is not None and parents[0].name not in inside):
                break
            node = parents[0]
        return node.name

    def tensors(self, group: Group) -> tuple[list[TensorInfo], list[TensorInfo], float]:
        """The group's external inputs, its outputs, and the bytes they make (each memory source once)."""
        members = set(group.nodes)
        inputs: dict[str, TensorInfo] = {}
        outputs: dict[str, TensorInfo] = {}
        source_bytes: dict[str, int] = {}

        def add(into: dict[str, TensorInfo], t: TensorInfo, source: str) -> None:
            if t.is_tensor and t.name not in into:
                into[t.name] = t
                source_bytes[source] = max(source_bytes.get(source, 0), t.bytes)

        for name in group.nodes:
            node = self.graph.node(name)
            if node.kind == "param":
                for t in node.outputs:
                    add(inputs, t, name)
            for p in self.graph.inputs_of(node):
                if p.name in members or p.kind == "host":
                    continue
                specs = node.outputs if node.target == "getitem" and len(p.outputs) > 1 else p.outputs
                for t in specs:
                    add(inputs, t, self._source(p))
            if node.info.module is not None:
                for param in node.info.module.params:
                    add(inputs, param, param.name)
            readers = [u for u in self.graph.users_of(node) if u.name not in members and u.kind != "host"]
            aliases_input = node.kind == "layout" and self.graph.node(self._source(node)).kind in (
                "input",
                "param",
            )
            if readers and node.kind not in ("param", "host") and not aliases_input:
                for t in self._read_elements(node, readers):
                    add(outputs, t, "out:" + self._source(node, members))
        return list(inputs.values()), list(outputs.values()), float(sum(source_bytes.values()))

    @staticmethod
    def _read_elements(node: Node, readers: list[Node]) -> list[TensorInfo]:
        """The outputs of `node` its readers use: for a tuple (an LSTM's), only the elements indexed."""
        outs = node.outputs
        if len(outs) <= 1 or not all(u.target == "getitem" and len(u.info.args) == 2 for u in readers):
            return outs
        prefixes = tuple(f"{node.name}[{u.info.args[1]}]" for u in readers)
        return [t for t in outs if t.name.startswith(prefixes)]

    def subtask(self, group: Group) -> plan_pb2.Subtask:
        nodes = [self.graph.node(n) for n in group.nodes]
        inputs, outputs, bytes_ = self.tensors(group)
        flops = sum(n.flops for n in nodes if n.compute)
        matrix = sum(n.flops for n in nodes if n.compute and n.kind in MATRIX_KINDS)
        ceilings = self.ctx.ceilings
        st = plan_pb2.Subtask(
            id=group.id,
            kind=PROTO_KIND.get(group.kind, K.SUBTASK_KIND_OPAQUE),
            anchor=group.anchor,
            ops=[op_node(n) for n in nodes],
            inputs=[tensor_spec(t) for t in inputs],
            outputs=[tensor_spec(t) for t in outputs],
            flops=flops,
            bytes=bytes_,
            floor_ms=ceilings.floor_ms(bytes_, flops - matrix, matrix),
            library_call=group.library_call,
            bound=ceilings.bound(bytes_, flops - matrix, matrix),
            depends_on=[d.id for d in self.fuser.dependencies(group)],
        )
        st.notes = "; ".join([self.describe(group, nodes), *group.notes])
        return st

    def describe(self, group: Group, nodes: list[Node]) -> str:
        compute = [n for n in nodes if n.compute]
        anchor = self.graph.by_name.get(group.anchor)
        if group.kind == "layout":
            return "views/copies only"
        if group.pattern == "attention":
            return "attention chain " + " -> ".join(n.target for n in compute)
        if anchor is None:
            return "elementwise chain: " + " -> ".join(n.target for n in compute) + " in one pass over memory"
        before = [n.target for n in compute if n.index < anchor.index]
        after = [n.target for n in compute if n.index > anchor.index and n.name not in group.folded]
        where = "library call (cuBLAS/cuDNN)" if group.library_call else "custom kernel"
        text = f"{anchor.target} as a {where}"
        if before:
            text += f", prologue {' -> '.join(before)}"
        if after:
            text += f", epilogue {' -> '.join(after)}" + (
                " fused around the call" if group.library_call else ""
            )
        return text

    def shares(self, subtasks: list[plan_pb2.Subtask]) -> bool:
        """Fills time shares from the measured per-op times (True), else from the floors (False)."""
        measured = sum(self.node_ms.values())
        if measured > 0:
            for st, group in zip(subtasks, self.groups, strict=True):
                st.time_share = sum(self.node_ms.get(n, 0.0) for n in group.nodes) / measured
            return True
        total_floor = sum(st.floor_ms for st in subtasks)
        for st in subtasks:
            st.time_share = st.floor_ms / total_floor if total_floor > 0 else 1.0 / len(subtasks)
        return False

    def plan(self) -> plan_pb2.Plan:
        ctx, analysis = self.ctx, self.ctx.analysis
        subtasks = [self.subtask(g) for g in self.groups]
        measured = self.shares(subtasks) if subtasks else False
        for rank, st in enumerate(sorted(subtasks, key=lambda s: -s.time_share), start=1):
            st.priority = rank
        plan = base_plan(ctx)
        plan.capture = analysis.capture
        plan.subtasks.extend(subtasks)
        compute = [n for n in self.graph.nodes if n.compute]
        plan.total_flops = sum(n.flops for n in compute)
        matrix = sum(n.flops for n in compute if n.kind in MATRIX_KINDS)
        plan.floor_ms = ctx.ceilings.floor_ms(plan.total_bytes, plan.total_flops - matrix, matrix)
        total_ms = sum(self.node_ms.values())
        for n in self.graph.nodes:
            if not n.compute and not (n.kind == "layout" and n.target in MATERIALIZING):
                continue
            ms = self.node_ms.get(n.name, 0.0)
            plan.profile.append(
                plan_pb2.OpProfile(
                    node=n.name,
                    op=n.target,
                    flops=n.flops,
                    bytes=n.bytes,
                    time_ms=ms,
                    time_share=ms / total_ms if total_ms > 0 else 0.0,
                    bound=ctx.ceilings.bound(n.bytes, *(_split(n))),
                )
            )
        if not measured:
            plan.warnings.append("not profiled: subtask time shares are estimated from their roofline floors")
        outputs = {t.name for t in analysis.outputs}
        plan.orchestration.CopyFrom(
            orchestrate(
                self.graph, self.groups, self.fuser, subtasks, device=ctx.device, capture=analysis.capture,
                program_outputs=outputs,
            )
        )  # fmt: skip
        plan.orchestration.notes.extend(ctx.notes)
        return plan


def _split(node: Node) -> tuple[float, float]:
    return (0.0, node.flops) if node.kind in MATRIX_KINDS else (node.flops, 0.0)


def base_plan(ctx: Context) -> plan_pb2.Plan:
    """The fields every plan has, deterministic or last resort."""
    analysis = ctx.analysis
    plan = plan_pb2.Plan(
        schema_version=SCHEMA_VERSION,
        problem_name=ctx.problem_name,
        reference_sha256=ctx.reference_sha256,
        device=devices.to_proto(ctx.device),
        inputs=[tensor_spec(t) for t in analysis.inputs],
        outputs=[tensor_spec(t) for t in analysis.outputs],
        parameters=[tensor_spec(t) for t in analysis.parameters],
        eager_ms=ctx.eager_ms,
        compile_ms=ctx.compile_ms,
        planner="deterministic",
        dtype=problem_dtype(analysis),
        profiler=ctx.profiler,
        input_bytes=analysis.input_bytes,
        parameter_bytes=analysis.parameter_bytes,
        torch_version=analysis.torch_version,
    )
    plan.total_bytes = float(
        sum(t.bytes for t in analysis.inputs)
        + analysis.parameter_bytes
        + sum(t.bytes for t in analysis.outputs)
    )
    c = ctx.ceilings
    plan.ceilings.CopyFrom(
        plan_pb2.Ceilings(
            device_name=c.device_name, bandwidth_gbps=c.bandwidth_gbps, vector_tflops=c.vector_tflops,
            matrix_tflops=c.matrix_tflops, source=c.source,
        )
    )  # fmt: skip
    for k in ctx.kernels:
        plan.kernels.append(plan_pb2.OpProfile(op=k.name, time_ms=k.ms))
    total = sum(k.ms for k in ctx.kernels)
    for entry in plan.kernels:
        entry.time_share = entry.time_ms / total if total > 0 else 0.0
    plan.warnings.extend(ctx.warnings)
    return plan


def last_resort(ctx: Context, reason: str, flops: float) -> plan_pb2.Plan:
    """The whole forward as one opaque subtask, flagged, with the reason."""
    analysis = ctx.analysis
    plan = base_plan(ctx)
    plan.last_resort = True
    plan.capture = "none"
    plan.total_flops = flops
    plan.floor_ms = ctx.ceilings.floor_ms(plan.total_bytes, flops)
    aten = list(analysis.eager_aten)
    counts = ", ".join(f"{k} x{v}" for k, v in analysis.eager_aten.items())
    forward = plan_pb2.OpNode(
        name="forward", target="forward", aten_ops=aten, kwargs={"aten_counts": counts} if counts else {}
    )
    forward.outputs.extend(plan.outputs)
    st = plan_pb2.Subtask(
        id="st1",
        kind=K.SUBTASK_KIND_OPAQUE,
        anchor="forward",
        ops=[forward],
        inputs=[*plan.inputs, *plan.parameters],
        outputs=plan.outputs,
        flops=flops,
        bytes=plan.total_bytes,
        time_share=1.0,
        floor_ms=plan.floor_ms,
        priority=1,
        bound=ctx.ceilings.bound(plan.total_bytes, flops),
        notes=f"plan of last resort: {reason}. Port Model.forward as a whole, control flow on the host.",
    )
    plan.subtasks.append(st)
    plan.warnings.append(f"plan of last resort: {reason}")
    plan.orchestration.notes.append(
        "not captured: no fusion analysis, no CUDA graph (control flow may depend on data)"
    )
    plan.orchestration.notes.extend(ctx.notes)
    return plan
