"""VerifierService: builds a candidate, proves it correct on fresh inputs, times it honestly, rejects hacks.

Transport-free: Celery tasks, the embedded runner, the CLI and tests all call this class. verify()
never raises for a candidate's faults (build errors, crashes, hangs, hacks): they come back as a
Verdict with accepted=False and a one-line reason. It raises ProblemError only when the reference
itself is broken, and Unavailable when the device cannot be used.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path

from stitchcuda.api.v1 import code_pb2, plan_pb2, verify_pb2
from stitchcuda.shared import candidate as candidate_format
from stitchcuda.shared import devices
from stitchcuda.shared import policy as kernel_policy
from stitchcuda.shared.artifacts import ArtifactStore, LocalArtifactStore, sha256_hex
from stitchcuda.shared.errors import HarnessError, InvalidRequest, ProblemError, Unavailable
from stitchcuda.verifier import evaluate, feedback, limits, ncu, speedup
from stitchcuda.verifier.accounting import Accounting
from stitchcuda.verifier.build import Builder
from stitchcuda.verifier.evaluate import FindingList, Policy
from stitchcuda.verifier.probes import build_plan
from stitchcuda.verifier.reference import ReferenceResult, ReferenceRunner, ReferenceStore
from stitchcuda.verifier.runner import CandidateRun, CandidateRunner, transfer_bytes
from stitchcuda.verifier.sandbox import Sandbox
from stitchcuda.verifier.settings import VerifierSettings

StaticScan = Callable[..., list[verify_pb2.Finding]]
static_scan: StaticScan | None
try:  # the AST checks (D11) live in their own module, written separately
    from stitchcuda.verifier.static import scan as static_scan
except ImportError:  # pragma: no cover - only while static.py does not exist yet
    static_scan = None

log = logging.getLogger("stitchcuda.verifier")

SCHEMA_VERSION = 1
Progress = Callable[[str, float], None]


class VerifierService:
    """One per worker process; thread-safe; holds the sandbox, the build cache and recent references."""

    def __init__(
        self, settings: VerifierSettings | None = None, *, artifacts: ArtifactStore | None = None
    ) -> None:
        self.settings = settings or VerifierSettings()
        self.sandbox = Sandbox(self.settings)
        # Without a platform store, builds are shared through the local artifact folder (STITCH_ARTIFACT_DIR).
        store = artifacts or LocalArtifactStore(self.settings.resolved_artifact_dir())
        self.builder = Builder(self.settings, store, self.sandbox)
        self.references = ReferenceRunner(self.settings, self.sandbox)
        self.candidates = CandidateRunner(self.settings, self.sandbox)
        # Per key: (the node store's entry id, or '' without a store; the result).
        self._refs: dict[tuple[object, ...], tuple[str, ReferenceResult]] = {}
        store_bytes = int(self.settings.reference_store_gb * (1 << 30))
        self.reference_store = (
            ReferenceStore(
                self.settings.state_root() / "references",
                reuse=self.settings.reference_reuse,
                ttl_s=self.settings.reference_ttl_s,
                max_bytes=store_bytes,
            )
            if store_bytes > 0
            else None
        )
        self._ref_locks: dict[tuple[object, ...], threading.Lock] = {}
        # A reference run ahead of verification that failed, raised again by the key's next verification.
        self._failed: dict[tuple[object, ...], tuple[float, BaseException]] = {}
        self._lock = threading.Lock()

    # --- public API ------------------------------------------------------------------------------

    def build(self, candidate: code_pb2.Candidate, *, device: str) -> verify_pb2.BuildResult:
        """Compiles (or fetches from the cache) the candidate's extension; never raises for bad code."""
        try:
            candidate_format.validate(candidate)
        except InvalidRequest as exc:
            return verify_pb2.BuildResult(ok=False, error=f"invalid candidate: {exc}")
        result, _ = self.builder.build(candidate)
        log.info(
            "build %s: %s%s in %.1f s",
            result.cache_key[:12],
            "ok" if result.ok else "failed",
            " (cached)" if result.cached else "",
            result.seconds,
        )
        return result

    def verify(
        self,
        reference_source: str,
        candidate: code_pb2.Candidate,
        *,
        device: str = "cpu",
        policy: verify_pb2.VerifyPolicy | None = None,
        plan: plan_pb2.Plan | None = None,
        progress: Progress | None = None,
    ) -> verify_pb2.Verdict:
        started = time.monotonic()
        report = progress or (lambda stage, fraction: None)
        device = devices.resolve(device)
        pol = self._job_policy(policy, device, plan)
        verdict = verify_pb2.Verdict(
            schema_version=SCHEMA_VERSION,
            candidate_id=candidate.candidate_id,
            device=devices.to_proto(device),
        )
        pol.declared = frozenset(candidate.build.libraries)
        verdict.kernel_policy = pol.kernel.name
        findings = FindingList(pol.allowed_rules)
        if self.sandbox.warning:
            findings.add("D9.sandbox-unavailable", "WARNING", self.sandbox.warning)
        self._environment(verdict, None)
        try:
            self._verify(reference_source, candidate, device, pol, plan, verdict, findings, report)
        except BaseException as exc:  # the harness's failure or an interrupt: there is no verdict to log
            # The type too: a MemoryError or an interrupt has no message of its own.
            why = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            log.info("verification of %s ended without a verdict: %s", candidate.candidate_id or "-", why)
            self._finish(verdict, findings, started, quiet=True)
            raise
        self._finish(verdict, findings, started)
        report("done", 1.0)
        return verdict

    def _job_policy(
        self, policy: verify_pb2.VerifyPolicy | None, device: str, plan: plan_pb2.Plan | None
    ) -> Policy:
        """The request's policy with this device's timing noise and the plan's precision."""
        pol = self.policy(policy)
        pol.noise = self.settings.timing_noise_cuda if device == "cuda" else self.settings.timing_noise_cpu
        if (
            plan is not None
            and plan.dtype
            and not pol.precision
            and plan.dtype not in ("float32", "torch.float32")
        ):
            pol.precision = plan.dtype
        return pol

    def policy(self, policy: verify_pb2.VerifyPolicy | None) -> Policy:
        """The effective policy: non-zero fields of the request over the settings' defaults."""
        s = self.settings
        p = policy or verify_pb2.VerifyPolicy()
        iterations = max(20, p.timing_iterations or s.timing_iterations)
        return Policy(
            trials=max(2, p.correctness_trials or s.trials),
            iterations=iterations,
            warmup=max(1, p.warmup_iterations or s.warmup_iterations),
            pool=s.timing_pool,
            min_custom_share=p.min_custom_share or s.min_custom_share,
            review_speedup=p.review_speedup or s.review_speedup,
            # The worker's setting is the floor: a request can add the torch.compile baseline, not drop it.
            compile_baseline=bool(p.compile_baseline) or s.compile_baseline,
            allowed_rules=list(p.allowed_rules),
            timeout_s=p.timeout_s or s.run_timeout_s,
            precision=p.allowed_precision,
            tol_floor=s.tol_floor,
            tol_max_floor=s.tol_max_floor,
            tol_factor=s.tol_factor,
            floor_fraction=s.floor_fraction,
            clock_factor=s.clock_factor,
            clock_slack_ms=s.clock_slack_ms,
            kernel=kernel_policy.resolve(p.kernel_policy or s.kernel_policy),
        )

    # --- the protocol ----------------------------------------------------------------------------

    def _verify(
        self,
        reference_source: str,
        candidate: code_pb2.Candidate,
        device: str,
        pol: Policy,
        plan: plan_pb2.Plan | None,
        verdict: verify_pb2.Verdict,
        findings: FindingList,
        report: Progress,
    ) -> None:
        if candidate.failure:
            findings.add("candidate.failed", "REJECT", f"the coder produced no program: {candidate.failure}")
            return
        try:
            candidate_format.validate(candidate)
        except InvalidRequest as exc:
            findings.add("candidate.invalid", "REJECT", str(exc))
            return
        if candidate.build.backend == "cuda" and device == "cpu":
            findings.add("candidate.backend", "REJECT", "a CUDA candidate cannot run on the cpu device")
            return
        t_static = time.monotonic()
        self._static(candidate, reference_source, pol, findings)
        verdict.stage_seconds["static"] = time.monotonic() - t_static

        report("build", 0.05)
        build, ext_dir = self.builder.build(candidate)
        verdict.stage_seconds["build"] = build.seconds
        verdict.build.CopyFrom(build)
        verdict.compiled = build.ok
        if not build.ok or ext_dir is None:
            findings.add("build.failed", "REJECT", build.error or "the extension did not build")
            return

        report("reference", 0.25)
        t_ref = time.monotonic()
        ref = self._reference(reference_source, device, pol, limits.problem_size(plan))
        # The reference's run (or the wait for another process's run); ~0 when its results are reused.
        verdict.stage_seconds["reference"] = time.monotonic() - t_ref
        self._environment(verdict, ref)

        pol.timeout_s = limits.run_timeout(pol.timeout_s, ref.seconds, transfer_bytes(ref))

        def run_and_evaluate() -> None:
            """One sandboxed run of the candidate and its evaluation into `verdict` and `findings`."""
            report("candidate", 0.5)
            t0 = time.monotonic()
            run = self.candidates.run(candidate, ext_dir, ref, timeout_s=pol.timeout_s)
            done = run.outcome.first("done")
            log.info(
                "candidate %s ran in %.1f s (process %.1f s; phases %s; %.0f MiB of outputs in shared "
                "memory)",
                candidate.candidate_id,
                time.monotonic() - t0,
                run.outcome.seconds,
                done[0].get("phases") if done else "-",
                run.outcome.shared_bytes / (1 << 20),
            )
            if run.fault.get("stage") == "device":
                raise Unavailable(f"the candidate process cannot use {device}: {run.fault.get('error')}")
            if run.fault.get("stage") == "harness-memory":
                raise HarnessError(
                    f"the Verifier's runner ran out of {device} memory for this problem's input sets "
                    f"({run.fault.get('error')}): the machine is too small for its schedule",
                    error_code="harness_out_of_memory",
                )
            stage_durations(done[0].get("phases") if done else None, run.outcome.seconds, verdict)
            verdict.stage_seconds["run"] = time.monotonic() - t0

            report("compare", 0.9)
            t_eval = time.monotonic()
            try:
                self._evaluate(run, ref, candidate, ext_dir, pol, plan, verdict, findings)
            except Exception as exc:  # malformed data from a hostile run must not crash the worker
                log.exception("evaluation of candidate %s failed", candidate.candidate_id)
                findings.add(
                    "verifier.internal-error",
                    "REJECT",
                    f"could not evaluate the run: {type(exc).__name__}: {exc}",
                )
            verdict.stage_seconds["evaluate"] = time.monotonic() - t_eval

        kept = list(findings.items)  # the static scan's and the build's
        for attempt in (1, 2):
            run_and_evaluate()
            disagreed = retime_reason(findings)
            if attempt == 2 or not disagreed:
                break
            # The wall clock of a GPU call grows when the host is busy (other builds and compiles), as it
            # does when work runs outside the caller's stream: a second run tells them apart, since a
            # hack disagrees every time. Its findings replace the first run's.
            log.info(
                "candidate %s: clocks disagreed (%s); timing it again", candidate.candidate_id, disagreed
            )
            findings.items = [*kept]
            findings.add(
                "D7.retimed",
                "INFO",
                f"the first run's clocks disagreed ({disagreed}); the verdict is the second run's",
            )
        # The next candidate's runner starts now, after the evaluation (whose parallel loops it slowed
        # 5x when it started beside them), while the Coder writes the next round.
        self.candidates.prewarm(device)

    def _evaluate(
        self,
        run: CandidateRun,
        ref: ReferenceResult,
        candidate: code_pb2.Candidate,
        ext_dir: Path,
        pol: Policy,
        plan: plan_pb2.Plan | None,
        verdict: verify_pb2.Verdict,
        findings: FindingList,
    ) -> None:
        evaluate.faults(run, findings, pol.timeout_s)
        t0 = time.monotonic()
        correctness, correct = evaluate.correctness(run, ref, pol, findings)
        verdict.correctness.CopyFrom(correctness)
        verdict.correct = correct
        verdict.timing.CopyFrom(evaluate.timing(run, ref, pol, findings))
        t1 = time.monotonic()
        sources = {f.path: f.content for f in candidate.files if not f.path.endswith(".py")}
        profile, acc = evaluate.profile(run, ref, sources, verdict.timing.median_ms, plan, pol, findings)
        verdict.profile.CopyFrom(profile)
        # Where the evaluation's own time goes: outputs against the ground truth, then kernel accounting.
        verdict.stage_seconds["compare"] = t1 - t0
        verdict.stage_seconds["accounting"] = time.monotonic() - t1
        if acc is not None and ref.device == "cuda" and verdict.correct and not findings.rejects():
            try:
                self._ncu(candidate, ext_dir, ref, acc, verdict, findings)
            except Exception as exc:  # counters are feedback only: never a reason to reject
                log.warning("ncu counters failed: %s", exc)
                findings.add("profile.ncu-unavailable", "INFO", f"ncu failed: {type(exc).__name__}: {exc}")
        evaluate.memory(run, ref, findings)
        verdict.speedup_vs_eager = verdict.timing.speedup_vs_eager
        verdict.speedup_vs_compile = verdict.timing.speedup_vs_compile
        verdict.custom_kernel_share = verdict.profile.custom_share

    def _ncu(
        self,
        candidate: code_pb2.Candidate,
        ext_dir: Path,
        ref: ReferenceResult,
        acc: Accounting,
        verdict: verify_pb2.Verdict,
        findings: FindingList,
    ) -> None:
        """Nsight Compute counters for the top custom kernels, where ncu exists and works (feedback only)."""
        exe = ncu.executable()
        if self.settings.ncu == "off" or exe is None:
            return
        top = [k.name for k in acc.kernels if k.origin == "custom"][:3]
        if not top:
            return
        run = self.candidates.run(
            candidate,
            ext_dir,
            ref,
            timeout_s=self.settings.ncu_timeout_s,
            quick=True,
            prefix=ncu.command(exe, top),
        )
        counters = ncu.parse(run.outcome.log_tail)
        if not counters:
            last = run.outcome.log_tail.strip().splitlines()[-1:] or ["no output"]
            findings.add("profile.ncu-unavailable", "INFO", f"ncu gave no counters: {last[0][:200]}")
            return
        for stat in verdict.profile.kernels:
            for name, values in counters.items():
                if ncu.base_name(stat.name) == name:
                    stat.counters.update(values)
                    dram, sm = values.get("dram_pct", 0.0), values.get("sm_pct", 0.0)
                    if dram or sm:
                        stat.bound = "memory" if dram >= sm else "compute"

    def _static(
        self, candidate: code_pb2.Candidate, reference_source: str, pol: Policy, findings: FindingList
    ) -> None:
        if static_scan is None:
            return
        try:
            findings.extend(list(static_scan(candidate, reference_source, findings.allowed, pol.kernel)))
        except Exception as exc:  # a bug in the scanner must not sink an honest candidate
            log.exception("static scan failed")
            findings.add("D11.scan-error", "WARNING", f"static scan failed: {type(exc).__name__}: {exc}")

    def prepare_reference(
        self,
        reference_source: str,
        *,
        device: str = "cpu",
        policy: verify_pb2.VerifyPolicy | None = None,
        plan: plan_pb2.Plan | None = None,
    ) -> bool:
        """Computes the problem's reference results ahead of its first verification (the job's Coder is
        writing, its build compiling) and keeps them for the verifications of the same reference, device
        and schedule, without spending one of their uses. False when usable results are already there.
        A reference that fails raises here, and its first verification raises the same error at once."""
        device = devices.resolve(device)
        pol = self._job_policy(policy, device, plan)
        key = self._reference_key(reference_source, device, pol)
        with self._key_lock(key), self._stored(key):
            if self._usable(key):
                return False
            try:
                ref = self._run_reference(
                    key, reference_source, device, pol, limits.problem_size(plan), uses=0
                )
            except (HarnessError, ProblemError) as exc:
                # Kept without its traceback (whose frames may hold a problem's tensors), until the key's
                # next verification or the reference's time to live.
                with self._lock:
                    now = time.monotonic()
                    self._failed = {
                        k: v for k, v in self._failed.items() if now - v[0] < self.settings.reference_ttl_s
                    }
                    self._failed[key] = (now, exc.with_traceback(None))
                raise
            # What every candidate is compared with, derived now rather than after the first one ran.
            evaluate.reference_tolerances(ref, pol)
            self._keep(key, ref)
        # The first candidate's runner starts now (interpreter, torch, device), not after the build.
        self.candidates.prewarm(device)
        return True

    @staticmethod
    def _reference_key(source: str, device: str, pol: Policy) -> tuple[object, ...]:
        return (
            sha256_hex(source),
            device,
            pol.trials,
            pol.pool,
            pol.warmup,
            pol.iterations,
            pol.compile_baseline,
        )

    def _key_lock(self, key: tuple[object, ...]) -> threading.Lock:
        with self._lock:
            return self._ref_locks.setdefault(key, threading.Lock())

    def _usable(self, key: tuple[object, ...]) -> bool:
        """Whether a verification of `key` would reuse results without running the reference (looks only:
        spends no use). Call under the key's locks."""
        held = self._refs.get(key)
        if self.reference_store is not None:
            entry = self.reference_store.peek(key)
            return entry is not None and (entry[1] or (held is not None and held[0] == entry[0]))
        return held is not None and self._has_uses_left(held[1])

    def _has_uses_left(self, ref: ReferenceResult) -> bool:
        """A result held in this process (no node store) serves `reference_reuse` uses within its TTL."""
        return ref.uses < self.settings.reference_reuse and (
            time.monotonic() - ref.created < self.settings.reference_ttl_s
        )

    def _reference(
        self, source: str, device: str, pol: Policy, size: limits.ProblemSize | None = None
    ) -> ReferenceResult:
        """Ground truth and baselines, reused for a few verifications of the same problem."""
        key = self._reference_key(source, device, pol)
        with self._lock:
            failed = self._failed.pop(key, None)
        if failed is not None and time.monotonic() - failed[0] < self.settings.reference_ttl_s:
            raise failed[1]  # the run ahead of this verification failed: no second try of the same
        with self._key_lock(key), self._stored(key):
            held = self._refs.get(key)
            holding = held[0] if held is not None else ""
            taken = self.reference_store.take(key, holding) if self.reference_store else None
            if taken is not None:  # the node's store counted this use
                entry, loaded = taken
                ref = held[1] if held is not None and held[0] == entry else loaded
                if ref is not None:
                    ref.uses += 1
                    self._refs[key] = (entry, ref)
                    return ref
            elif held is not None and not self.reference_store:
                ref = held[1]
                if self._has_uses_left(ref):
                    ref.uses += 1
                    return ref
            ref = self._run_reference(key, source, device, pol, size)
            self._keep(key, ref)
            return ref

    def _keep(self, key: tuple[object, ...], ref: ReferenceResult) -> None:
        """Holds `ref` for later verifications of `key` (and puts it in the node's store). Call under the
        key's locks."""
        entry = self.reference_store.put(key, ref) if self.reference_store else ""
        with self._lock:
            now = time.monotonic()
            self._refs = {
                k: v for k, v in self._refs.items() if now - v[1].created < self.settings.reference_ttl_s
            }
            self._refs[key] = (entry, ref)

    def _stored(self, key: tuple[object, ...]) -> contextlib.AbstractContextManager[None]:
        return self.reference_store.locked(key) if self.reference_store else contextlib.nullcontext()

    def _run_reference(
        self,
        key: tuple[object, ...],
        source: str,
        device: str,
        pol: Policy,
        size: limits.ProblemSize | None,
        *,
        uses: int = 1,
    ) -> ReferenceResult:
        size = size or limits.ProblemSize()
        full = build_plan(pol.trials, pol.pool, pol.warmup, pol.iterations)
        compact = limits.needs_compact(self.settings, device, size, len(full.sets))
        plan = build_plan(pol.trials, pol.pool, pol.warmup, pol.iterations, compact=True) if compact else full
        if compact:
            log.info(
                "problem of %.2f GiB per input set: the compact schedule (%d input sets, not %d)",
                size.per_set / limits.GIB,
                len(plan.sets),
                len(full.sets),
            )
        self.candidates.settle()  # no standby may still be starting while the baseline is timed
        ref = self.references.run(source, device, plan, compile_baseline=pol.compile_baseline, size=size)
        ref.uses = uses
        log.info(
            "reference %s on %s: eager %.4f ms (%.1f s; phases %s)",
            str(key[0])[:12],
            device,
            ref.eager_ms,
            ref.seconds,
            ref.timing.get("phases", "-"),
        )
        return ref

    def _environment(self, verdict: verify_pb2.Verdict, ref: ReferenceResult | None) -> None:
        env = verdict.environment
        env.hostname = socket.gethostname()
        env.sandbox = self.sandbox.mode
        if ref is None:
            import platform

            import torch

            env.torch_version = torch.__version__
            env.cuda_version = torch.version.cuda or ""
            env.python_version = platform.python_version()
            return
        info = ref.info
        env.device_name = str(info.get("device_name", ""))
        env.driver = str(info.get("driver", ""))
        env.torch_version = str(info.get("torch_version", ""))
        env.cuda_version = str(info.get("cuda_version", ""))
        env.python_version = str(info.get("python_version", ""))
        env.sandbox = ref.sandbox
        del env.seeds[:]
        env.seeds.extend(ref.plan.seeds)

    def _finish(
        self, verdict: verify_pb2.Verdict, findings: FindingList, started: float, *, quiet: bool = False
    ) -> None:
        del verdict.findings[:]
        verdict.findings.extend(findings.items)
        rejects = findings.rejects()
        verdict.accepted = verdict.compiled and verdict.correct and not rejects
        if rejects:
            first = rejects[0]
            verdict.reason = f"{first.rule}: {first.detail}"[:300]
        elif not verdict.compiled:
            verdict.reason = "the extension did not build"
        elif not verdict.correct:
            verdict.reason = "incorrect output"
        else:
            t = verdict.timing
            vs_eager = speedup.interval_text(
                verdict.speedup_vs_eager, t.speedup_vs_eager_low, t.speedup_vs_eager_high
            )
            verdict.reason = f"accepted: {vs_eager} vs eager"
            if verdict.speedup_vs_compile:
                vs_compile = speedup.interval_text(
                    verdict.speedup_vs_compile, t.speedup_vs_compile_low, t.speedup_vs_compile_high
                )
                verdict.reason += f", {vs_compile} vs torch.compile"
        verdict.seconds = time.monotonic() - started
        del verdict.docs[:]
        verdict.docs.extend(feedback.hints(verdict))
        verdict.feedback = feedback.render(verdict)
        if not quiet:
            stages = " ".join(f"{k} {v:.1f}" for k, v in verdict.stage_seconds.items())
            log.info(
                "verdict %s: %s (%.1f s: %s)",
                verdict.candidate_id or "-",
                verdict.reason,
                verdict.seconds,
                stages,
            )

    def close(self) -> None:
        """Stops the standby runner processes (they also exit with this process, or when idle)."""
        self.candidates.close()

    # --- convenience for tests, benchmarks and the CLI -------------------------------------------

    def verify_dir(
        self,
        reference: Path,
        candidate_dir: Path,
        *,
        device: str = "cpu",
        policy: verify_pb2.VerifyPolicy | None = None,
    ) -> verify_pb2.Verdict:
        """Verifies a candidate folder (model_new.py + sources + manifest.json) against a reference file."""
        cand = candidate_format.read_dir(candidate_dir)
        cand.candidate_id = cand.candidate_id or candidate_dir.name
        return self.verify(reference.read_text(), cand, device=device, policy=policy)


def retime_reason(findings: FindingList) -> str:
    """The detail of a run rejected only because its device and wall clocks disagreed ("" otherwise)."""
    rejects = findings.rejects()
    if rejects and all(f.rule == "D7.clock-disagree" for f in rejects):
        return rejects[0].detail.split(":")[0]
    return ""


# The candidate runner's phase marks (seconds since its start) that end each stage, after the mark that
# begins it: correctness from the import of the candidate to its last checked call, and so on.
# "turn" (a GPU run's wait for the device alone, between its correctness and its timing) is marked only
# where the GPU is shared; without it the timing begins where the correctness ends.
_RUN_STAGES = (
    ("correctness", ("import",)),
    ("turn", ("correctness",)),
    ("timing", ("turn", "correctness")),
    ("profile", ("timing",)),
)


def stage_durations(phases: object, wall_s: float, verdict: verify_pb2.Verdict) -> None:
    """The run's correctness, timing and profile seconds into verdict.stage_seconds (metrics only: the
    marks come from the candidate's process, so each is clamped to the process's own wall time)."""
    if not isinstance(phases, dict):
        return
    for stage, begins in _RUN_STAGES:
        end = phases.get(stage)
        start = next((phases[b] for b in begins if b in phases), None)
        if isinstance(end, int | float) and isinstance(start, int | float) and end >= start:
            verdict.stage_seconds[stage] = min(float(end - start), max(wall_s, 0.0))
