"""Admission and tenancy upkeep: running slots handed on round-robin across tenants, places released on
every way a job ends, and admin changes seen by another gateway's cache within its refresh time."""

from __future__ import annotations

import time

import pytest

from stitchcuda.api.v1 import jobs_pb2
from stitchcuda.gateway.service import JobService
from stitchcuda.gateway.settings import GatewaySettings
from stitchcuda.gateway.tenancy import MemoryTenantStore, Quota, Tenancy, Tenant
from stitchcuda.shared.admission import QUEUED, MemoryAdmission
from stitchcuda.shared.artifacts import MemoryArtifactStore
from stitchcuda.shared.errors import PermissionDenied, QuotaExceeded, Unauthenticated, Unavailable
from stitchcuda.shared.jobstore import MemoryJobStore
from stitchcuda.shared.stores import MemoryUsageMeter
from stitchcuda.shared.transport import PLANNER, InProcessTransport
from tests.unit.gateway.conftest import SECRET, submit_request, wire_fakes

TERMINAL = (jobs_pb2.JOB_STATE_SUCCEEDED, jobs_pb2.JOB_STATE_FAILED, jobs_pb2.JOB_STATE_CANCELLED)


class Platform:
    """A JobService whose workflow admits `slots` running jobs; fake workers on the in-process transport."""

    def __init__(self, slots: int) -> None:
        from stitchcuda.shared.workflow import Workflow

        self.jobs = MemoryJobStore()
        self.transport = InProcessTransport()
        self.admission = MemoryAdmission(self.state_of, slots)
        self.workflow = Workflow(self.jobs, MemoryArtifactStore(), self.transport, admission=self.admission)
        wire_fakes(self.workflow, self.transport)
        self.tenancy = Tenancy(MemoryTenantStore(self.state_of), MemoryUsageMeter(), SECRET, key_cache_s=0)
        settings = GatewaySettings(job_store="memory", artifact_store="memory", secret_key=SECRET)
        self.service = JobService(self.workflow, self.tenancy, settings)
        self.started: list[str] = []  # job ids in the order their first stage ran
        plan = self.transport._handlers[PLANNER]

        def recording_plan(data: bytes) -> None:
            from stitchcuda.shared.envelope import decode

            self.started.append(decode(data).job_id)
            plan(data)

        self.transport.register(PLANNER, recording_plan)

    def state_of(self, job_id: str) -> int:
        try:
            return int(self.jobs.get(job_id).status.state)
        except Exception:
            return 0

    def tenant(self, tenant_id: str, max_jobs: int = 0) -> Tenant:
        quota = Quota(max_concurrent_jobs=max_jobs, submits_per_minute=0, requests_per_minute=0)
        return self.tenancy.create_tenant(tenant_id, quota=quota)

    def submit(self, tenant: Tenant) -> str:
        return self.service.submit(tenant, submit_request()).job_id


def test_round_robin_hands_a_freed_slot_to_the_next_tenant_not_the_longest_backlog():
    states: dict[str, int] = {}
    admission = MemoryAdmission(lambda j: states.get(j, 0), running_jobs=1)
    assert admission.arrive("a", "a0")  # a free slot and nobody waiting: runs at once
    for i in range(1, 6):
        states[f"a{i}"] = QUEUED
        assert not admission.arrive("a", f"a{i}")
        admission.enqueue("a", f"a{i}")
    states["b0"] = QUEUED
    assert not admission.arrive("b", "b0")
    admission.enqueue("b", "b0")
    assert admission.take() == []  # the only slot is taken
    order = []
    running = "a0"
    while admission.waiting("a") + admission.waiting("b"):
        admission.finish("a" if running.startswith("a") else "b", running)
        (running,) = admission.take()
        order.append(running)
    assert order == ["a1", "b0", "a2", "a3", "a4", "a5"]


def test_a_flooding_tenant_cannot_starve_another_and_every_place_is_released_at_the_end():
    platform = Platform(slots=2)
    flood, other = platform.tenant("flood"), platform.tenant("other")
    flooded = [platform.submit(flood) for _ in range(12)]
    late = platform.submit(other)
    assert platform.jobs.get(late).status.state == jobs_pb2.JOB_STATE_QUEUED
    assert platform.jobs.get(flooded[-1]).status.message.startswith("queued")
    assert platform.admission.waiting("flood") == 10 and platform.admission.waiting("other") == 1
    platform.transport.drain()
    assert all(platform.jobs.get(j).status.state == jobs_pb2.JOB_STATE_SUCCEEDED for j in [*flooded, late])
    # Two slots were busy when the late job arrived: it starts right after the first one frees.
    assert platform.started.index(late) <= 3, platform.started
    assert platform.admission.running() == []
    assert platform.tenancy.store.active_jobs("flood") == []
    assert platform.tenancy.store.active_jobs("other") == []


def test_cancelling_a_waiting_job_frees_its_place_and_the_rest_still_run():
    platform = Platform(slots=1)
    tenant = platform.tenant("acme", max_jobs=3)
    first, second, third = (platform.submit(tenant) for _ in range(3))
    with pytest.raises(QuotaExceeded):
        platform.submit(tenant)  # queued jobs count against the tenant's quota
    platform.service.cancel(tenant, second)
    assert platform.jobs.get(second).status.state == jobs_pb2.JOB_STATE_CANCELLED
    assert platform.admission.waiting("acme") == 1
    assert len(platform.tenancy.store.active_jobs("acme")) == 2
    platform.submit(tenant)  # the cancelled job's place is free again
    platform.transport.drain()
    assert second not in platform.started
    assert platform.jobs.get(first).status.state == platform.jobs.get(third).status.state
    assert platform.jobs.get(third).status.state == jobs_pb2.JOB_STATE_SUCCEEDED
    assert platform.admission.running() == [] and platform.tenancy.store.active_jobs("acme") == []


def test_a_job_that_cannot_be_sent_when_its_turn_comes_fails_and_hands_its_slot_on():
    platform = Platform(slots=1)
    tenant = platform.tenant("acme")
    first, second, third = (platform.submit(tenant) for _ in range(3))
    real_send = platform.transport.send
    calls = {"n": 0}

    def flaky_send(queue: str, envelope: object) -> None:
        if queue == PLANNER and envelope.job_id == second:  # type: ignore[attr-defined]
            calls["n"] += 1
            raise Unavailable("broker down")
        real_send(queue, envelope)  # type: ignore[arg-type]

    platform.transport.send = flaky_send  # type: ignore[method-assign]
    platform.transport.drain()
    assert calls["n"] == 1
    second_job = platform.jobs.get(second)
    assert second_job.status.state == jobs_pb2.JOB_STATE_FAILED
    assert "broker down" in second_job.status.message
    assert platform.jobs.get(third).status.state == jobs_pb2.JOB_STATE_SUCCEEDED
    assert platform.jobs.get(first).status.state == jobs_pb2.JOB_STATE_SUCCEEDED
    assert platform.admission.running() == []


def test_the_sweep_releases_slots_of_ended_or_vanished_jobs_and_restarts_stuck_ones(
    monkeypatch: pytest.MonkeyPatch,
):
    states = {"done": jobs_pb2.JOB_STATE_SUCCEEDED, "live": jobs_pb2.JOB_STATE_CODING, "stuck": QUEUED}
    admission = MemoryAdmission(lambda j: states.get(j, 0), running_jobs=4)
    for job_id in ("done", "live", "stuck", "gone"):
        assert admission.arrive("t", job_id) or job_id in states
    admission._running.update({"done": 0.0, "live": 0.0, "stuck": 0.0, "gone": time.time()})
    sweep = admission.sweep()
    assert sweep.released == 1 and sweep.stuck == ["stuck"]  # "gone" is within its grace
    assert admission.running() == ["gone", "live", "stuck"]
    monkeypatch.setattr("stitchcuda.shared.admission.GRACE_S", -1.0)
    assert admission.sweep().released == 1 and admission.running() == ["live", "stuck"]


@pytest.mark.parametrize("change", ["disable", "revoke", "quota"])
def test_a_change_made_by_another_process_reaches_a_caching_gateway_within_its_refresh(change: str):
    store = MemoryTenantStore(lambda job_id: 0)
    admin = Tenancy(store, MemoryUsageMeter(), SECRET, key_cache_s=0)
    gateway = Tenancy(store, MemoryUsageMeter(), SECRET, key_cache_s=3600, refresh_s=0.05)
    admin.create_tenant("acme", quota=Quota(max_concurrent_jobs=1))
    info, key = admin.issue_key("acme")
    assert gateway.authenticate(key).quota.max_concurrent_jobs == 1  # cached from now on
    looked_up = []
    real_lookup = store.key_by_hash
    store.key_by_hash = lambda digest: looked_up.append(digest) or real_lookup(digest)  # type: ignore[method-assign, func-returns-value]
    gateway.authenticate(key)
    assert looked_up == []  # the cache serves unchanged tenancy without a lookup
    if change == "disable":
        admin.set_disabled("acme", True)
    elif change == "revoke":
        admin.revoke_key(info.key_id)
    else:
        admin.set_quota("acme", max_concurrent_jobs=5)
    time.sleep(0.06)
    if change == "disable":
        with pytest.raises(PermissionDenied):
            gateway.authenticate(key)
        admin.set_disabled("acme", False)
        time.sleep(0.06)
        assert gateway.authenticate(key).tenant_id == "acme"
    elif change == "revoke":
        with pytest.raises(Unauthenticated):
            gateway.authenticate(key)
    else:
        assert gateway.authenticate(key).quota.max_concurrent_jobs == 5


@pytest.mark.parametrize(
    "command", [[], ["tenant"], ["tenant", "create"], ["key"], ["key", "issue"], ["quota", "set"]]
)
def test_admin_help_fits_80_columns_without_cutting_an_option(command: list[str]):
    from typer.testing import CliRunner

    from stitchcuda.gateway.admin import app

    result = CliRunner().invoke(app, [*command, "--help"], env={"COLUMNS": "80", "TERMINAL_WIDTH": "80"})
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert max(len(line) for line in lines) <= 80
    assert "…" not in result.output  # rich cuts what does not fit with an ellipsis
    if command[-1:] in (["create"], ["set"]):
        for option in ("--max-concurrent-jobs", "--gpu-seconds-per-month", "--submits-per-minute"):
            assert any(option in line for line in lines), option
