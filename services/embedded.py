"""Embedded mode: the platform's service classes and workers wired through an in-process transport.

No Redis, no S3, no GPU needed: jobs live in memory, artifacts in a local directory, and every queue
message is handled in this process in FIFO order, exactly as the Celery workers would handle it.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from stitchcuda.api.v1 import jobs_pb2
from stitchcuda.shared import devices, transport
from stitchcuda.shared.artifacts import LocalArtifactStore
from stitchcuda.shared.jobstore import MemoryJobStore
from stitchcuda.shared.settings import CommonSettings
from stitchcuda.shared.workflow import Workflow

if TYPE_CHECKING:
    from stitchcuda.coder.service import CoderService
    from stitchcuda.planner.service import PlannerService
    from stitchcuda.verifier.service import VerifierService


def _resolve(device: int) -> jobs_pb2.Device.ValueType:
    return devices.to_proto(devices.resolve(device or jobs_pb2.DEVICE_AUTO))


class EmbeddedPlatform:
    def __init__(
        self,
        settings: CommonSettings | None = None,
        *,
        artifact_root: Path | None = None,
        planner: PlannerService | None = None,
        coder: CoderService | None = None,
        verifier: VerifierService | None = None,
    ) -> None:
        from stitchcuda.coder.service import CoderService
        from stitchcuda.coder.worker import CoderWorker
        from stitchcuda.planner.service import PlannerService
        from stitchcuda.planner.worker import PlannerWorker
        from stitchcuda.verifier.service import VerifierService
        from stitchcuda.verifier.worker import VerifierWorker

        self.settings = settings or CommonSettings()
        root = artifact_root or Path(tempfile.mkdtemp(prefix="stitchcuda-artifacts-"))
        self.jobs = MemoryJobStore()
        self.artifacts = LocalArtifactStore(root)
        self.transport = transport.InProcessTransport()
        self.workflow = Workflow(
            self.jobs,
            self.artifacts,
            self.transport,
            resolve_device=_resolve,
            max_reference_bytes=self.settings.max_reference_bytes,
            reference_prefetch=self.settings.reference_prefetch,
        )
        # The verifier's build cache shares the artifact store, as on the platform. The planner skips its
        # torch.compile profile here: the Verifier times torch.compile for every verdict anyway, and on a
        # laptop CPU the extra compile costs more than the rest of the plan.
        from stitchcuda.planner.settings import PlannerSettings

        self.planner = planner or PlannerService(PlannerSettings(profile_compile=False))
        self.coder = coder or CoderService()
        self.verifier = verifier or VerifierService(artifacts=self.artifacts)
        self.verify_worker = VerifierWorker(
            self.verifier, self.workflow, self.artifacts, self.transport, background_references=True
        )
        self.transport.register(
            transport.PLANNER, PlannerWorker(self.planner, self.workflow, self.artifacts).handle
        )
        self.transport.register(
            transport.CODER, CoderWorker(self.coder, self.workflow, self.artifacts).handle
        )
        for queue in (transport.VERIFIER_BUILD, transport.VERIFIER_CPU, transport.VERIFIER_GPU):
            self.transport.register(queue, self.verify_worker.handle)

    def run(
        self,
        spec: jobs_pb2.JobSpec,
        *,
        tenant_id: str = "local",
        on_event: Callable[[jobs_pb2.JobEvent], None] | None = None,
    ) -> jobs_pb2.Job:
        """Runs one job to its end and returns the final job record."""
        if on_event is not None:
            self.jobs.subscribe(on_event)
        job = self.workflow.submit(spec, tenant_id)
        self.transport.drain()
        # A reference computed ahead of a verification that never came (the Coder wrote nothing) ends
        # before the job is returned: no sandboxed process outlives the call.
        self.verify_worker.wait_references()
        return self.jobs.get(job.job_id)
