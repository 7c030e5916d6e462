"""The Verifier's queue workers: build (CPU, also for CUDA candidates) and verify (CPU or GPU)."""

from __future__ import annotations

import contextlib
import contextvars
import logging
import threading
import time
from collections.abc import Iterator

from stitchcuda.api.v1 import code_pb2, jobs_pb2, messages_pb2, plan_pb2, verify_pb2
from stitchcuda.shared.artifacts import ArtifactStore, Keys, sha256_hex
from stitchcuda.shared.candidate import content_hash
from stitchcuda.shared.errors import HarnessError, ProblemError
from stitchcuda.shared.gpu_slots import device_gpu, gpu_slot
from stitchcuda.shared.settings import CommonSettings
from stitchcuda.shared.transport import VERIFIER_GPU, Transport
from stitchcuda.shared.worker import BaseWorker, device_name
from stitchcuda.shared.workflow import Workflow
from stitchcuda.verifier.service import VerifierService

log = logging.getLogger("stitchcuda.verifier")


class VerifierWorker(BaseWorker):
    stage = "verify"

    def __init__(
        self,
        service: VerifierService,
        workflow: Workflow,
        artifacts: ArtifactStore,
        transport: Transport,
        settings: CommonSettings | None = None,
        *,
        background_references: bool = False,
    ) -> None:
        super().__init__(workflow, artifacts)
        self.service = service
        self.transport = transport
        self.settings = settings or CommonSettings()
        # Embedded mode handles every queue on one thread: a reference computed ahead of verification
        # runs on a thread of its own there, so the Coder and the build go on meanwhile. A queue worker
        # runs it in its task (the Coder and the build are other processes).
        self.background_references = background_references
        self._preparing: list[threading.Thread] = []
        self._preparing_lock = threading.Lock()

    @contextlib.contextmanager
    def _device_slot(self, device: str) -> Iterator[None]:
        """On CUDA, holds one of the node's context slots for this worker's GPU while a candidate runs."""
        gpu = device_gpu(device)
        if gpu is None:
            yield
            return
        with gpu_slot(self.settings.gpu_slot_dir, gpu, self.settings.gpu_slots_per_gpu):
            yield

    def work(self, env: messages_pb2.Envelope, job: jobs_pb2.Job) -> None:
        body = env.WhichOneof("body")
        if body == "build_request":
            self._build(env, job)
        elif body == "reference_request":
            self._prepare_reference(env, job)
        elif body == "verify_request":
            self._verify(env, job)
        else:  # a message of a newer workflow (or another queue's): not a verification with no candidate
            log.warning("verifier queue message with body %r dropped: this verifier does not handle it", body)

    def _prepare_reference(self, env: messages_pb2.Envelope, job: jobs_pb2.Job) -> None:
        """Runs the job's reference (inputs, ground truth, baselines) before its first candidate exists,
        holding the device slot as a verification does; the verification reuses the results. A failure
        is only logged here: the verification raises it and ends the job with it."""
        req = env.reference_request
        source = self.load_reference(req.reference_key)
        plan = self._plan(req.plan_key)
        device = device_name(req.device or job.spec.device)
        self.workflow.progress(
            env, "reference", 0.0, "computing the reference's results ahead of verification"
        )

        def run() -> None:
            started = time.monotonic()
            try:
                with self._device_slot(device):
                    ran = self.service.prepare_reference(source, device=device, policy=req.policy, plan=plan)
            except (HarnessError, ProblemError) as exc:
                log.info("the reference failed ahead of verification (its verification reports it): %s", exc)
                return
            except Exception:  # the verification runs the reference itself
                log.exception("the reference could not be computed ahead of verification")
                return
            log.info(
                "reference ready ahead of verification in %.1f s%s",
                time.monotonic() - started,
                "" if ran else " (results kept from an earlier run)",
            )

        if not self.background_references:
            run()
            return
        with self._preparing_lock:
            self._preparing = [t for t in self._preparing if t.is_alive()]
            # The thread logs under the job's context (job, tenant, round), as the handler does.
            context = contextvars.copy_context()
            thread = threading.Thread(
                target=context.run, args=(run,), name=f"reference-{env.job_id[:8]}", daemon=True
            )
            self._preparing.append(thread)
        thread.start()

    def _plan(self, key: str) -> plan_pb2.Plan | None:
        """The job's plan named in a request, if it was stored (a request may name none)."""
        return self.load_plan(key) if key and self.artifacts.exists(key) else None

    def wait_references(self, timeout_s: float | None = None) -> None:
        """Waits for the references still being computed on background threads (embedded mode)."""
        with self._preparing_lock:
            threads = list(self._preparing)
        for thread in threads:
            thread.join(timeout_s)

    def _build(self, env: messages_pb2.Envelope, job: jobs_pb2.Job) -> None:
        """Compiles on a CPU worker (nvcc needs no GPU) so the GPU queue only ever runs cached builds."""
        req = env.build_request
        candidate = self.load_candidate(req.candidate_key)
        if self._reuse(env, job, candidate, req.verify):
            return
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
            self.artifacts.put(verified_key(job, candidate, req.verify), verdict.SerializeToString())
            self.workflow.record_verdict(env, env.candidate_index, verdict)
            return
        forward = messages_pb2.Envelope()
        forward.CopyFrom(env)
        forward.verify_request.CopyFrom(req.verify)
        self.transport.send(VERIFIER_GPU, forward)

    def _verify(self, env: messages_pb2.Envelope, job: jobs_pb2.Job) -> None:
        req = env.verify_request
        candidate = self.load_candidate(req.candidate_key)
        if self._reuse(env, job, candidate, req):
            return
        source = self.load_reference(req.reference_key)
        plan = self._plan(req.plan_key)
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
        self.artifacts.put(verified_key(job, candidate, req), verdict.SerializeToString())
        self.workflow.record_verdict(env, env.candidate_index, verdict)

    def _reuse(
        self,
        env: messages_pb2.Envelope,
        job: jobs_pb2.Job,
        candidate: code_pb2.Candidate,
        req: verify_pb2.VerifyRequest,
    ) -> bool:
        """Records the verdict of an identical program verified earlier in this job, if there is one.

        The same sources, build and plan on the same device under the same policy earn the same verdict;
        timing it again would only add the machine's noise (issue 18: an identical program re-verified
        in the next round measured 9x slower and looked like a regression).
        """
        key = verified_key(job, candidate, req)
        if not self.artifacts.exists(key):
            return False
        earlier = self.load_verdict(key)
        verdict = verify_pb2.Verdict()
        verdict.CopyFrom(earlier)
        verdict.candidate_id = candidate.candidate_id or verdict.candidate_id
        verdict.findings.add(
            rule="verdict.reused",
            severity=verify_pb2.SEVERITY_INFO,
            detail=f"identical to {earlier.candidate_id} (same content hash): its verdict is reused, "
            "not measured again",
        )
        self.workflow.progress(
            env, self.stage, 1.0, f"candidate {env.candidate_index} is identical to {earlier.candidate_id}"
        )
        self.workflow.record_verdict(env, env.candidate_index, verdict)
        return True


def verified_key(job: jobs_pb2.Job, candidate: code_pb2.Candidate, req: verify_pb2.VerifyRequest) -> str:
    """Where this job keeps the verdict of a program, by what decides the verdict: the candidate's
    content hash, the plan, the device and the policy (outside rounds/, so reports do not list it)."""
    what = sha256_hex(
        content_hash(candidate),
        req.plan_key,
        str(req.device or job.spec.device),
        req.policy.SerializeToString(deterministic=True).hex(),
    )
    return f"{Keys.job(job.tenant_id, job.job_id)}/verified/{what}.pb"
