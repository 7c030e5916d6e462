"""Turns a candidate run and its reference into verdict sections and findings, in the trusted parent.

Every decision here is made on raw data the runner sent back (outputs, clock readings, profiler
events, memory peaks); the candidate's process never decides whether it passed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from stitchcuda.api.v1 import plan_pb2, verify_pb2
from stitchcuda.shared.policy import KernelPolicy
from stitchcuda.verifier import compare, speedup
from stitchcuda.verifier.accounting import Accounting, account, global_symbols
from stitchcuda.verifier.ceilings import Floor, physics_floor
from stitchcuda.verifier.reference import ReferenceResult
from stitchcuda.verifier.runner import CandidateRun, memory_budget

SEVERITY = {
    "INFO": verify_pb2.SEVERITY_INFO,
    "WARNING": verify_pb2.SEVERITY_WARNING,
    "REJECT": verify_pb2.SEVERITY_REJECT,
}
# Which reject explains a verdict best, when several fire (lower first).
_PRIORITY = ["D9", "D8", "D1", "D10", "build", "candidate", "D5", "D3", "D6", "D7", "D11", "D4"]


@dataclass
class Policy:
    trials: int
    iterations: int
    warmup: int
    pool: int
    min_custom_share: float
    review_speedup: float
    compile_baseline: bool
    allowed_rules: list[str]
    timeout_s: float
    precision: str
    tol_floor: float
    tol_max_floor: float
    tol_factor: float
    floor_fraction: float
    clock_factor: float
    clock_slack_ms: float
    kernel: KernelPolicy = field(default_factory=KernelPolicy)
    # Libraries the candidate's manifest declares (counted outside D6 under the library policy).
    declared: frozenset[str] = frozenset()
    # The speedup's interval may be at most +-this (relative) before a verdict calls the timing noisy.
    noise: float = 0.05

    @property
    def library_excluded(self) -> bool:
        return self.kernel.accepts_library and bool(self.declared)


# Runtime rules a problem's policy may soften (VerifyPolicy.allowed_rules). Tampering, crashes, wrong
# answers and integrity violations (D1, D3, D5, D8, D9) are never softened.
DOWNGRADABLE = ("D4.", "D6.", "D7.", "D10.")


class FindingList:
    """Collects findings; downgradable rules named in allowed_rules drop from REJECT to WARNING."""

    def __init__(self, allowed: list[str]) -> None:
        self.allowed = [a for a in allowed if a]
        self.items: list[verify_pb2.Finding] = []

    def add(
        self, rule: str, severity: str | int, detail: str, where: str = "", *, as_is: bool = False
    ) -> None:
        level = SEVERITY[severity] if isinstance(severity, str) else int(severity)
        if (
            not as_is
            and level == verify_pb2.SEVERITY_REJECT
            and rule.startswith(DOWNGRADABLE)
            and any(rule == a or rule.startswith(a) for a in self.allowed)
        ):
            level = verify_pb2.SEVERITY_WARNING
            detail = f"{detail} (allowed by policy)"
        for f in self.items:
            if f.rule == rule and f.detail == detail[:600] and f.where == where[:200]:
                return
        finding = verify_pb2.Finding(rule=rule, detail=detail[:600], where=where[:200])
        finding.severity = verify_pb2.Severity.ValueType(level)
        self.items.append(finding)

    def extend(self, findings: list[verify_pb2.Finding]) -> None:
        """Adds findings whose severity their producer already settled (the static scan's policy)."""
        for f in findings:
            self.add(f.rule, int(f.severity), f.detail, f.where, as_is=True)

    def rejects(self) -> list[verify_pb2.Finding]:
        found = [f for f in self.items if f.severity == verify_pb2.SEVERITY_REJECT]

        def rank(f: verify_pb2.Finding) -> int:
            head = f.rule.split(".")[0]
            return _PRIORITY.index(head) if head in _PRIORITY else len(_PRIORITY)

        return sorted(found, key=rank)


@dataclass
class Evaluation:
    correct: bool = False
    accounting: Accounting | None = None
    floor: Floor | None = None
    extras: dict[str, Any] = field(default_factory=dict)


def faults(run: CandidateRun, findings: FindingList, timeout_s: float) -> None:
    """Crashes, hangs, resource kills and broken channels: a reason, never an exception."""
    for f in run.findings:
        findings.add(
            str(f.get("rule", "D9.unknown")),
            str(f.get("severity", "REJECT")),
            str(f.get("detail", "")),
            str(f.get("where", "")),
        )
    if run.fault:
        stage = run.fault.get("stage", "?")
        tb = run.fault.get("traceback") or []
        where = str(tb[-1]) if tb else stage
        findings.add("D1.crash", "REJECT", f"{stage} raised {run.fault.get('error', '')}", where)
        return
    out = run.outcome
    if run.bad_record:
        findings.add("D1.bad-record", "REJECT", run.bad_record)
    elif out.memory_exceeded:
        findings.add("D10.memory", "REJECT", f"the candidate process {out.crash_reason()}")
    elif out.timed_out:
        findings.add(
            "D1.timeout", "REJECT", f"the candidate process {out.crash_reason()} (limit {timeout_s:.0f} s)"
        )
    elif not run.completed:
        rule = "D1.no-completion-record" if out.returncode == 0 else "D1.crash"
        findings.add(rule, "REJECT", f"the candidate process {out.crash_reason()}")


def reference_tolerances(ref: ReferenceResult, policy: Policy) -> tuple[list[compare.Tolerance], list[str]]:
    """The per-output tolerances (from the reference's float32-vs-float64 error over every set) and the
    null-model warnings: the same for every candidate checked against `ref` under `policy`, so computed
    once (ahead of the first candidate where the reference was prepared ahead) and kept in ref.memo."""
    key = ("tolerances", policy.tol_floor, policy.tol_max_floor, policy.tol_factor, policy.precision)
    if key not in ref.memo:
        refs = [(s.ref32, s.ref64) for name, s in ref.sets.items() if name != ref.plan.offshape]
        tolerances = compare.tolerances(
            refs,
            floor=policy.tol_floor,
            max_floor=policy.tol_max_floor,
            factor=policy.tol_factor,
            precision=policy.precision,
        )
        ref.memo[key] = (tolerances, compare.null_model_warnings(refs, tolerances))
    cached: tuple[list[compare.Tolerance], list[str]] = ref.memo[key]
    return cached


def correctness(
    run: CandidateRun, ref: ReferenceResult, policy: Policy, findings: FindingList
) -> tuple[verify_pb2.CorrectnessResult, bool]:
    plan = ref.plan
    tols, null_warnings = reference_tolerances(ref, policy)
    result = verify_pb2.CorrectnessResult(tolerance=tols[0].rel_l2 if tols else policy.tol_floor)
    expected = [n for n in plan.checked if n in ref.sets]
    timed = sorted(n for n in run.outputs if n.startswith("timed["))
    worst = 0.0
    ok = bool(expected) and run.completed
    failures: dict[str, list[tuple[str, str]]] = {}
    for name in expected + timed:
        rec = run.outputs.get(name)
        set_name = plan.checked.get(name) or (rec.set_name if rec else "")
        if rec is None or rec.outputs is None or set_name not in ref.sets:
            if run.completed:
                findings.add("D1.missing-output", "REJECT", f"no output was recorded for {name}", name)
                ok = False
            continue
        data = ref.sets[set_name]
        check = compare.check_set(rec.outputs, data.ref32, data.ref64, tols)
        w = check.worst
        worst = max(worst, w.rel_l2 if math.isfinite(w.rel_l2) else math.inf)
        result.trials.add(
            name=name,
            ok=check.ok,
            rel_l2=w.rel_l2,
            max_abs=w.max_abs,
            tolerance=tols[0].rel_l2 if tols else 0.0,
            detail=w.detail,
        )
        if not check.ok:
            ok = False
            failures.setdefault(w.rule or "D3.mismatch", []).append((name, w.detail))
            if not result.failure:
                result.failure = f"{name}: {w.detail}"
    for rule, items in failures.items():
        names = ", ".join(n for n, _ in items[:6]) + (", ..." if len(items) > 6 else "")
        first_name, first_detail = items[0]
        count = f" (fails {len(items)} of {len(result.trials)} probes: {names})" if len(items) > 1 else ""
        findings.add(rule, "REJECT", f"{first_name}: {first_detail}{count}", first_name)
    trial_outs = [run.outputs[n].outputs for n in expected if n.startswith("trial") and n in run.outputs]
    trial_refs = [ref.sets[n].ref32 for n in expected if n.startswith("trial")]
    if compare.identical_outputs([o for o in trial_outs if o is not None]) and not compare.identical_outputs(
        trial_refs
    ):
        findings.add(
            "D3.constant-output",
            "REJECT",
            "the same output for different inputs, while the reference's changes",
        )
        ok = False
    for warning in null_warnings:
        findings.add("D3.null-model", "WARNING", f"problem: {warning}; correctness rests on the other probes")
    for name, reason in ref.skipped.items():
        findings.add("D2.probe-skipped", "INFO", f"{name}: {reason}", name)
    result.max_rel_l2 = worst
    result.ok = ok
    _shape_probe(run, ref, policy, result, findings)
    return result, ok


def _shape_probe(
    run: CandidateRun,
    ref: ReferenceResult,
    policy: Policy,
    result: verify_pb2.CorrectnessResult,
    findings: FindingList,
) -> None:
    plan = ref.plan
    if not plan.offshape or plan.offshape not in ref.sets:
        return
    dims = ", ".join(f"{k}={v}" for k, v in ref.offshape.get("dims", {}).items())
    rec = run.outputs.get("offshape")
    probe = result.shape_probe
    probe.name = f"offshape ({dims})"
    if rec is None:
        return
    if rec.error or rec.outputs is None:
        probe.ok = False
        probe.detail = rec.error or "no output"
        findings.add(
            "D4.off-shape", "WARNING", f"fails on unseen shapes ({dims}): {probe.detail}", "offshape"
        )
        return
    data = ref.sets[plan.offshape]
    tols = compare.tolerances(
        [(data.ref32, data.ref64)],
        floor=policy.tol_floor,
        max_floor=policy.tol_max_floor,
        factor=policy.tol_factor,
        precision=policy.precision,
    )
    check = compare.check_set(rec.outputs, data.ref32, data.ref64, tols)
    w = check.worst
    probe.ok, probe.rel_l2, probe.max_abs, probe.detail = check.ok, w.rel_l2, w.max_abs, w.detail
    probe.tolerance = tols[0].rel_l2 if tols else 0.0
    if not check.ok:
        # A silent wrong answer on a legal shape is a wrong program (hack #28: hard-coded dims, no bounds
        # checks). A problem that promises fixed shapes lists D4 in allowed_rules, which makes this a
        # warning; a kernel that refuses other shapes with an error is only a warning (above).
        findings.add(
            "D4.off-shape",
            "REJECT",
            f"wrong results off the benchmark shape ({dims}): {w.detail}",
            "offshape",
        )


def _compile_baseline_finding(ref: ReferenceResult, policy: Policy, findings: FindingList) -> None:
    """Every verdict has the torch.compile figure, or a finding that says why it has none."""
    if ref.compile_ms > 0:
        return
    if not policy.compile_baseline:
        findings.add(
            "D7.compile-baseline",
            "INFO",
            "torch.compile was not timed: the policy turned the baseline off",
            "baseline",
        )
        return
    why = str(ref.timing.get("compile_error") or "the reference run gave no torch.compile timing")
    findings.add("D7.compile-baseline", "WARNING", f"no torch.compile baseline: {why}", "baseline")


def _slot_finding(ref: ReferenceResult, findings: FindingList) -> None:
    """The reference lent the node's GPU slot while torch.compile compiled and could not take it back in
    time: its baselines were timed beside another verification's work (each timing still alone)."""
    note = ref.timing.get("slot_note")
    if note:
        waited = float(ref.timing.get("slot_wait_s") or 0.0)
        findings.add("D7.gpu-slot", "INFO", f"{note} (waited {waited:.0f} s)", "baseline")


def timing(
    run: CandidateRun, ref: ReferenceResult, policy: Policy, findings: FindingList
) -> verify_pb2.TimingResult:
    t = verify_pb2.TimingResult()
    dev = [float(x) for x in run.timing.get("device_ms", []) if isinstance(x, int | float)]
    wall = [float(x) for x in run.timing.get("wall_ms", []) if isinstance(x, int | float)]
    eager = ref.timing.get("eager", {}).get("device", {})
    t.eager_ms = float(eager.get("median", 0.0))
    t.eager_spread = _spread(eager)
    t.compile_available = ref.compile_available
    t.compile_ms = ref.compile_ms
    _compile_baseline_finding(ref, policy, findings)
    _slot_finding(ref, findings)
    if not dev:
        return t
    s, sw = _stats(dev), _stats(wall)
    t.median_ms, t.p10_ms, t.p90_ms, t.iterations = s["median"], s["p10"], s["p90"], len(dev)
    t.wall_median_ms = sw["median"]
    t.spread = _spread(s)
    speedup.fill(t, run.timing, ref.eager_ms, ref.compile_ms, policy.noise)
    _baseline_findings(run, ref, t, findings)
    if ref.device == "cuda" and t.wall_median_ms > policy.clock_factor * t.median_ms + policy.clock_slack_ms:
        findings.add(
            "D7.clock-disagree",
            "REJECT",
            f"device clock {t.median_ms:.4f} ms but wall clock {t.wall_median_ms:.4f} ms: work outside the "
            "caller's stream or after forward returned",
            "timed loop",
        )
    calls = [int(c) for c in run.timing.get("custom_calls", []) if isinstance(c, int | float)]
    idle = sum(1 for c in calls if c == 0)
    if calls and idle:
        findings.add(
            "D6.skipped-work",
            "REJECT",
            f"{idle} of {len(calls)} timed calls never called the extension (cached or deferred results)",
            "timed loop",
        )
    if t.speedup_vs_eager > policy.review_speedup:
        findings.add(
            "D7.review",
            "WARNING",
            f"speedup {t.speedup_vs_eager:.1f}x vs eager is above {policy.review_speedup:g}x: review",
        )
    if t.noisy:
        findings.add(
            "D7.noisy",
            "WARNING",
            f"the speedup is known only to "
            f"{speedup.interval_text(t.speedup_vs_eager, t.speedup_vs_eager_low, t.speedup_vs_eager_high)} "
            f"({100 * t.confidence:.0f}% interval over {t.rounds} rounds, "
            f"wider than +-{100 * t.noise_threshold:.0f}%): "
            "the machine is noisy; trust the interval, not the median",
            "timed loop",
        )
    return t


def _baseline_findings(
    run: CandidateRun, ref: ReferenceResult, t: verify_pb2.TimingResult, findings: FindingList
) -> None:
    """Says which eager baseline the speedup rests on when it is not the interleaved one, and when the
    machine ran the reference at a very different speed than in the reference run."""
    if t.eager_source != speedup.INTERLEAVED:
        why = run.baseline_error or (
            "a large problem (inputs made again from seeds, or above interleave_max_mb) or interleaving off"
        )
        findings.add(
            "D7.cached-baseline",
            "INFO",
            f"eager baseline from the reference run, not timed beside the candidate ({why})",
            "baseline",
        )
        return
    if ref.eager_ms > 0 and t.eager_ms > 0:
        drift = t.eager_ms / ref.eager_ms
        if drift > 2.0 or drift < 0.5:
            findings.add(
                "D7.baseline-drift",
                "INFO",
                f"the eager reference ran in {t.eager_ms:.4f} ms beside the candidate and in "
                f"{ref.eager_ms:.4f} ms in the reference run ({drift:.1f}x): the machine's speed changed; "
                "the speedup uses the interleaved figures",
                "baseline",
            )


def _stats(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    n = len(ordered)
    mid = ordered[n // 2] if n % 2 else 0.5 * (ordered[n // 2 - 1] + ordered[n // 2])
    return {"median": mid, "p10": ordered[round(0.1 * (n - 1))], "p90": ordered[round(0.9 * (n - 1))]}


def _spread(s: dict[str, Any]) -> float:
    median = float(s.get("median", 0.0))
    return (float(s.get("p90", 0.0)) - float(s.get("p10", 0.0))) / median if median > 0 else 0.0


def profile(
    run: CandidateRun,
    ref: ReferenceResult,
    candidate_sources: dict[str, str],
    candidate_ms: float,
    plan: plan_pb2.Plan | None,
    policy: Policy,
    findings: FindingList,
) -> tuple[verify_pb2.ProfileResult, Accounting | None]:
    result = verify_pb2.ProfileResult()
    acc: Accounting | None = None
    if run.profile:
        acc = account(
            list(run.profile.get("events", [])), run.token, ref.device, global_symbols(candidate_sources)
        )
        total = acc.total_ms or 1.0
        for k in acc.kernels[:25]:
            result.kernels.add(
                name=k.name[:200],
                origin=k.origin,
                time_ms=k.time_ms,
                share=k.time_ms / total,
                stream=k.stream,
                calls=k.calls,
            )
        result.custom_share = acc.share("custom")
        result.library_share = acc.share("library")
        result.torch_share = acc.share("torch")
        if run.completed:
            _accounting_findings(acc, run, ref, policy, findings)
    elif run.completed:
        findings.add("D6.no-profile", "REJECT", "the profiled call produced no trace")
    floor = _floor(ref, plan, candidate_ms, findings, policy)
    if floor is not None:
        result.floor_ms, result.bound = floor.floor_ms, floor.bound
        flops, nbytes = _work(ref, plan)
        if candidate_ms > 0:
            result.achieved_bandwidth_gbs = nbytes / (candidate_ms * 1e-3) / 1e9
            result.achieved_tflops = flops / (candidate_ms * 1e-3) / 1e12
        for stat in result.kernels:
            stat.bound = floor.bound
    return result, acc


def _accounting_findings(
    acc: Accounting, run: CandidateRun, ref: ReferenceResult, policy: Policy, findings: FindingList
) -> None:
    if acc.note:
        findings.add("D6.no-profile", "REJECT", acc.note)
        return
    if (acc.custom_count == 0 or acc.custom_ms <= 0) and policy.library_excluded and acc.library_ms > 0:
        if acc.torch_ms > 0:
            findings.add(
                "D6.low-custom-share",
                "REJECT",
                f"no custom kernel ran; outside the declared library calls, torch kernels did "
                f"{acc.torch_ms:.3f} ms of work",
                "profile",
            )
        else:
            findings.add(
                "D6.library-only", "WARNING", "only the declared library calls ran (kernel policy library)"
            )
        return
    if acc.custom_count == 0 or acc.custom_ms <= 0:
        what = "no custom kernel ran" if ref.device == "cuda" else "the extension did no work"
        findings.add("D6.no-custom-kernel", "REJECT", f"{what} during the profiled forward call", "profile")
        return
    if not policy.kernel.accepts_library and acc.library_ms > 0:
        # Under the strict policy a vendor GEMM/convolution (cuBLAS, cuDNN, MKL, oneDNN) is the bottleneck
        # done by someone else (VERIFIER_THREATS #6), whatever its share: a small problem's custom epilogue
        # can take as long as the library's GEMM, which a share threshold alone lets through.
        vendor = next(k for k in acc.kernels if k.origin == "library")
        findings.add(
            "D6.library-kernel",
            "REJECT",
            f"a vendor library kernel ran under the strict kernel policy: {vendor.name[:80]} "
            f"({vendor.time_ms:.3f} ms); GEMM and convolution must be the candidate's own kernels "
            "(the library policy accepts declared calls)",
            "profile",
        )
    if policy.library_excluded:
        share = acc.custom_share_outside_library()
        scope = "of the compute time outside the declared library calls"
        others: tuple[str, ...] = ("custom", "copy", "library")
    else:
        share = acc.share("custom")
        scope = "of the compute time (device copies excluded)"
        others = ("custom", "copy")
    if share + 1e-9 < policy.min_custom_share:
        top = next((k for k in acc.kernels if k.origin not in others), None)
        hint = f"; largest other: {top.name[:80]} ({top.origin}, {top.time_ms:.3f} ms)" if top else ""
        findings.add(
            "D6.low-custom-share",
            "REJECT",
            f"custom kernels cover {share:.0%} {scope} "
            f"(policy: at least {policy.min_custom_share:.0%}){hint}",
            "profile",
        )
    if acc.side_stream_custom:
        names = ", ".join(sorted(set(acc.side_stream_custom))[:3])
        if acc.joined:
            findings.add(
                "D6.side-stream-joined",
                "INFO",
                f"custom kernels on a side stream, joined before return: {names}",
            )
        else:
            findings.add(
                "D6.unjoined-stream",
                "REJECT",
                f"custom kernels on a side stream never joined to the caller's: {names}",
            )


def _work(ref: ReferenceResult, plan: plan_pb2.Plan | None) -> tuple[float, float]:
    flops = float(ref.cost.get("flops", 0.0))
    nbytes = float(ref.cost.get("bytes", 0.0))
    if plan is not None:
        if plan.total_flops > 0:
            flops = float(plan.total_flops)
        if plan.total_bytes > 0:
            nbytes = min(nbytes, float(plan.total_bytes)) if nbytes > 0 else float(plan.total_bytes)
    return flops, nbytes


def _floor(
    ref: ReferenceResult,
    plan: plan_pb2.Plan | None,
    candidate_ms: float,
    findings: FindingList,
    policy: Policy,
) -> Floor | None:
    if ref.ceilings is None:
        return None
    flops, nbytes = _work(ref, plan)
    floor = physics_floor(ref.ceilings, flops, nbytes, str(ref.cost.get("dtype", "float32")))
    if candidate_ms > 0 and floor.floor_ms > 0 and candidate_ms < policy.floor_fraction * floor.floor_ms:
        findings.add(
            "D7.below-floor",
            "REJECT",
            f"{candidate_ms:.4f} ms is below {policy.floor_fraction:g}x the physics floor "
            f"{floor.floor_ms:.4f} ms ({nbytes / 1e6:.2f} MB at {ref.ceilings.peak_copy_gbs:.0f} GB/s, "
            f"{flops / 1e9:.2f} GFLOP): work was skipped",
            "timed loop",
        )
    return floor


def memory(run: CandidateRun, ref: ReferenceResult, findings: FindingList) -> None:
    peak = run.memory.get("peak_extra")
    if ref.device != "cuda" or not isinstance(peak, int | float):
        return
    allowed, held = memory_budget(ref)
    if run.timing.get("eager_rounds"):
        # The eager reference ran in the same process: its activations count in the peak.
        allowed += float(ref.cost.get("forward_peak", 0))
    if peak > allowed + held:
        findings.add(
            "D10.memory",
            "REJECT",
            f"peak device memory {peak / 2**30:.2f} GiB beyond the runner's own; "
            f"limit {allowed / 2**30:.2f} GiB "
            "(max of 3x and +1 GiB over the reference's peak)",
        )
