"""The synthesizer's tuning knobs, and how the optimize skill picks the next ones from a verdict.

A variant is a small set of named choices recorded in Candidate.variant. `next_variants` reads the
Verifier's verdict on the previous candidate (build error, mismatch, custom-kernel share, bound,
bandwidth) and proposes the variants most likely to fix or speed it up, skipping those already tried
(their signatures travel in Candidate.variant["tried"]).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from stitchcuda.api.v1 import verify_pb2

CHOICES: dict[str, tuple[str, ...]] = {
    # Threads per block of CUDA elementwise kernels.
    "block": ("256", "128", "512"),
    # Maximum threads per block of CUDA row kernels (softmax, norms, reductions).
    "row_block": ("512", "256", "1024"),
    # Elements per CUDA thread access (float4 loads when 4).
    "vec": ("4", "1"),
    # auto: the synthesizer's fusion; plan: never fuse across the plan's subtasks; none: one op per kernel.
    "fusion": ("auto", "plan", "none"),
    # GEMMs and convolutions: the vendor library (through ATen) with custom epilogue kernels, or the
    # synthesizer's own kernels (tiled GEMM, direct convolution).
    "gemm": ("library", "custom"),
    # The bias of nn.Linear: inside the library call (addmm) or in the epilogue kernel.
    "gemm_bias": ("library", "epilogue"),
    # The bias of a convolution: in the epilogue kernel or inside the library call.
    "conv_bias": ("epilogue", "library"),
    # Products of the own GEMM and convolution kernels on CUDA: SIMT float32 FMAs or 3xTF32 tensor cores
    # through WMMA (compute capability 8.0 and later; float32-class accuracy). SIMT first: on the H200 the
    # WMMA kernels ran at half its rate (benchmarks/results/gpu_stop35: level-2 problem 4 0.39x vs 0.78x
    # eager, a 4096^3 GEMM 0.44x vs 0.62x).
    "mma": ("simt", "tf32x3"),
    # The own GEMMs on CUDA (cutlass_gemm.py; a GEMM's pointwise tail a kernel of its own): cutlass_sm90,
    # CUTLASS 3's Hopper wgmma GEMM over operands split into TF32 pairs (the own kernels on devices other than
    # compute capability 9.0); cutlass, CUTLASS's SM80 3xTF32 tensor-op GEMM (8.0 and later); own, the
    # synthesizer's tiled kernels. Hopper's first: measured on an H100 (benchmarks/results/gpu_stop36) at
    # 1.19-1.75x cuBLAS's float32 SGEMM where SM80's reached 0.54x, as accurate (convolutions: conv_kernel).
    "gemm_kernel": ("cutlass_sm90", "cutlass", "own"),
    # The own direct convolutions on CUDA (groups of one, 1-3 spatial dims): cutlass_sm90, CUTLASS 3's Hopper
    # implicit-GEMM convolution over channels split into TF32 pairs (cutlass_conv.py; the own kernels on
    # other devices and for convolutions it does not take); own, the synthesizer's kernels (convolution.py).
    # Hopper's first: measured on an H100 (benchmarks/results/gpu_stop40) at 1.6-2.1x the own kernels on
    # level-2 problems 1 and 17 and level-1 problem 55, 1.2x on level-1 problem 63 (16 input channels).
    "conv_kernel": ("cutlass_sm90", "own"),
    # The pointwise kernel over an own GEMM's (nn.Linear) or convolution's output on CUDA (activation,
    # scaling, clamp, residual): auto, a convolution's inside the store of Hopper's, the depthwise and the
    # direct kernels (one pass over the output; Hopper's store is a pass of its own anyway) and a pass after
    # the implicit GEMM, a GEMM's a kernel after it; kernel, a kernel after each; fused, inside every store.
    # Not inside the implicit GEMM's store by default: the convolutions measured on the H200 ran slower so
    # (problem 4: 46.2 ms vs 37.7 ms, problem 5: 24.8 ms vs 23.4 ms, 3xTF32 kernels); tuning tries it.
    "epilogue": ("auto", "kernel", "fused"),
    # The CUDA program's calls replayed from a CUDA graph (modelnew.py, `_stitch_replay`): auto, where its
    # launches outnumber what copying its inputs in and its outputs out costs (graph_pays); off, never.
    "graph": ("auto", "off"),
    # Accumulator of sums: auto (double on CPU and for split reductions, float otherwise), float, double.
    "acc": ("auto", "double", "float"),
    # Split long reductions over several blocks/threads when there are few rows.
    "split": ("auto", "off"),
    # Elements per at::parallel_for task on CPU.
    "grain": ("32768", "8192", "131072"),
}


@dataclass(frozen=True)
class Variant:
    block: str = "256"
    row_block: str = "512"
    vec: str = "4"
    fusion: str = "auto"
    gemm: str = "library"
    gemm_bias: str = "library"
    conv_bias: str = "epilogue"
    mma: str = "simt"
    gemm_kernel: str = "cutlass_sm90"
    conv_kernel: str = "cutlass_sm90"
    epilogue: str = "auto"
    graph: str = "auto"
    acc: str = "auto"
    split: str = "auto"
    grain: str = "32768"

    def signature(self) -> str:
        changed = ",".join(f"{k}={v}" for k, v in asdict(self).items() if v != CHOICES[k][0])
        return changed or "default"

    def as_map(self) -> dict[str, str]:
        return dict(asdict(self))

    @staticmethod
    def from_map(values: dict[str, str] | Any) -> Variant:
        known = {f.name for f in fields(Variant)}
        picked = {k: str(v) for k, v in dict(values).items() if k in known and str(v) in CHOICES[k]}
        return Variant(**picked)

    def with_(self, **changes: str) -> Variant:
        return replace(self, **changes)


def tried_signatures(values: dict[str, str] | Any) -> list[str]:
    raw = dict(values).get("tried", "")
    return [s for s in str(raw).split(";") if s]


def _finding_rules(verdict: verify_pb2.Verdict) -> set[str]:
    return {f.rule for f in verdict.findings if f.severity >= verify_pb2.SEVERITY_WARNING}


# Which program features make a knob matter (a knob that changes nothing is never proposed).
RELEVANT: dict[str, frozenset[str]] = {
    "block": frozenset({"pointwise", "pool", "row"}),
    "row_block": frozenset({"row"}),
    "vec": frozenset({"pointwise", "row"}),
    "acc": frozenset({"row", "library"}),
    "split": frozenset({"row"}),
    "gemm": frozenset({"gemm", "conv"}),
    "gemm_bias": frozenset({"gemm"}),
    "conv_bias": frozenset({"conv"}),
    "mma": frozenset({"gemm", "conv"}),
    "gemm_kernel": frozenset({"gemm"}),
    "conv_kernel": frozenset({"conv"}),
    "epilogue": frozenset({"gemm", "conv"}),
    "graph": frozenset({"graph"}),
}


def _relevant(variant: Variant, previous: Variant, features: frozenset[str] | None) -> bool:
    if features is None:
        return True
    changed = [k for k, v in variant.as_map().items() if previous.as_map()[k] != v]
    return all(k not in RELEVANT or RELEVANT[k] & features for k in changed)


def features_of(values: dict[str, str] | Any) -> frozenset[str] | None:
    raw = dict(values).get("features")
    return frozenset(x for x in str(raw).split(",") if x) if raw is not None else None


def _simpler_gemm_kernels(previous: Variant, why: str) -> list[tuple[Variant, str]]:
    """The GEMM and convolution kernels to step back to after a failure of a CUTLASS one (CUDA, own kernels):
    Hopper's convolution to the own; Hopper's GEMM to SM80's, then either to the synthesizer's own."""
    steps: list[tuple[Variant, str]] = []
    if previous.gemm != "custom":
        return steps
    if previous.conv_kernel == "cutlass_sm90":
        steps.append((previous.with_(conv_kernel="own"), f"{why}: the own convolutions, not CUTLASS's"))
    if previous.gemm_kernel == "cutlass_sm90":
        steps.append((previous.with_(gemm_kernel="cutlass"), f"{why}: CUTLASS's SM80 GEMM, not SM90's"))
    if previous.gemm_kernel != "own":
        steps.append((previous.with_(gemm_kernel="own"), f"{why}: the own GEMM kernels, not CUTLASS"))
    return steps


def proposals(previous: Variant, verdict: verify_pb2.Verdict, *, cuda: bool) -> list[tuple[Variant, str]]:
    """Variants to try next, most promising first, each with the reason it was chosen."""
    out: list[tuple[Variant, str]] = []
    rules = _finding_rules(verdict)
    text = " ".join([verdict.reason, verdict.feedback, " ".join(rules)]).lower()
    if verdict.build.error or (not verdict.compiled and verdict.build.ok is False and verdict.reason):
        # A build failure of generated code: step to the most conservative code shapes.
        if cuda:
            out.extend(_simpler_gemm_kernels(previous, "the build failed"))
        out.append((previous.with_(vec="1"), "the build failed: scalar accesses instead of float4"))
        if cuda and previous.gemm == "custom" and previous.epilogue != "kernel":
            out.append(
                (previous.with_(epilogue="kernel"), "the build failed: GEMM/convolution epilogues as kernels")
            )
        out.append((previous.with_(vec="1", fusion="none"), "the build failed: one kernel per op"))
        return out
    failed_run = rules & {"D1.crash", "D10.memory"}
    if cuda and verdict.compiled and failed_run and previous.graph != "off":
        # A run that crashed or outgrew its memory: first without the CUDA graph (its capture, its own pool).
        out.append((previous.with_(graph="off"), f"{min(failed_run)}: every call launched, no CUDA graph"))
    if verdict.compiled and not verdict.correct:
        worst = verdict.correctness.max_rel_l2
        tol = verdict.correctness.tolerance
        if previous.acc != "double" and (tol > 0 and worst < 100 * tol):
            out.append(
                (previous.with_(acc="double"), f"close miss (rel_l2 {worst:.2e} vs {tol:.2e}): double sums")
            )
        if cuda:
            out.extend(_simpler_gemm_kernels(previous, "mismatch"))
        if cuda and previous.gemm == "custom" and previous.mma != "simt":
            out.append((previous.with_(mma="simt"), "mismatch: SIMT float32 GEMM/convolution products"))
        if cuda and previous.gemm == "custom" and previous.epilogue != "kernel":
            out.append(
                (
                    previous.with_(epilogue="kernel"),
                    "mismatch: GEMM/convolution epilogues as kernels of their own",
                )
            )
        if cuda and previous.graph != "off":
            out.append((previous.with_(graph="off"), "mismatch: every call launched, no CUDA graph"))
        if previous.fusion != "none":
            out.append((previous.with_(fusion="none"), "mismatch: isolate the ops in separate kernels"))
        if previous.vec != "1":
            out.append((previous.with_(vec="1"), "mismatch: scalar accesses"))
        return out
    library_flagged = any(r.startswith(("D11.torch-op", "D11.library-call")) for r in rules)
    if library_flagged or ("custom" in text and ("share" in text or "d6" in text)):
        # The library call dominates device time and the policy wants custom kernels doing the work.
        if previous.gemm != "custom":
            why = "library calls rejected" if library_flagged else "custom-kernel share too low"
            out.append((previous.with_(gemm="custom"), f"{why}: own GEMM/convolution kernels"))
        if previous.gemm_bias != "epilogue":
            out.append(
                (previous.with_(gemm_bias="epilogue"), "custom-kernel share too low: bias in epilogue")
            )
        if previous.conv_bias != "epilogue":
            out.append(
                (previous.with_(conv_bias="epilogue"), "custom-kernel share too low: conv bias in epilogue")
            )
    bound = verdict.profile.bound or ""
    if cuda:
        if bound == "memory" or not bound:
            for vec in ("4", "1"):
                if previous.vec != vec:
                    out.append((previous.with_(vec=vec), f"memory-bound: vector width {vec}"))
            for block in CHOICES["block"]:
                if block != previous.block:
                    out.append((previous.with_(block=block), f"memory-bound: {block} threads per block"))
            for rb in CHOICES["row_block"]:
                if rb != previous.row_block:
                    out.append((previous.with_(row_block=rb), f"row kernels with up to {rb} threads"))
        if previous.split != "off":
            out.append((previous.with_(split="off"), "one block per row, no split reduction"))
        if previous.gemm == "custom":
            for other in CHOICES["gemm_kernel"]:
                if other != previous.gemm_kernel:
                    out.append((previous.with_(gemm_kernel=other), f"GEMMs as the {other} kernels, measured"))
            for other in CHOICES["conv_kernel"]:
                if other != previous.conv_kernel:
                    out.append(
                        (previous.with_(conv_kernel=other), f"convolutions as the {other} kernels, measured")
                    )
            other = "tf32x3" if previous.mma == "simt" else "simt"
            out.append((previous.with_(mma=other), f"own GEMM/convolution products on {other}, measured"))
            for other in CHOICES["epilogue"]:
                if other != previous.epilogue:
                    where = {"auto": "where they cost least", "kernel": "as kernels of their own"}
                    out.append(
                        (
                            previous.with_(epilogue=other),
                            f"GEMM/convolution epilogues {where.get(other, 'inside every store')}, measured",
                        )
                    )
        other = "off" if previous.graph == "auto" else "auto"
        out.append((previous.with_(graph=other), f"CUDA graph replay {other}, measured"))
        if previous.gemm_bias != "epilogue":
            out.append((previous.with_(gemm_bias="epilogue"), "bias fused into the epilogue kernel"))
        if previous.conv_bias != "library" and previous.gemm != "custom":
            out.append((previous.with_(conv_bias="library"), "conv bias inside the library call"))
    else:
        for grain in CHOICES["grain"]:
            if grain != previous.grain:
                out.append((previous.with_(grain=grain), f"{grain} elements per parallel task"))
        if previous.gemm_bias != "epilogue":
            out.append((previous.with_(gemm_bias="epilogue"), "bias fused into the epilogue kernel"))
        if previous.acc != "float":
            out.append((previous.with_(acc="float"), "float accumulators (faster sums)"))
    if previous.fusion != "auto":
        out.insert(0, (previous.with_(fusion="auto"), "back to full fusion"))
    return out


def next_variants(
    previous_map: dict[str, str] | Any, verdict: verify_pb2.Verdict, *, cuda: bool, count: int
) -> list[tuple[Variant, str]]:
    """Up to `count` untried variants for the next optimize round."""
    previous = Variant.from_map(previous_map)
    features = features_of(previous_map)
    tried = set(tried_signatures(previous_map)) | {previous.signature()}
    picked: list[tuple[Variant, str]] = []
    for variant, why in proposals(previous, verdict, cuda=cuda):
        if not _relevant(variant, previous, features):
            continue
        sig = variant.signature()
        if sig in tried or any(sig == v.signature() for v, _ in picked):
            continue
        picked.append((variant, why))
        if len(picked) >= count:
            break
    return picked
