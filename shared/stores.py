"""Builds the adapters a process runs on (job store, artifact store, transport, ledger, usage) from settings.

`job_store="redis"` selects the platform: Redis job store, Celery transport, Redis ledger and usage.
`job_store="memory"` selects the embedded set: in-memory stores and the in-process transport.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from stitchcuda.shared.artifacts import ArtifactStore, LocalArtifactStore, MemoryArtifactStore
from stitchcuda.shared.jobstore import JobStore, MemoryJobStore
from stitchcuda.shared.settings import CommonSettings
from stitchcuda.shared.transport import InProcessTransport, Transport
from stitchcuda.shared.workflow import Workflow


class MessageLedger(Protocol):
    """Per-message bookkeeping that makes redelivery safe: delivery counts and a done marker."""

    def delivered(self, message_id: str, attempt: int) -> int:
        """Counts one delivery of (message, retry attempt) and returns the count so far."""
        ...

    def is_done(self, message_id: str) -> bool: ...

    def mark_done(self, message_id: str) -> None: ...


class MemoryMessageLedger:
    def __init__(self) -> None:
        self._counts: dict[tuple[str, int], int] = {}
        self._done: set[str] = set()
        self._lock = threading.Lock()

    def delivered(self, message_id: str, attempt: int) -> int:
        with self._lock:
            key = (message_id, attempt)
            self._counts[key] = self._counts.get(key, 0) + 1
            return self._counts[key]

    def is_done(self, message_id: str) -> bool:
        with self._lock:
            return message_id in self._done

    def mark_done(self, message_id: str) -> None:
        with self._lock:
            self._done.add(message_id)


def usage_period(at: float | None = None) -> str:
    """Usage is metered per calendar month (UTC)."""
    return time.strftime("%Y-%m", time.gmtime(at if at is not None else time.time()))


class UsageMeter(Protocol):
    """Metered usage per tenant and month (GPU-seconds); quotas are checked against it."""

    def add(self, tenant_id: str, metric: str, amount: float, *, period: str = "") -> float: ...

    def get(self, tenant_id: str, metric: str, *, period: str = "") -> float: ...


class MemoryUsageMeter:
    def __init__(self) -> None:
        self._values: dict[tuple[str, str, str], float] = {}
        self._lock = threading.Lock()

    def add(self, tenant_id: str, metric: str, amount: float, *, period: str = "") -> float:
        with self._lock:
            key = (tenant_id, metric, period or usage_period())
            self._values[key] = self._values.get(key, 0.0) + amount
            return self._values[key]

    def get(self, tenant_id: str, metric: str, *, period: str = "") -> float:
        with self._lock:
            return self._values.get((tenant_id, metric, period or usage_period()), 0.0)


@dataclass
class Stores:
    jobs: JobStore
    artifacts: ArtifactStore
    transport: Transport
    ledger: MessageLedger
    usage: UsageMeter
    # The Redis client behind the platform adapters (None in embedded mode): health checks, tenancy.
    redis: Any = None
    closers: list[Callable[[], None]] = field(default_factory=list)

    def close(self) -> None:
        for close in reversed(self.closers):
            close()


def build_artifact_store(settings: CommonSettings, *, public_endpoint: str = "") -> ArtifactStore:
    if settings.artifact_store == "s3":
        from stitchcuda.shared.s3_store import S3ArtifactStore

        return S3ArtifactStore.from_settings(settings, public_endpoint=public_endpoint)
    if settings.artifact_store == "local":
        return LocalArtifactStore(settings.resolved_artifact_dir())
    return MemoryArtifactStore()


def build_stores(settings: CommonSettings, *, public_endpoint: str = "") -> Stores:
    artifacts = build_artifact_store(settings, public_endpoint=public_endpoint)
    if settings.job_store != "redis":
        return Stores(
            MemoryJobStore(), artifacts, InProcessTransport(), MemoryMessageLedger(), MemoryUsageMeter()
        )

    from stitchcuda.shared.celery_app import QueueSettings, create_celery
    from stitchcuda.shared.celery_transport import CeleryTransport, RedisQueuePublisher
    from stitchcuda.shared.redis_store import RedisJobStore, RedisMessageLedger, RedisUsageMeter, connect

    client = connect(settings.redis_url)
    queue_settings = settings if isinstance(settings, QueueSettings) else QueueSettings(
        **settings.model_dump()
    )  # fmt: skip
    celery = create_celery(queue_settings)
    broker = queue_settings.resolved_broker_url()
    publisher = None
    closers = [client.close, celery.close]
    if broker.split("://", 1)[0] in ("redis", "rediss"):
        # A Redis broker: messages go straight onto its lists (see RedisQueuePublisher).
        broker_client = client if broker == settings.redis_url else connect(broker)
        if broker_client is not client:
            closers.append(broker_client.close)
        publisher = RedisQueuePublisher(celery, broker_client)
    stores = Stores(
        jobs=RedisJobStore(client),
        artifacts=artifacts,
        transport=CeleryTransport(celery, client, publisher=publisher),
        ledger=RedisMessageLedger(client),
        usage=RedisUsageMeter(client),
        redis=client,
    )
    stores.closers += closers
    return stores


def build_workflow(settings: CommonSettings, stores: Stores, **kwargs: Any) -> Workflow:
    """The workflow every process drives jobs with, over the given stores (on the platform, with the
    shared admission: every process that ends a job hands its running slot on)."""
    if stores.redis is not None and "admission" not in kwargs:
        from stitchcuda.shared.admission import RedisAdmission

        kwargs["admission"] = RedisAdmission(stores.redis)
    return Workflow(
        stores.jobs,
        stores.artifacts,
        stores.transport,
        max_reference_bytes=settings.max_reference_bytes,
        inline_reference_bytes=settings.inline_reference_bytes,
        reference_prefetch=settings.reference_prefetch,
        **kwargs,
    )
