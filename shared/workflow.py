"""Drives jobs through the plan -> code -> verify loop: records results, asks the loop policy, sends messages.

Every worker (Celery task or embedded handler) does its own work and then calls one `record_*` method
here; that method stores the artifact, appends the job event, and lets `shared.pipeline.decide` choose
the next actions, under a per-job lock and a once-only guard so redelivered messages change nothing.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING

from google.protobuf.timestamp_pb2 import Timestamp

from stitchcuda.api.v1 import code_pb2, jobs_pb2, messages_pb2, plan_pb2, verify_pb2
from stitchcuda.shared import metrics, pipeline, report, trajectory, tuned
from stitchcuda.shared import policy as kernel_policy
from stitchcuda.shared.artifacts import ArtifactStore, Keys
from stitchcuda.shared.candidate import export_standalone
from stitchcuda.shared.envelope import SCHEMA_VERSION, new_envelope
from stitchcuda.shared.errors import InvalidRequest, StitchError
from stitchcuda.shared.jobstore import JobStore
from stitchcuda.shared.logs import log_context
from stitchcuda.shared.problem import validate_source
from stitchcuda.shared.transport import CODER, PLANNER, VERIFIER_BUILD, VERIFIER_CPU, VERIFIER_GPU, Transport

if TYPE_CHECKING:
    from stitchcuda.shared.admission import Admission

log = logging.getLogger("stitchcuda.workflow")

TERMINAL_STATES = frozenset(
    {jobs_pb2.JOB_STATE_SUCCEEDED, jobs_pb2.JOB_STATE_FAILED, jobs_pb2.JOB_STATE_CANCELLED}
)
# Actions whose handlers write the job record themselves (results, reports).
_WRITES_THE_JOB = frozenset(
    {pipeline.ActionType.FINISH, pipeline.ActionType.FAIL, pipeline.ActionType.CANCELLED}
)
_STATE_OF_PHASE = {
    pipeline.Phase.PLANNING: jobs_pb2.JOB_STATE_PLANNING,
    pipeline.Phase.CODING: jobs_pb2.JOB_STATE_CODING,
    pipeline.Phase.VERIFYING: jobs_pb2.JOB_STATE_VERIFYING,
    pipeline.Phase.SUCCEEDED: jobs_pb2.JOB_STATE_SUCCEEDED,
    pipeline.Phase.FAILED: jobs_pb2.JOB_STATE_FAILED,
    pipeline.Phase.CANCELLED: jobs_pb2.JOB_STATE_CANCELLED,
}
DEFAULT_OPTIONS = jobs_pb2.JobOptions(
    max_rounds=3, stagnation_rounds=2, min_improvement=0.02, coder_backend="builtin", samples=1, max_replans=1
)


def limits_of(options: jobs_pb2.JobOptions) -> pipeline.Limits:
    return pipeline.Limits(
        max_rounds=options.max_rounds,
        target_speedup=options.target_speedup,
        stagnation_rounds=options.stagnation_rounds or 2,
        min_improvement=options.min_improvement,
        max_replans=options.max_replans,
    )


def _now() -> Timestamp:
    stamp = Timestamp()
    stamp.GetCurrentTime()
    return stamp


class Workflow:
    def __init__(
        self,
        jobs: JobStore,
        artifacts: ArtifactStore,
        transport: Transport,
        *,
        resolve_device: Callable[[int], jobs_pb2.Device.ValueType] | None = None,
        max_reference_bytes: int = 256 * 1024,
        inline_reference_bytes: int = 64 * 1024,
        verify_policy: verify_pb2.VerifyPolicy | None = None,
        admission: Admission | None = None,
        reference_prefetch: str = "cuda",
    ) -> None:
        if reference_prefetch not in ("off", "cuda", "all"):
            raise ValueError(f"reference_prefetch must be off, cuda or all, not {reference_prefetch!r}")
        self.jobs = jobs
        self.artifacts = artifacts
        self.transport = transport
        self._resolve_device = resolve_device or _default_device
        self._max_reference_bytes = max_reference_bytes
        self._inline_reference_bytes = inline_reference_bytes
        self._verify_policy = verify_policy or verify_pb2.VerifyPolicy()
        # Without an admission (embedded mode) every job starts at once.
        self.admission = admission
        # Which jobs get their reference computed while their first program is written and built.
        self._reference_prefetch = reference_prefetch

    # -- entry points -------------------------------------------------------------------------------

    def submit(
        self,
        spec: jobs_pb2.JobSpec,
        tenant_id: str,
        *,
        job_id: str = "",
        validated: bool = False,
    ) -> jobs_pb2.Job:
        """Validates the reference, stores the job and sends it to the Planner. Idempotent on the key.

        `validated`: the caller (the gateway) already checked the source. The job is created in its
        planning state in one step, with its first events and loop state, then the plan message goes
        out; a reference above the inline size is stored first, so an unreachable artifact store
        fails the submit before any job exists. Smaller ones live in the job record only (workers and
        downloads read them from there). With an admission and no free running slot (or other jobs
        waiting for one), the job is stored queued instead and started when its tenant's turn comes.
        """
        name = spec.problem_name or "reference"
        if not validated:
            validate_source(spec.reference_source, max_bytes=self._max_reference_bytes, name=name)
        if not tenant_id:
            raise InvalidRequest("a job needs a tenant")
        spec = _with_defaults(spec)
        spec.device = self._resolve_device(spec.device)
        spec.options.kernel_policy = kernel_policy.resolve(spec.options.kernel_policy).name
        decision = pipeline.start(limits_of(spec.options))
        state = decision.state
        now = _now()
        job = jobs_pb2.Job(
            schema_version=SCHEMA_VERSION,
            job_id=job_id or uuid.uuid4().hex[:20],
            tenant_id=tenant_id,
            spec=spec,
            status=jobs_pb2.JobStatus(state=jobs_pb2.JOB_STATE_QUEUED, message="queued"),
            created_at=now,
            updated_at=now,
        )
        key = Keys.reference(tenant_id, job.job_id)
        job.artifacts["reference"] = key  # deterministic, so the record can name it before any upload
        reference = spec.reference_source.encode()
        if len(reference) > self._inline_reference_bytes:
            self.artifacts.put(key, reference, "text/x-python")
        submitted = self._new_event(job, jobs_pb2.EVENT_KIND_STATE, "submitted", stage="queued")
        if self.admission is not None and not self.admission.arrive(tenant_id, job.job_id):
            return self._queue(job, submitted, state)
        started = self._enter_phase(job, state)
        try:
            stored = self.jobs.create(job, events=(submitted, started), loop_state=state.to_json())
        except BaseException:
            if self.admission is not None:
                self.admission.finish(tenant_id, job.job_id)
            raise
        if stored is not job:
            if self.admission is not None and stored.job_id != job.job_id:
                self.admission.finish(tenant_id, job.job_id)
            return stored
        try:
            with log_context(job_id=job.job_id, tenant_id=tenant_id):
                for action in decision.actions:
                    self._carry_out(job, state, action)
        except BaseException as exc:
            self._fail_unsent(job, exc)
            raise
        return job

    def _queue(
        self, job: jobs_pb2.Job, submitted: jobs_pb2.JobEvent, state: pipeline.LoopState
    ) -> jobs_pb2.Job:
        """Stores the job in its queued state, behind its tenant's waiting jobs; `start` sends it on."""
        assert self.admission is not None
        job.status.message = "queued: waiting for a free slot"
        stored = self.jobs.create(job, events=(submitted,), loop_state=state.to_json())
        if stored is not job:
            return stored
        try:
            self.admission.enqueue(job.tenant_id, job.job_id)
        except BaseException as exc:
            self._fail_unsent(job, exc)
            raise
        self.dispatch()
        return job

    def dispatch(self) -> int:
        """Starts the waiting jobs that free running slots admit (fairly across tenants); returns how many.

        Called after a submit, after a job ends and periodically by the gateway; a failure here only
        delays jobs until the next call.
        """
        if self.admission is None:
            return 0
        started = 0
        for _ in range(100):
            try:
                taken = self.admission.take()
            except StitchError as exc:
                log.warning("could not dispatch waiting jobs: %s", exc)
                break
            if not taken:
                break
            for job_id in taken:
                try:
                    started += self.start(job_id)
                except StitchError as exc:
                    # The sweep starts a job that holds a slot but stayed queued.
                    log.warning("could not start job %s: %s", job_id, exc)
        return started

    def repair_admission(self) -> int:
        """After a crash: releases places held by ended or missing jobs, starts jobs that hold a slot but
        stayed queued, then fills free slots. Returns how many places it released."""
        if self.admission is None:
            return 0
        sweep = self.admission.sweep()
        if sweep.released:
            log.info("admission sweep released %d place(s) of ended or missing jobs", sweep.released)
        for job_id in sweep.stuck:
            try:
                self.start(job_id)
            except StitchError as exc:
                log.warning("could not start job %s: %s", job_id, exc)
        self.dispatch()
        return sweep.released

    def start(self, job_id: str) -> bool:
        """Sends a queued job to its first stage (it was given a running slot); False if it is not queued."""
        with self.jobs.lock(job_id):
            job = self.jobs.get(job_id)
            raw = self.jobs.load_state(job_id)
            if job.status.state != jobs_pb2.JOB_STATE_QUEUED or raw is None:
                return False
            state = pipeline.LoopState.from_json(raw)
            try:
                with log_context(job_id=job.job_id, tenant_id=job.tenant_id):
                    for action in pipeline.start(limits_of(job.spec.options)).actions:
                        self._carry_out(job, state, action)
                event = self._enter_phase(job, state)
                self.jobs.put(job)
                self.jobs.append_event(event)
                return True
            except StitchError as exc:
                failure = exc
        self._fail_unsent(job, failure)  # outside the lock, which it takes itself
        return False

    def _fail_unsent(self, job: jobs_pb2.Job, exc: BaseException) -> None:
        """A job whose first message never went out is failed with the reason instead of left waiting."""
        try:
            with self.jobs.lock(job.job_id):
                current = self.jobs.get(job.job_id)
                if current.status.state in TERMINAL_STATES:
                    return
                current.status.state = jobs_pb2.JOB_STATE_FAILED
                current.status.message = f"the submission did not complete: {exc}; submit again"
                self.jobs.put(current)
                metrics.record_job_finished(current)
                self._event(current, jobs_pb2.EVENT_KIND_STATE, current.status.message, stage="failed")
                self._ended(current)
        except StitchError as error:
            log.warning("could not fail the unsent job %s: %s", job.job_id, error)

    def _ended(self, job: jobs_pb2.Job) -> None:
        """Every path that ends a job comes here: its running slot and its tenant's place are released."""
        if self.admission is not None:
            self.admission.finish(job.tenant_id, job.job_id)

    def cancel(self, job_id: str, reason: str = "cancelled by the user") -> jobs_pb2.Job:
        self._advance(job_id, pipeline.Event(pipeline.EventType.CANCEL, reason=reason), guard=None)
        return self.jobs.get(job_id)

    def is_live(self, job_id: str) -> bool:
        """Workers skip messages of jobs that already ended (cancelled, failed, done)."""
        return self.jobs.get(job_id).status.state not in TERMINAL_STATES

    def progress(self, env: messages_pb2.Envelope, stage: str, fraction: float, message: str) -> None:
        job = self.jobs.get(env.job_id)
        self._event(
            job, jobs_pb2.EVENT_KIND_PROGRESS, message, stage=stage, progress=fraction, round_=env.round
        )

    # -- results reported by workers ------------------------------------------------------------------

    def record_plan(
        self, env: messages_pb2.Envelope, plan: plan_pb2.Plan | None, error: str = "", error_code: str = ""
    ) -> None:
        job = self.jobs.get(env.job_id)
        if plan is None:
            if error_code:
                job.status.error_code = error_code
                self.jobs.put(job)
            event = pipeline.Event(pipeline.EventType.PLAN_FAILED, round=env.round, reason=error)
        else:
            replan = job.status.replans
            key = Keys.plan(job.tenant_id, job.job_id, replan)
            self.artifacts.put(key, plan.SerializeToString())
            self._set_artifact(job.job_id, "plan", key)
            for warning in plan.warnings:
                self._event(job, jobs_pb2.EVENT_KIND_WARNING, warning, stage="plan", round_=env.round)
            summary = f"plan: {len(plan.subtasks)} subtasks, floor {plan.floor_ms:.3f} ms"
            self._event(job, jobs_pb2.EVENT_KIND_LOG, summary, stage="plan", round_=env.round)
            event = pipeline.Event(pipeline.EventType.PLAN_READY, round=env.round)
        self._advance(env.job_id, event, guard=f"plan:{env.round}")

    def record_candidates(
        self, env: messages_pb2.Envelope, candidates: list[code_pb2.Candidate], error: str = ""
    ) -> None:
        job = self.jobs.get(env.job_id)
        produced = 0
        for candidate in candidates:
            if candidate.failure:
                self._event(job, jobs_pb2.EVENT_KIND_WARNING, f"coder: {candidate.failure}", stage="code")
                continue
            candidate.job_id, candidate.round = job.job_id, env.round
            candidate.candidate_id = candidate.candidate_id or f"r{env.round}c{produced}"
            key = Keys.candidate(job.tenant_id, job.job_id, env.round, produced)
            self.artifacts.put(key, candidate.SerializeToString())
            produced += 1
        reasons = "; ".join(c.failure for c in candidates if c.failure) or error
        if produced:
            message = f"round {env.round}: {produced} candidate(s) from {candidates[0].coder or 'coder'}"
            self._event(job, jobs_pb2.EVENT_KIND_LOG, message, stage="code", round_=env.round)
            event = pipeline.Event(pipeline.EventType.CANDIDATES_READY, round=env.round, count=produced)
        else:
            event = pipeline.Event(pipeline.EventType.CODER_FAILED, round=env.round, reason=reasons)
        self._advance(env.job_id, event, guard=f"code:{env.round}")

    def record_verdict(self, env: messages_pb2.Envelope, index: int, verdict: verify_pb2.Verdict) -> None:
        job = self.jobs.get(env.job_id)
        key = Keys.verdict(job.tenant_id, job.job_id, env.round, index)
        self.artifacts.put(key, verdict.SerializeToString())
        metrics.record_verdict(verdict, verdict.device or job.spec.device)
        metrics.record_verdict_stages(verdict)
        metrics.record_build_result(verdict.build)
        data = {
            "accepted": str(verdict.accepted).lower(),
            "speedup_vs_eager": f"{verdict.speedup_vs_eager:.4f}",
            "speedup_vs_compile": f"{verdict.speedup_vs_compile:.4f}",
            "custom_kernel_share": f"{verdict.custom_kernel_share:.4f}",
            "candidate_id": verdict.candidate_id,
        }
        text = f"round {env.round} candidate {index}: " + (
            f"accepted, {verdict.speedup_vs_eager:.2f}x vs eager"
            if verdict.accepted
            else f"rejected: {verdict.reason}"
        )
        self._event(job, jobs_pb2.EVENT_KIND_VERDICT, text, stage="verify", round_=env.round, data=data)
        event = pipeline.Event(
            pipeline.EventType.VERDICT_READY,
            round=env.round,
            index=index,
            accepted=verdict.accepted,
            speedup=verdict.speedup_vs_eager if verdict.accepted else 0.0,
            reason=verdict.reason,
        )
        summary = jobs_pb2.RoundSummary(
            round=env.round,
            candidate_id=verdict.candidate_id,
            accepted=verdict.accepted,
            speedup_vs_eager=verdict.speedup_vs_eager,
            speedup_vs_compile=verdict.speedup_vs_compile,
            summary=verdict.reason,
        )
        self._advance(env.job_id, event, guard=f"verdict:{env.round}:{index}", summary=summary)

    def record_harness_failure(self, env: messages_pb2.Envelope, reason: str, error_code: str) -> None:
        """The verifier could not do its own part for this job (not the candidate's fault): the job ends
        with that reason and code, and no Coder round is spent on it."""
        job = self.jobs.get(env.job_id)
        if job.status.state in TERMINAL_STATES:
            return
        if not job.status.error_code:
            job.status.error_code = error_code
            self.jobs.put(job)
        text = f"round {env.round} candidate {env.candidate_index}: the verifier could not run: {reason}"
        self._event(
            job,
            jobs_pb2.EVENT_KIND_WARNING,
            text,
            stage="verify",
            round_=env.round,
            data={"error_code": error_code},
        )
        event = pipeline.Event(
            pipeline.EventType.HARNESS_FAILED, round=env.round, index=env.candidate_index, reason=reason
        )
        self._advance(env.job_id, event, guard=f"harness:{env.round}")

    # -- the loop --------------------------------------------------------------------------------------

    def _advance(
        self,
        job_id: str,
        event: pipeline.Event,
        *,
        guard: str | None,
        summary: jobs_pb2.RoundSummary | None = None,
    ) -> None:
        with self.jobs.lock(job_id):
            claimed = f"guard:{job_id}:{guard}" if guard is not None else None
            if claimed is not None and not self.jobs.claim(claimed):
                log.info("duplicate %s for job %s ignored", event.type, job_id)
                return
            try:
                raw = self.jobs.load_state(job_id)
                if raw is None:
                    raise InvalidRequest(f"job {job_id} has no loop state")
                decision = pipeline.decide(pipeline.LoopState.from_json(raw), event)
                ended = self._apply(job_id, decision, summary=summary)
            except BaseException:
                # A store failed part-way: forget the claim so the redelivered message redoes the step.
                if claimed is not None:
                    self.jobs.release(claimed)
                raise
        if ended:
            self.dispatch()  # outside the job's lock: the freed slot goes to the next tenant's job

    def _apply(
        self, job_id: str, decision: pipeline.Decision, *, summary: jobs_pb2.RoundSummary | None = None
    ) -> bool:
        """Carries out the decision's actions, then saves the new loop state (caller holds the job lock).

        The state is saved last: if an action fails, the old state stays and a redelivery decides again.
        The job record is read once and written once or twice (Redis round trips are most of a round's
        orchestration cost); it is read again only after actions that write it themselves. True when
        the job ended here.
        """
        state = decision.state
        job = self.jobs.get(job_id)
        if summary is not None:
            job.rounds.append(summary)
        job.status.round = state.round
        job.status.replans = state.replans
        if state.best is not None:
            job.status.best_speedup_vs_eager = state.best.speedup
            job.status.best_candidate_id = f"r{state.best.round}c{state.best.index}"
        job.updated_at.CopyFrom(_now())
        self.jobs.put(job)
        with log_context(job_id=job.job_id, tenant_id=job.tenant_id):
            for action in decision.actions:
                self._carry_out(job, state, action)
        self.jobs.save_state(job_id, state.to_json())
        if any(a.type in _WRITES_THE_JOB for a in decision.actions):
            job = self.jobs.get(job_id)
        if job.status.state != _STATE_OF_PHASE[state.phase]:
            event = self._enter_phase(job, state)
            self.jobs.put(job)
            self.jobs.append_event(event)
            if job.status.state in TERMINAL_STATES:
                metrics.record_job_finished(job)
                self._ended(job)
                return True
        return False

    def _enter_phase(self, job: jobs_pb2.Job, state: pipeline.LoopState) -> jobs_pb2.JobEvent:
        """Moves the job's status to the loop phase's state; returns the state event that says so."""
        job.status.state = _STATE_OF_PHASE[state.phase]
        job.status.message = state.reason or state.phase.value
        return self._new_event(job, jobs_pb2.EVENT_KIND_STATE, job.status.message, stage=state.phase.value)

    def _carry_out(self, job: jobs_pb2.Job, state: pipeline.LoopState, action: pipeline.Action) -> None:
        tenant, jid = job.tenant_id, job.job_id
        env = new_envelope(jid, tenant, action.round)
        if action.type is pipeline.ActionType.PLAN:
            env.plan_request.reference_key = Keys.reference(tenant, jid)
            if state.replans:
                env.plan_request.previous_plan_key = Keys.plan(tenant, jid, state.replans - 1)
            env.plan_request.reason = action.reason
            self.transport.send(PLANNER, env)
        elif action.type in (pipeline.ActionType.GENERATE, pipeline.ActionType.OPTIMIZE):
            if action.base is None:
                self._prefetch_reference(job, state, action.round)
            req = env.coder_request
            if action.base is None:
                self._start_from_tuned(job, req)
            req.skill = code_pb2.SKILL_GENERATE if action.base is None else code_pb2.SKILL_OPTIMIZE
            req.reference_key = Keys.reference(tenant, jid)
            req.plan_key = Keys.plan(tenant, jid, state.replans)
            req.samples = job.spec.options.samples or 1
            req.backend = job.spec.options.coder_backend or "builtin"
            req.kernel_policy = job.spec.options.kernel_policy
            if action.base is not None:
                req.previous_candidate_key = Keys.candidate(tenant, jid, *action.base)
                req.previous_verdict_key = Keys.verdict(tenant, jid, *action.base)
            self.transport.send(CODER, env)
        elif action.type is pipeline.ActionType.VERIFY:
            env.candidate_index = action.index
            verify = verify_pb2.VerifyRequest(
                reference_key=Keys.reference(tenant, jid),
                candidate_key=Keys.candidate(tenant, jid, action.round, action.index),
                device=job.spec.device,
                policy=self._policy(job),
                plan_key=Keys.plan(tenant, jid, state.replans),
            )
            if job.spec.device == jobs_pb2.DEVICE_CUDA:
                # CUDA candidates compile on CPU build workers first; the GPU queue only runs them.
                env.build_request.candidate_key = verify.candidate_key
                env.build_request.verify.CopyFrom(verify)
                self.transport.send(VERIFIER_BUILD, env)
            else:
                env.verify_request.CopyFrom(verify)
                self.transport.send(VERIFIER_CPU, env)
        elif action.type is pipeline.ActionType.FINISH:
            self._write_result(job, state, action.reason)
        elif action.type in (pipeline.ActionType.FAIL, pipeline.ActionType.CANCELLED):
            self._write_report(job, state, action.reason)

    def _reference_text(self, job: jobs_pb2.Job) -> str:
        if job.spec.reference_source:
            return job.spec.reference_source
        return self.artifacts.get(Keys.reference(job.tenant_id, job.job_id)).decode()

    def _start_from_tuned(self, job: jobs_pb2.Job, req: code_pb2.CoderRequest) -> None:
        """A generate round of the built-in Coder starts from the best variant an earlier job of the same
        problem, device and policy verified (shared/tuned.py), where there is one."""
        if (job.spec.options.coder_backend or "builtin") != "builtin":
            return
        try:
            found = tuned.lookup(
                self.artifacts,
                job.tenant_id,
                job.spec.device,
                self._reference_text(job),
                job.spec.options.kernel_policy,
            )
        except Exception as exc:  # a store we cannot read costs only the head start
            log.warning("tuned variants unavailable: %s", exc)
            return
        if found is not None:
            req.start_variant.update(found.variant)
            req.start_reason = found.reason()

    def _prefetch_reference(self, job: jobs_pb2.Job, state: pipeline.LoopState, round_: int) -> None:
        """Asks the verifier to compute the reference's results now, so the first verification finds them
        ready instead of running the reference after the build (a GPU job's largest fixed cost)."""
        cuda = job.spec.device == jobs_pb2.DEVICE_CUDA
        if self._reference_prefetch == "off" or (self._reference_prefetch == "cuda" and not cuda):
            return
        env = new_envelope(job.job_id, job.tenant_id, round_)
        req = env.reference_request
        req.reference_key = Keys.reference(job.tenant_id, job.job_id)
        req.device = job.spec.device
        req.policy.CopyFrom(self._policy(job))
        req.plan_key = Keys.plan(job.tenant_id, job.job_id, state.replans)
        self.transport.send(VERIFIER_GPU if cuda else VERIFIER_CPU, env)

    def _policy(self, job: jobs_pb2.Job) -> verify_pb2.VerifyPolicy:
        policy = verify_pb2.VerifyPolicy()
        policy.CopyFrom(self._verify_policy)
        if job.spec.options.timing_iterations:
            policy.timing_iterations = job.spec.options.timing_iterations
        if job.spec.options.kernel_policy:
            # The Coder reads the same field (CoderRequest.kernel_policy): one policy for both sides.
            policy.kernel_policy = job.spec.options.kernel_policy
        return policy

    def _write_result(self, job: jobs_pb2.Job, state: pipeline.LoopState, reason: str) -> None:
        assert state.best is not None
        best = state.best
        candidate = code_pb2.Candidate.FromString(
            self.artifacts.get(Keys.candidate(job.tenant_id, job.job_id, best.round, best.index))
        )
        verdict = verify_pb2.Verdict.FromString(
            self.artifacts.get(Keys.verdict(job.tenant_id, job.job_id, best.round, best.index))
        )
        outputs = {
            "model_new.py": export_standalone(candidate).encode(),
            "candidate.pb": candidate.SerializeToString(),
        }
        for name, data in outputs.items():
            key = Keys.result(job.tenant_id, job.job_id, name)
            self.artifacts.put(key, data)
            job.artifacts[name] = key
        job.status.best_speedup_vs_eager = verdict.speedup_vs_eager
        job.status.best_speedup_vs_compile = verdict.speedup_vs_compile
        job.status.best_candidate_id = candidate.candidate_id
        try:
            tuned.record(self.artifacts, job, self._reference_text(job), candidate, verdict)
        except Exception as exc:  # the result stands; only the next job's head start is lost
            log.warning("could not record the tuned variant of %s: %s", job.job_id, exc)
        self.jobs.put(job)
        self._write_report(job, state, reason)

    def _write_report(self, job: jobs_pb2.Job, state: pipeline.LoopState, reason: str) -> None:
        """The report says the state the job is entering (the status moves there right after)."""
        job = self.jobs.get(job.job_id)
        data = report.build(job, self.artifacts, state, reason, final_state=_STATE_OF_PHASE[state.phase])
        for name, blob, kind in (
            ("report.json", report.to_json(data).encode(), "application/json"),
            ("report.html", report.to_html(data).encode(), "text/html"),
        ):
            key = Keys.result(job.tenant_id, job.job_id, name)
            self.artifacts.put(key, blob, kind)
            job.artifacts[name] = key
        best_id = f"r{state.best.round}c{state.best.index}" if state.best is not None else ""
        try:
            # Training data (stitchcuda.training.datasets); a job's ending never fails for want of it.
            job.artifacts["trajectory.json"] = trajectory.write(
                job, self.artifacts, best_id=best_id, state=state.phase.value
            )
        except StitchError as exc:
            log.warning("could not write the trajectory of job %s: %s", job.job_id, exc)
        self.jobs.put(job)

    # -- bookkeeping ------------------------------------------------------------------------------------

    def _set_artifact(self, job_id: str, name: str, key: str) -> None:
        job = self.jobs.get(job_id)
        job.artifacts[name] = key
        self.jobs.put(job)

    def _new_event(
        self,
        job: jobs_pb2.Job,
        kind: jobs_pb2.EventKind.ValueType,
        message: str,
        *,
        stage: str = "",
        progress: float = 0.0,
        round_: int | None = None,
        data: dict[str, str] | None = None,
    ) -> jobs_pb2.JobEvent:
        return jobs_pb2.JobEvent(
            schema_version=SCHEMA_VERSION,
            job_id=job.job_id,
            at=_now(),
            kind=kind,
            state=job.status.state,
            stage=stage,
            round=job.status.round if round_ is None else round_,
            message=message,
            progress=progress,
            data=data or {},
        )

    def _event(
        self,
        job: jobs_pb2.Job,
        kind: jobs_pb2.EventKind.ValueType,
        message: str,
        *,
        stage: str = "",
        progress: float = 0.0,
        round_: int | None = None,
        data: dict[str, str] | None = None,
    ) -> str:
        event = self._new_event(job, kind, message, stage=stage, progress=progress, round_=round_, data=data)
        return self.jobs.append_event(event)


def _default_device(device: int) -> jobs_pb2.Device.ValueType:
    return jobs_pb2.DEVICE_CUDA if device == jobs_pb2.DEVICE_CUDA else jobs_pb2.DEVICE_CPU


def _with_defaults(spec: jobs_pb2.JobSpec) -> jobs_pb2.JobSpec:
    out = jobs_pb2.JobSpec()
    out.CopyFrom(spec)
    if not out.HasField("options"):
        out.options.CopyFrom(DEFAULT_OPTIONS)
    else:
        opts = out.options
        opts.coder_backend = opts.coder_backend or "builtin"
        opts.samples = opts.samples or 1
        opts.stagnation_rounds = opts.stagnation_rounds or 2
    return out
