"""D11: the static scan of a candidate (model_new.py's AST, its C++/CUDA sources) as policy-rated Findings.

The Python side resolves imports and aliases, builds the call graph from ModelNew.forward, and runs a taint
analysis over it (static_flow); whole-file checks run over every node (static_module); the C++/CUDA side is
lexical over comment-stripped text (static_cpp). Severities come from policy.RULES; a downgradable rule named
in allowed_rules drops from REJECT to WARNING.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable

from stitchcuda.api.v1 import code_pb2, verify_pb2
from stitchcuda.shared.candidate import ENTRY, SOURCE_SUFFIXES
from stitchcuda.shared.policy import KernelPolicy
from stitchcuda.verifier.static_cpp import scan_sources
from stitchcuda.verifier.static_flow import Flow
from stitchcuda.verifier.static_graph import Program
from stitchcuda.verifier.static_module import ModuleScan, reference_info
from stitchcuda.verifier.static_names import Names
from stitchcuda.verifier.static_report import Hit, Hits
from stitchcuda.verifier.static_triton import scan_triton

__all__ = ["scan", "scan_hits"]


def scan(
    candidate: code_pb2.Candidate,
    reference_source: str,
    allowed_rules: Iterable[str] = (),
    kernel_policy: KernelPolicy | None = None,
) -> list[verify_pb2.Finding]:
    """Every D11 finding for the candidate under the job's kernel policy, REJECTs first."""
    hits = scan_hits(candidate, reference_source)
    return apply_kernel_policy(hits, candidate, kernel_policy or KernelPolicy()).findings(allowed_rules)


# The op or function a library hit names: "ATen compute in C++: at::conv2d(x, ..." -> "conv2d".
_ATEN_NAME = re.compile(r"ATen compute in C\+\+: (?:at|torch)::(?:\w+::)*(\w+)\s*\(")
_CALL_NAME = re.compile(r"vendor library compute: (\w+)\s*\(")


def apply_kernel_policy(hits: Hits, candidate: code_pb2.Candidate, policy: KernelPolicy) -> Hits:
    """GEMM/convolution library calls the policy accepts become D11.library-declared (INFO); the rest
    keep their REJECT, with the policy named in the detail so the Coder knows what to change."""
    declared = set(candidate.build.libraries)
    out = Hits()
    for hit in hits:
        out.extend([_under_policy(hit, policy, declared)])
    return out


def _under_policy(hit: Hit, policy: KernelPolicy, declared: set[str]) -> Hit:
    if hit.rule == "D11.torch-op":
        m = _ATEN_NAME.match(hit.detail)
        name, family = (m.group(1), policy.family_of_aten(m.group(1))) if m else ("", "")
    elif hit.rule == "D11.library-call":
        m = _CALL_NAME.match(hit.detail)
        name, family = (m.group(1), policy.family_of_call(m.group(1))) if m else ("", "")
    else:
        return hit
    if not family:
        return hit
    allowed = policy.allows_aten(name, declared) or policy.allows_call(name, declared)
    if allowed:
        return Hit("D11.library-declared", f"{family}: {name} (kernel policy library)", hit.where)
    if policy.accepts_library:
        why = f"; the library policy accepts it once the manifest declares libraries: [{family!r}]"
    else:
        why = "; the strict kernel policy wants GEMM/convolution as the candidate's own kernels"
    return Hit(hit.rule, hit.detail + why, hit.where)


def scan_hits(candidate: code_pb2.Candidate, reference_source: str) -> Hits:
    hits = Hits()
    files = {f.path: f.content for f in candidate.files}
    entry = candidate.entry or ENTRY
    ref = reference_info(reference_source)
    source = files.get(entry)
    streams_made: list[str] = []
    streams_joined: list[str] = []
    if source is None:
        hits.add("D11.structure", f"the candidate has no {entry}", entry)
    else:
        try:
            tree = ast.parse(source)
        except SyntaxError as exc:
            hits.add("D11.structure", f"{entry} does not parse: {exc.msg}", f"{entry}:{exc.lineno or 0}")
            tree = None
        if tree is not None:
            extra = tuple(b.extension_name for b in candidate.extra_builds)
            names = Names(tree, candidate.build.extension_name, extra)
            program = Program(tree, names)
            flow = Flow(program, names, hits, path=entry)
            flow.run()
            forward_ids = {id(f.node) for f, _ in flow.reached}
            module = ModuleScan(program, names, hits, forward_ids, ref, entry)
            streams = module.run(source)
            scan_triton(program, names, ref, hits, entry)
            streams_made += streams.made
            streams_joined += streams.joined
    sources = {p: c for p, c in files.items() if p.endswith(SOURCE_SUFFIXES)}
    if sources:
        cpp = scan_sources(sources, hits, fp32=ref.fp32)
        streams_made += cpp.streams_made
        streams_joined += cpp.streams_joined
    for where in streams_made:
        if streams_joined:
            hits.add("D11.stream", f"side stream, joined at {streams_joined[0]}", where)
        else:
            hits.add(
                "D11.stream-unjoined", "side stream with no wait_stream / event wait / synchronize", where
            )
    return hits
