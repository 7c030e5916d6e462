"""The gateway's composition: settings -> stores, workflow, tenancy and JobService, plus readiness checks."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from stitchcuda.gateway.service import JobService
from stitchcuda.gateway.settings import GatewaySettings
from stitchcuda.gateway.tenancy import MemoryTenantStore, Quota, RedisTenantStore, Tenancy, TenantStore
from stitchcuda.shared.errors import StitchError
from stitchcuda.shared.stores import Stores, build_stores, build_workflow
from stitchcuda.shared.workflow import Workflow

log = logging.getLogger("stitchcuda.gateway")


class AdmissionKeeper:
    """A gateway thread that fills free running slots every dispatch_s and repairs the admission every
    sweep_s (first at start): a slot freed by a process that died before handing it on is not lost.
    Each repair also re-applies the platform's running-slot count (a flushed or restarted Redis)."""

    def __init__(self, workflow: Workflow, *, capacity: int, sweep_s: float, dispatch_s: float) -> None:
        self.workflow = workflow
        self.capacity = capacity
        self.sweep_s = sweep_s
        self.dispatch_s = dispatch_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="admission-keeper", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    def _run(self) -> None:
        next_sweep = 0.0
        while not self._stop.is_set():
            try:
                if time.monotonic() >= next_sweep:
                    if self.workflow.admission is not None:
                        self.workflow.admission.set_capacity(self.capacity)
                    self.workflow.repair_admission()
                    next_sweep = time.monotonic() + self.sweep_s
                else:
                    self.workflow.dispatch()
            except StitchError as exc:
                log.warning("admission upkeep failed (retried): %s", exc)
            self._stop.wait(self.dispatch_s)


@dataclass
class GatewayServices:
    jobs: JobService
    tenancy: Tenancy
    # name -> a callable that raises (or returns False) when the dependency is not ready.
    checks: dict[str, Callable[[], object]] = field(default_factory=dict)
    stores: Stores | None = None
    collectors: list[Any] = field(default_factory=list)
    keeper: AdmissionKeeper | None = None

    def readiness(self) -> dict[str, str]:
        out: dict[str, str] = {}
        for name, check in self.checks.items():
            try:
                out[name] = "ok" if check() is not False else "not ready"
            except (StitchError, OSError) as exc:
                out[name] = f"unavailable: {exc}"
        return out

    def close(self) -> None:
        if self.keeper is not None:
            self.keeper.close()
        if self.stores is not None:
            self.stores.close()


def default_quota(settings: GatewaySettings) -> Quota:
    return Quota(
        max_concurrent_jobs=settings.default_max_concurrent_jobs,
        gpu_seconds_per_month=settings.default_gpu_seconds_per_month,
        submits_per_minute=settings.default_submits_per_minute,
        requests_per_minute=settings.default_requests_per_minute,
    )


def build_tenancy(settings: GatewaySettings, stores: Stores) -> Tenancy:
    store: TenantStore
    if settings.resolved_tenancy_store() == "redis":
        if stores.redis is None:
            from stitchcuda.shared.redis_store import connect

            stores.redis = connect(settings.redis_url)
        store = RedisTenantStore(stores.redis)
    else:
        jobs = stores.jobs

        def state_of(job_id: str) -> int:
            try:
                return int(jobs.get(job_id).status.state)
            except StitchError:
                return 0

        store = MemoryTenantStore(state_of)
    return Tenancy(
        store,
        stores.usage,
        settings.secret_key.get_secret_value(),
        default_quota=default_quota(settings),
        key_cache_s=settings.key_cache_s,
        refresh_s=settings.tenancy_refresh_s,
    )


def build_services(settings: GatewaySettings, stores: Stores | None = None) -> GatewayServices:
    stores = stores or build_stores(settings, public_endpoint=settings.s3_public_endpoint)
    workflow = build_workflow(settings, stores)
    tenancy = build_tenancy(settings, stores)
    revoke = getattr(stores.transport, "revoke_job", None)
    presign = getattr(stores.artifacts, "presigned_url", None)
    service = JobService(workflow, tenancy, settings, stop_work=revoke, presign=presign)
    checks: dict[str, Callable[[], object]] = {}
    for name, target in (("jobs", stores.jobs), ("artifacts", stores.artifacts)):
        ping = getattr(target, "ping", None)
        if callable(ping):
            checks[name] = ping
    collectors: list[Any] = []
    if stores.redis is not None:
        try:
            from stitchcuda.shared import metrics
            from stitchcuda.shared.transport import QUEUES

            collectors.append(metrics.QueueDepthCollector(stores.redis, QUEUES))
        except ImportError:
            pass
    keeper = None
    if workflow.admission is not None:
        workflow.admission.set_capacity(settings.max_running_jobs)
        keeper = AdmissionKeeper(
            workflow,
            capacity=settings.max_running_jobs,
            sweep_s=settings.admission_sweep_s,
            dispatch_s=settings.admission_dispatch_s,
        )
        keeper.start()
    return GatewayServices(service, tenancy, checks, stores, collectors, keeper)
