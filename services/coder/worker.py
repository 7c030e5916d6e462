"""The Coder's queue worker: coder request in, candidate artifacts out, loop advanced."""

from __future__ import annotations

from stitchcuda.api.v1 import code_pb2, jobs_pb2, messages_pb2, plan_pb2
from stitchcuda.coder.service import CoderService
from stitchcuda.shared import metrics
from stitchcuda.shared import policy as kernel_policy
from stitchcuda.shared.artifacts import ArtifactStore
from stitchcuda.shared.errors import StitchError, Unavailable
from stitchcuda.shared.worker import BaseWorker
from stitchcuda.shared.workflow import Workflow


class CoderWorker(BaseWorker):
    stage = "code"

    def __init__(self, service: CoderService, workflow: Workflow, artifacts: ArtifactStore) -> None:
        super().__init__(workflow, artifacts)
        self.service = service

    def work(self, env: messages_pb2.Envelope, job: jobs_pb2.Job) -> None:
        req = env.coder_request
        source = self.load_reference(req.reference_key)
        plan = self.load_plan(req.plan_key)
        skill = "optimize" if req.skill == code_pb2.SKILL_OPTIMIZE else "generate"
        self.workflow.progress(env, self.stage, 0.0, f"{skill}: writing round {env.round}")
        samples, backend = req.samples or 1, req.backend or "builtin"
        try:
            with metrics.observe_stage("code"):
                candidates = self._write(env, job, source, plan, samples=samples, backend=backend)
        except Unavailable:
            raise
        except StitchError as exc:
            self.workflow.record_candidates(env, [], error=str(exc))
            return
        written = sum(1 for c in candidates if not c.failure)
        metrics.record_candidates(skill=skill, backend=backend, count=written)
        self.workflow.record_candidates(env, candidates)

    def _write(
        self,
        env: messages_pb2.Envelope,
        job: jobs_pb2.Job,
        source: str,
        plan: plan_pb2.Plan,
        *,
        samples: int,
        backend: str,
    ) -> list[code_pb2.Candidate]:
        req = env.coder_request
        policy = kernel_policy.resolve(req.kernel_policy or job.spec.options.kernel_policy)
        if req.skill == code_pb2.SKILL_OPTIMIZE:
            previous = self.load_candidate(req.previous_candidate_key)
            verdict = self.load_verdict(req.previous_verdict_key)
            return self.service.optimize(
                source,
                plan,
                previous,
                verdict,
                samples=samples,
                backend=backend,
                job_id=env.job_id,
                round_=env.round,
                policy=policy,
            )
        return self.service.generate(
            source,
            plan,
            samples=samples,
            backend=backend,
            job_id=env.job_id,
            round_=env.round,
            policy=policy,
            start=dict(req.start_variant),
            start_reason=req.start_reason,
        )
