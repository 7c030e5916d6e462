"""The Verifier port of the reward: one verdict per candidate, from a VerifierService in this process or from
the cluster's Verifier workers through the platform's queues; the reward never knows which one it holds."""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from stitchcuda.api.v1 import code_pb2, jobs_pb2, verify_pb2
from stitchcuda.shared.errors import DeadlineExceeded, HarnessError, InvalidRequest, StitchError
from stitchcuda.shared.settings import CommonSettings
from stitchcuda.training.settings import RewardSettings

if TYPE_CHECKING:
    from stitchcuda.shared.workflow import Workflow

log = logging.getLogger("stitchcuda.training.verifier")

VERIFIERS = ("in_process", "queue")


class VerifierPort(Protocol):
    """Verifies one candidate against its reference; a candidate's faults come back as a rejecting Verdict."""

    def verify(
        self, reference_source: str, candidate: code_pb2.Candidate, *, device: str
    ) -> verify_pb2.Verdict: ...


class InProcessVerifier:
    """stitchcuda.verifier's VerifierService in this process (one machine: the CPU backend or local GPUs)."""

    def __init__(self, service: Any = None) -> None:
        self._service = service
        self._lock = threading.Lock()

    def _get(self) -> Any:
        with self._lock:
            if self._service is None:
                from stitchcuda.verifier.service import VerifierService

                self._service = VerifierService()
            return self._service

    def verify(
        self, reference_source: str, candidate: code_pb2.Candidate, *, device: str
    ) -> verify_pb2.Verdict:
        verdict: verify_pb2.Verdict = self._get().verify(reference_source, candidate, device=device)
        return verdict

    def close(self) -> None:
        with self._lock:
            if self._service is not None and hasattr(self._service, "close"):
                self._service.close()


class QueueVerifier:
    """The cluster's Verifier workers, reached as the platform reaches them: each verification is a job of
    one generate round (max_rounds 0) under `tenant`, whose candidate is handed to the workflow as the Coder
    hands one (`Workflow.record_candidates`). The workflow then sends it where it sends a user's candidate
    (verifier.cpu; for CUDA verifier.build, which forwards the built candidate to verifier.gpu), the worker
    records the verdict in the job, and this waits for it on the job's event stream (a blocking read, no
    polling). Thread-safe: every call is its own job, so calls from the reward's pool run side by side.

    A verification the harness could not do (the reference failed, a worker died on it) raises HarnessError,
    one that gets no answer within `timeout_s` raises DeadlineExceeded: the reward turns both into an error
    result (no reward, not cached), never into the candidate's rejection.
    """

    def __init__(
        self,
        workflow: Workflow,
        *,
        tenant: str = "training",
        timeout_s: float = 1800.0,
        closers: Sequence[Callable[[], None]] = (),
    ) -> None:
        self.workflow = workflow
        self.tenant = tenant
        self.timeout_s = timeout_s
        self._closers = list(closers)

    @classmethod
    def from_settings(
        cls, settings: RewardSettings, overrides: Mapping[str, Any] | None = None
    ) -> QueueVerifier:
        """The platform's stores as its workers see them: STITCH_REDIS_URL (jobs; the broker too unless
        STITCH_BROKER_URL names one) and the artifact store; `overrides` (reward.settings) over the env."""
        from stitchcuda.shared.celery_app import QueueSettings
        from stitchcuda.shared.stores import build_stores, build_workflow

        common = {name: getattr(settings, name) for name in CommonSettings.model_fields}
        queue_settings = QueueSettings(**{**(overrides or {}), **common, "job_store": "redis"})
        if queue_settings.artifact_store == "memory":
            raise InvalidRequest(
                "the queue verifier hands candidates to the workers through the artifact store: set "
                "STITCH_ARTIFACT_STORE=s3 (the cluster's bucket), or local on a single machine"
            )
        stores = build_stores(queue_settings)
        # Each verification in flight holds one connection of the pool while it waits for its verdict.
        pool_size = int(getattr(stores.redis.connection_pool, "max_connections", 0) or 0)
        if pool_size and settings.reward_max_concurrent > pool_size // 2:
            stores.close()
            raise InvalidRequest(
                f"reward_max_concurrent ({settings.reward_max_concurrent}) is above {pool_size // 2}, what "
                f"one Redis connection pool of {pool_size} can wait on: run more trainer processes instead"
            )
        # No admission: these jobs never wait for a running slot, and the trainer starts no one else's.
        workflow = build_workflow(queue_settings, stores, admission=None)
        return cls(
            workflow,
            tenant=settings.reward_queue_tenant,
            timeout_s=settings.reward_queue_timeout_s,
            closers=[stores.close],
        )

    def verify(
        self, reference_source: str, candidate: code_pb2.Candidate, *, device: str
    ) -> verify_pb2.Verdict:
        from stitchcuda.shared.envelope import new_envelope

        if device not in ("cpu", "cuda"):
            raise InvalidRequest(f"unknown device {device!r}: the queue verifier takes cpu or cuda")
        if candidate.failure:
            # The workflow never sends a Coder's failure to a Verifier; this is the verdict one would give.
            return _coder_failure(candidate, device)
        job = self._create_job(reference_source, device)
        program = code_pb2.Candidate()
        program.CopyFrom(candidate)
        # Content-named, so a verdict, a job's report and its trajectory say which program they are about.
        program.candidate_id = candidate.candidate_id or f"rollout-{_content_id(candidate)}"
        try:
            self.workflow.record_candidates(new_envelope(job.job_id, self.tenant), [program])
        except StitchError as exc:
            self._abandon(job.job_id, f"its candidate was not sent: {exc}")
            raise
        return self._await_verdict(job.job_id, device)

    def close(self) -> None:
        for close in reversed(self._closers):
            close()
        self._closers.clear()

    def _create_job(self, reference_source: str, device: str) -> jobs_pb2.Job:
        """A job that starts where the Coder's answer arrives: round 0, coding, no plan, no later rounds."""
        from stitchcuda.shared import pipeline
        from stitchcuda.shared.artifacts import Keys
        from stitchcuda.shared.devices import to_proto
        from stitchcuda.shared.envelope import SCHEMA_VERSION

        job = jobs_pb2.Job(
            schema_version=SCHEMA_VERSION,
            job_id=uuid.uuid4().hex[:20],
            tenant_id=self.tenant,
            spec=jobs_pb2.JobSpec(
                problem_name="rollout",
                # The workers read the reference from the job record, however large (BaseWorker.handle).
                reference_source=reference_source,
                device=to_proto(device),
                options=jobs_pb2.JobOptions(max_rounds=0, samples=1),
                labels={"source": "training"},
            ),
            status=jobs_pb2.JobStatus(state=jobs_pb2.JOB_STATE_CODING, message="a rollout to verify"),
        )
        job.created_at.GetCurrentTime()
        job.updated_at.CopyFrom(job.created_at)
        job.artifacts["reference"] = Keys.reference(self.tenant, job.job_id)
        event = jobs_pb2.JobEvent(
            schema_version=SCHEMA_VERSION,
            job_id=job.job_id,
            kind=jobs_pb2.EVENT_KIND_STATE,
            state=job.status.state,
            stage=pipeline.Phase.CODING.value,
            message=job.status.message,
        )
        event.at.CopyFrom(job.created_at)
        state = pipeline.LoopState(limits=pipeline.Limits(max_rounds=0), phase=pipeline.Phase.CODING)
        self.workflow.jobs.create(job, events=(event,), loop_state=state.to_json())
        return job

    def _await_verdict(self, job_id: str, device: str) -> verify_pb2.Verdict:
        from stitchcuda.shared.artifacts import Keys
        from stitchcuda.shared.workflow import TERMINAL_STATES

        deadline = time.monotonic() + self.timeout_s
        seq, failure = "", ("", "")
        while (remaining := deadline - time.monotonic()) > 0:
            for event in self.workflow.jobs.read_events(job_id, seq, timeout_s=remaining):
                seq = event.seq
                if event.kind == jobs_pb2.EVENT_KIND_VERDICT:
                    key = Keys.verdict(self.tenant, job_id, 0, 0)
                    return verify_pb2.Verdict.FromString(self.workflow.artifacts.get(key))
                if event.kind == jobs_pb2.EVENT_KIND_WARNING and "error_code" in event.data:
                    failure = (event.message, event.data["error_code"])
                if event.kind == jobs_pb2.EVENT_KIND_STATE and event.state in TERMINAL_STATES:
                    message, code = failure
                    raise HarnessError(
                        f"job {self.tenant}/{job_id} ended without a verdict: {message or event.message}",
                        error_code=code or "verifier_failed",
                    )
        route = "verifier.cpu" if device == "cpu" else "verifier.build and verifier.gpu"
        self._abandon(job_id, f"no verdict within {self.timeout_s:g} s")
        raise DeadlineExceeded(
            f"no verdict within {self.timeout_s:g} s (reward_queue_timeout_s) for job "
            f"{self.tenant}/{job_id}: is a Verifier worker consuming {route}?"
        )

    def _abandon(self, job_id: str, reason: str) -> None:
        """Cancels a job the reward stopped waiting for, so a worker that takes its message later drops it."""
        try:
            self.workflow.cancel(job_id, f"the reward gave up: {reason}")
        except StitchError as exc:
            log.warning("could not cancel the abandoned verification job %s: %s", job_id, exc)


def _content_id(candidate: code_pb2.Candidate) -> str:
    from stitchcuda.shared.candidate import content_hash

    return content_hash(candidate)[:12]


def _coder_failure(candidate: code_pb2.Candidate, device: str) -> verify_pb2.Verdict:
    from stitchcuda.shared.devices import to_proto

    detail = f"the coder produced no program: {candidate.failure}"
    verdict = verify_pb2.Verdict(
        schema_version=1,
        candidate_id=candidate.candidate_id,
        device=to_proto(device),
        reason=f"candidate.failed: {detail}"[:300],
    )
    verdict.findings.add(rule="candidate.failed", severity=verify_pb2.SEVERITY_REJECT, detail=detail)
    return verdict


def build_verifier(
    kind: str, settings: RewardSettings, overrides: Mapping[str, Any] | None = None
) -> InProcessVerifier | QueueVerifier:
    """The port a run asks for: "in_process" (a VerifierService here) or "queue" (the cluster's workers)."""
    if kind == "in_process":
        return InProcessVerifier()
    if kind == "queue":
        return QueueVerifier.from_settings(settings, overrides)
    raise InvalidRequest(f"unknown verifier {kind!r}: one of {', '.join(VERIFIERS)}")
