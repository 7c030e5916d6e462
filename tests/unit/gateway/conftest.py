"""A JobService on memory stores, with the in-process transport driving fake workers."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from stitchcuda.api.v1 import gateway_pb2, jobs_pb2
from stitchcuda.gateway.service import JobService
from stitchcuda.gateway.settings import GatewaySettings
from stitchcuda.gateway.tenancy import MemoryTenantStore, Quota, Tenancy, Tenant
from stitchcuda.shared.artifacts import MemoryArtifactStore
from stitchcuda.shared.envelope import decode
from stitchcuda.shared.jobstore import MemoryJobStore
from stitchcuda.shared.stores import MemoryUsageMeter
from stitchcuda.shared.transport import CODER, PLANNER, VERIFIER_CPU, InProcessTransport
from stitchcuda.shared.workflow import Workflow
from tests.conftest import problem_source
from tests.integration.platform.fakes import FakeCoder, FakePlanner, FakeVerifier, candidate

SECRET = "unit-test-secret"


@dataclass
class Rig:
    service: JobService
    tenancy: Tenancy
    transport: InProcessTransport
    jobs: MemoryJobStore
    artifacts: MemoryArtifactStore
    usage: MemoryUsageMeter
    stopped: list[str] = field(default_factory=list)

    def tenant(self, tenant_id: str = "acme", **quota: float) -> Tenant:
        base = {"submits_per_minute": 0, "requests_per_minute": 0, "max_concurrent_jobs": 10}
        return self.tenancy.create_tenant(tenant_id, quota=Quota(**{**base, **quota}))  # type: ignore[arg-type]

    def run(self) -> int:
        return self.transport.drain()


def wire_fakes(workflow: Workflow, transport: InProcessTransport) -> None:
    planner, coder, verifier = FakePlanner(), FakeCoder(), FakeVerifier()

    def plan(data: bytes) -> None:
        env = decode(data)
        if workflow.is_live(env.job_id):
            workflow.record_plan(env, planner.plan(""))

    def code(data: bytes) -> None:
        env = decode(data)
        if workflow.is_live(env.job_id):
            workflow.record_candidates(env, coder.generate("", None, round_=env.round))  # type: ignore[arg-type]

    def verify(data: bytes) -> None:
        env = decode(data)
        if workflow.is_live(env.job_id):
            workflow.record_verdict(env, env.candidate_index, verifier.verify("", candidate(env.round)))

    transport.register(PLANNER, plan)
    transport.register(CODER, code)
    transport.register(VERIFIER_CPU, verify)


@pytest.fixture
def settings() -> GatewaySettings:
    return GatewaySettings(job_store="memory", artifact_store="memory", secret_key=SECRET, key_cache_s=0)


@pytest.fixture
def rig(settings: GatewaySettings) -> Rig:
    jobs, artifacts, transport, usage = (
        MemoryJobStore(),
        MemoryArtifactStore(),
        InProcessTransport(),
        MemoryUsageMeter(),
    )
    workflow = Workflow(jobs, artifacts, transport, max_reference_bytes=settings.max_reference_bytes)
    wire_fakes(workflow, transport)

    def state_of(job_id: str) -> int:
        try:
            return int(jobs.get(job_id).status.state)
        except Exception:
            return 0

    tenancy = Tenancy(MemoryTenantStore(state_of), usage, SECRET, key_cache_s=0)
    stopped: list[str] = []
    service = JobService(workflow, tenancy, settings, stop_work=stopped.append,
                         presign=lambda key, expires: f"https://s3.example/{key}?X-Amz-Expires={expires}")  # fmt: skip
    return Rig(service, tenancy, transport, jobs, artifacts, usage, stopped)


def submit_request(source: str | None = None, **spec: object) -> gateway_pb2.SubmitRequest:
    options = spec.pop("options", jobs_pb2.JobOptions(max_rounds=1))
    return gateway_pb2.SubmitRequest(
        schema_version=1,
        spec=jobs_pb2.JobSpec(
            problem_name=spec.pop("problem_name", "p01"),  # type: ignore[arg-type]
            reference_source=problem_source("01") if source is None else source,
            device=spec.pop("device", jobs_pb2.DEVICE_CPU),  # type: ignore[arg-type]
            options=options,  # type: ignore[arg-type]
            **spec,  # type: ignore[arg-type]
        ),
    )
