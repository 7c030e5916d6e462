"""The Planner's queue worker: plan request in, plan artifact out, loop advanced."""

from __future__ import annotations

import logging

from stitchcuda.api.v1 import jobs_pb2, messages_pb2
from stitchcuda.planner.service import PlannerService
from stitchcuda.shared import metrics
from stitchcuda.shared.artifacts import ArtifactStore
from stitchcuda.shared.errors import StitchError, Unavailable
from stitchcuda.shared.worker import BaseWorker, device_name
from stitchcuda.shared.workflow import Workflow

log = logging.getLogger("stitchcuda.planner")


class PlannerWorker(BaseWorker):
    stage = "plan"

    def __init__(self, service: PlannerService, workflow: Workflow, artifacts: ArtifactStore) -> None:
        super().__init__(workflow, artifacts)
        self.service = service

    def work(self, env: messages_pb2.Envelope, job: jobs_pb2.Job) -> None:
        source = self.load_reference(env.plan_request.reference_key)
        self.workflow.progress(env, self.stage, 0.0, "analysing the reference")
        try:
            with metrics.observe_stage("plan"):
                plan = self.service.plan(
                    source,
                    problem_name=job.spec.problem_name or "problem",
                    device=device_name(job.spec.device),
                )
        except Unavailable:
            raise  # transient: let the transport redeliver
        except StitchError as exc:
            self.workflow.record_plan(env, None, error=str(exc), error_code=exc.code)
            return
        self.workflow.record_plan(env, plan)
