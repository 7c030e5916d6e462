"""The built-in synthesizer: reference + plan + variant -> one extension and its ModelNew, no LLM."""

from __future__ import annotations

import hashlib
import json
import re
import threading
from collections import OrderedDict
from dataclasses import dataclass, field

from stitchcuda.api.v1 import code_pb2, jobs_pb2, plan_pb2
from stitchcuda.coder.synth import cpu
from stitchcuda.coder.synth.fusion import Program, schedule
from stitchcuda.coder.synth.ir import FLIP, RANDOM, SCAN, TRI, Graph, Unsupported
from stitchcuda.coder.synth.modelnew import build_source
from stitchcuda.coder.synth.normalize import normalize
from stitchcuda.coder.synth.runtime import HEADER, HEADER_NAME
from stitchcuda.coder.synth.trace import Trace, run_trace, trace_from_json
from stitchcuda.coder.synth.variants import Variant
from stitchcuda.shared.candidate import ENTRY, validate
from stitchcuda.shared.isolation import Isolation
from stitchcuda.shared.policy import KernelPolicy


@dataclass
class Synthesis:
    """A synthesized program before it becomes a Candidate."""

    files: dict[str, str]
    build: code_pb2.BuildManifest
    variant: Variant
    rationale: str
    kernels: list[str] = field(default_factory=list)
    # What the program contains (pointwise, row, pool, gemm, conv, library): which knobs can matter.
    features: list[str] = field(default_factory=list)


class _TraceCache:
    """Traces by reference hash: optimize rounds of one job reuse the generate round's trace."""

    def __init__(self, size: int = 32) -> None:
        self.size = size
        self.items: OrderedDict[str, Trace] = OrderedDict()
        self.lock = threading.Lock()

    def get(self, key: str) -> Trace | None:
        with self.lock:
            hit = self.items.get(key)
            if hit is not None:
                self.items.move_to_end(key)
            return hit

    def put(self, key: str, trace: Trace) -> None:
        with self.lock:
            self.items[key] = trace
            while len(self.items) > self.size:
                self.items.popitem(last=False)


def target_of(plan: plan_pb2.Plan | None, device: str | None = None) -> str:
    if device in ("cpu", "cuda"):
        return device
    if plan is not None and plan.device == jobs_pb2.DEVICE_CUDA:
        return "cuda"
    return "cpu"


class Synthesizer:
    def __init__(
        self, *, trace_timeout_s: float = 300.0, in_process: bool = False, isolation: Isolation | None = None
    ) -> None:
        """in_process=True traces in this interpreter (tests with trusted references only: the reference
        then runs here and reseeds torch's global RNG); the default is a fresh isolated process per trace."""
        self.trace_timeout_s = trace_timeout_s
        self.isolation = isolation or Isolation()
        self.in_process = in_process
        self._traces = _TraceCache()

    def trace(self, reference_source: str) -> Trace:
        key = hashlib.sha256(reference_source.encode()).hexdigest()
        cached = self._traces.get(key)
        if cached is not None:
            return cached
        # ModelNew's constructor is checked against the reference's own parameters and buffers
        # (same seed, same values) in the tracing process.
        init_source = build_source(
            reference_source, None, [], None, ext_name="unused", doc="constructor check"
        )
        if self.in_process:
            from stitchcuda.coder.synth import trace_worker

            traced = trace_from_json(trace_worker.safe_trace(reference_source, init_source))
        else:
            traced = run_trace(
                reference_source,
                init_source=init_source,
                timeout_s=self.trace_timeout_s,
                isolation=self.isolation,
            )
        check = traced.init_check or {}
        if not check.get("ok", False):
            raise Unsupported(
                f"ModelNew's constructor does not reproduce Model's state: {check.get('detail')}"
            )
        self._traces.put(key, traced)
        return traced

    def lower(self, trace: Trace, variant: Variant, plan: plan_pb2.Plan | None) -> tuple[Graph, Program]:
        graph = normalize(trace)
        program = schedule(graph, variant, plan)
        return program.graph, program

    def synthesize(
        self,
        reference_source: str,
        plan: plan_pb2.Plan | None,
        *,
        variant: Variant,
        device: str | None = None,
        policy: KernelPolicy | None = None,
    ) -> Synthesis:
        policy = policy or KernelPolicy()
        variant = within_policy(variant, policy)
        backend = target_of(plan, device)
        trace = self.trace(reference_source)
        graph, program = self.lower(trace, variant, plan)
        # The constructor arguments and input shapes are part of the program (a source that reads its
        # sizes from the environment gives another program under another environment).
        shapes = json.dumps([trace.init_inputs, trace.inputs], sort_keys=True, default=str)
        key = f"{reference_source}\0{backend}\0{variant.signature()}\0{shapes}"
        digest = hashlib.sha256(key.encode()).hexdigest()[:12]
        ext_name = f"stitch_{digest}"
        if backend == "cuda":
            from stitchcuda.coder.synth import cuda

            sources, cflags, cuda_cflags, ldflags = cuda.emit(program, variant, ext_name)
        else:
            sources, cflags, ldflags = cpu.emit(program, variant, ext_name)
            cuda_cflags = []
        summary = [f"{k.name}: {k.kind} over {', '.join(k.origins)}" for k in program.kernels]
        # Scans, flips and triangles are host steps that launch the synthesizer's own kernels (scans.py).
        ordered = [s.op for s in program.steps if s.op is not None and s.op.kind in (SCAN, FLIP, TRI)]
        summary += [f"{op.out}: {op.kind} over {op.origin}" for op in ordered]
        library = [
            s.op.fn
            for s in program.steps
            if s.op is not None and s.op.kind == "lib" and s.op.fn not in OWN_HELPERS
        ]
        try:
            libraries = library_families(library, variant, policy)
        except Unsupported:
            if variant.gemm == "custom":
                raise
            # A library call outside the policy (attention through ATen): our own kernels instead.
            return self.synthesize(
                reference_source, plan, variant=variant.with_(gemm="custom"), device=device, policy=policy
            )
        features = {k.kind for k in program.kernels} | {op.kind for op in ordered}
        for fn in library:
            features.add("conv" if fn.startswith("conv") else "gemm" if fn != "sdpa" else "attention")
            features.add("library")
        doc = (
            f"ModelNew synthesized by StitchCUDA's built-in coder ({backend}): "
            f"{len(program.kernels)} fused kernel(s) in extension {ext_name}."
        )
        replay = (
            backend == "cuda" and variant.graph == "auto" and graph_pays(program) and capture_safe(sources)
        )
        if replay:
            features.add("graph")
        model_new = build_source(
            reference_source,
            graph,
            program.attrs,
            trace.globals,
            ext_name=ext_name,
            doc=doc,
            baked=trace.baked_ints,
            replay=replay,
        )
        files = {ENTRY: model_new, HEADER_NAME: HEADER, **sources}
        build = code_pb2.BuildManifest(
            extension_name=ext_name,
            sources=list(sources),
            cflags=cflags,
            cuda_cflags=cuda_cflags,
            ldflags=ldflags,
            backend=backend,
            libraries=libraries,
        )
        rationale = "; ".join(summary)
        if library:
            rationale += f"; library calls: {', '.join(library)} (epilogues fused into custom kernels)"
        synthesis = Synthesis(files, build, variant, rationale, summary, sorted(features))
        validate(to_candidate(synthesis))
        return synthesis


# What a CUDA graph's replay saves and costs, roughly: a launch's host work (checks, descriptors, allocation,
# the launch itself: a few microseconds each, the GPU idle meanwhile where kernels are short) against copying
# the inputs in and the outputs out (read and write, at about 2 TB/s).
LAUNCH_HOST_S = 4e-6
COPY_BYTES_PER_S = 1e12
# The fewest launches worth a graph, and launches a recurrent layer's host loop counts as (one per time step).
GRAPH_MIN_LAUNCHES = 16
RECURRENT_LAUNCHES = 64


def graph_pays(program: Program) -> bool:
    """Whether replaying the program from a CUDA graph pays: many launches (a network's layers, a recurrent
    layer's time steps) over inputs and outputs small enough that copying them costs under half what the
    launches' host work does. Never for random numbers (each call must draw new ones)."""
    g = program.graph
    if any(g.values[i].kind != "tensor" for i, _ in g.inputs):
        return False  # the replay keys on the inputs' shapes (a number among them would be a new graph)
    launches = 0
    for step in program.steps:
        if step.kernel is not None:
            launches += 1
        elif step.op is not None and step.op.kind == RANDOM:
            return False
        elif step.op is not None and step.op.kind == "lib":
            launches += RECURRENT_LAUNCHES if step.op.fn in ("lstm", "gru") else 2
        elif step.op is not None and step.op.kind in (SCAN, FLIP, TRI):
            launches += 1
    if launches < GRAPH_MIN_LAUNCHES:
        return False
    tensors = [g.values[i] for i, _ in g.inputs] + [g.values[o] for o in g.outputs]
    moved = sum(v.numel * 4 for v in tensors if v.kind == "tensor")
    return bool(moved / COPY_BYTES_PER_S < launches * LAUNCH_HOST_S / 2)


# Host calls that wait for the device or read device data (not allowed while a stream is captured, and a
# graph would replay without them): the host program's, where it calls ATen (the kernels' units launch only;
# Hopper's device probe runs once, before any capture, and checks for one).
_SYNCING = re.compile(
    r"\.item\s*[<(]|\.cpu\s*\(|\.to\s*\(\s*(?:at::)?kCPU|\btolist\b|\bnonzero\b|\bmasked_select\b"
    r"|\bat::unique\w*|_local_scalar_dense|\bcudaMemcpy\s*\(|Synchronize\s*\("
)


def capture_safe(sources: dict[str, str]) -> bool:
    """Whether the host program (forward.cpp) runs nothing a stream capture forbids."""
    return not _SYNCING.search(sources.get("forward.cpp", ""))


def within_policy(variant: Variant, policy: KernelPolicy) -> Variant:
    """The variant the policy allows: under strict, GEMM and convolution are always our own kernels."""
    return variant if policy.accepts_library else variant.with_(gemm="custom")


# Library-call steps that the synthesizer's own helper kernels carry out (libops.py): no library is called,
# so they neither need a policy's library families nor turn a program's GEMMs into custom kernels.
OWN_HELPERS = frozenset({"cat", "index", "roll"})
# Library steps of a program -> the ATen op its code calls (the family follows from the policy's table).
_LIBRARY_OP = {"lstm": "addmm", "gru": "addmm", "sdpa": "scaled_dot_product_attention"}


def library_families(library: list[str], variant: Variant, policy: KernelPolicy) -> list[str]:
    """The libraries a program declares; raises Unsupported for a call the policy does not accept."""
    if variant.gemm == "custom":
        return []
    families = set()
    for fn in library:
        op = _LIBRARY_OP.get(fn, fn)
        family = policy.family_of_aten(op)
        if not family or family not in policy.families():
            raise Unsupported(f"{fn} through ATen is outside the {policy.name} kernel policy")
        families.add(family)
    return sorted(families)


def to_candidate(s: Synthesis) -> code_pb2.Candidate:
    return code_pb2.Candidate(
        schema_version=1,
        files=[code_pb2.SourceFile(path=p, content=c) for p, c in s.files.items()],
        build=s.build,
        entry=ENTRY,
        coder="builtin",
        rationale=s.rationale,
        variant={**s.variant.as_map(), "features": ",".join(s.features)},
    )
