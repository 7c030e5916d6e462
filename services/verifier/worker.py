"""The Verifier's queue workers: build (CPU, also for CUDA candidates) and verify (CPU or GPU)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from stitchcuda.api.v1 import jobs_pb2, messages_pb2, verify_pb2
from stitchcuda.shared.artifacts import ArtifactStore
from stitchcuda.shared.errors import HarnessError, ProblemError
from stitchcuda.shared.gpu_slots import gpu_slot, visible_gpus
from stitchcuda.shared.settings import CommonSettings
from stitchcuda.shared.transport import VERIFIER_GPU, Transport
from stitchcuda.shared.worker import BaseWorker, device_name
from stitchcuda.shared.workflow import Workflow
from stitchcuda.verifier.service import VerifierService


class VerifierWorker(BaseWorker):
    stage = "verify"

    def __init__(
        self,
        service: VerifierService,
        workflow: Workflow,
        artifacts: ArtifactStore,
        transport: Transport,
        settings: CommonSettings | None = None,
    ) -> None:
        super().__init__(workflow, artifacts)
        self.service = service
        self.transport = transport
        self.settings = settings or CommonSettings()

    @contextlib.contextmanager
    def _device_slot(self, device: str) -> Iterator[None]:
        """On CUDA, holds one of the node's context slots for this worker's GPU while a candidate runs."""
        gpus = visible_gpus() if device == "cuda" else []
        if not gpus:
            yield
            return
        with gpu_slot(self.settings.gpu_slot_dir, gpus[0], self.settings.gpu_slots_per_gpu):
            yield

    def work(self, env: messages_pb2.Envelope, job: jobs_pb2.Job) -> None:
        if env.WhichOneof("body") == "build_request":
            self._build(env, job)
        else:
            self._verify(env, job)

    def _build(self, env: messages_pb2.Envelope, job: jobs_pb2.Job) -> None:
        """Compiles on a CPU worker (nvcc needs no GPU) so the GPU queue only ever runs cached builds."""
        req = env.build_request
        candidate = self.load_candidate(req.candidate_key)
        self.workflow.progress(env, "build", 0.0, f"building candidate {env.candidate_index}")
        result = self.service.build(candidate, device=device_name(job.spec.device))
        if not result.ok:
            verdict = verify_pb2.Verdict(
                schema_version=1,
                candidate_id=candidate.candidate_id,
                accepted=False,
                compiled=False,
                build=result,
                device=job.spec.device,
                reason=f"build failed: {result.error.splitlines()[0] if result.error else 'see log'}",
                feedback=f"The build failed.\n\n{result.error}\n\n{result.log_tail}",
            )
            self.workflow.record_verdict(env, env.candidate_index, verdict)
            return
        forward = messages_pb2.Envelope()
        forward.CopyFrom(env)
        forward.verify_request.CopyFrom(req.verify)
        self.transport.send(VERIFIER_GPU, forward)

    def _verify(self, env: messages_pb2.Envelope, job: jobs_pb2.Job) -> None:
        req = env.verify_request
        source = self.load_reference(req.reference_key)
        candidate = self.load_candidate(req.candidate_key)
        plan = self.load_plan(req.plan_key) if req.plan_key and self.artifacts.exists(req.plan_key) else None
        device = device_name(req.device or job.spec.device)
        try:
            with self._device_slot(device):
                verdict = self.service.verify(
                    source,
                    candidate,
                    device=device,
                    policy=req.policy,
                    plan=plan,
                    progress=self.progress_callback(env),
                )
        except HarnessError as exc:
            # The reference ran out of memory or time, or the machine is too small: not the candidate.
            self.workflow.record_harness_failure(env, str(exc), exc.error_code)
            return
        except ProblemError as exc:
            # The reference itself fails here (the planner's run passed): the job ends with the reason.
            self.workflow.record_harness_failure(env, str(exc), exc.code)
            return
        self.workflow.record_verdict(env, env.candidate_index, verdict)
