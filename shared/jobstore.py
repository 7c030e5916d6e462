"""The JobStore port (job records, event streams, transition guards) and its in-memory adapter."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Protocol

from stitchcuda.api.v1 import jobs_pb2
from stitchcuda.shared.errors import Conflict, NotFound


class JobStore(Protocol):
    def create(
        self,
        job: jobs_pb2.Job,
        *,
        events: Sequence[jobs_pb2.JobEvent] = (),
        loop_state: bytes | None = None,
    ) -> jobs_pb2.Job:
        """Stores a new job with its first events and loop state, all or nothing.

        Returns `job` itself when it was stored, or the job stored before under the same (tenant,
        idempotency key), in which case nothing is written.
        """
        ...

    def get(self, job_id: str) -> jobs_pb2.Job: ...

    def put(self, job: jobs_pb2.Job) -> None: ...

    def list_jobs(
        self, tenant_id: str, *, state: int = 0, limit: int = 50, page_token: str = ""
    ) -> tuple[list[jobs_pb2.Job], str]: ...

    def append_event(self, event: jobs_pb2.JobEvent) -> str:
        """Appends to the job's event stream and returns the event's seq."""
        ...

    def read_events(
        self, job_id: str, after_seq: str = "", timeout_s: float = 0.0
    ) -> list[jobs_pb2.JobEvent]:
        """Events after `after_seq`; waits up to timeout_s for the first one when none are there."""
        ...

    def claim(self, guard: str, ttl_s: int = 7 * 24 * 3600) -> bool:
        """True exactly once per guard: makes a transition happen once under at-least-once delivery."""
        ...

    def release(self, guard: str) -> None:
        """Undoes a claim whose transition failed part-way, so the redelivered message can redo it."""
        ...

    def lock(self, job_id: str, timeout_s: float = 30.0) -> contextlib.AbstractContextManager[None]:
        """Serialises read-decide-write of one job's loop state across workers."""
        ...

    def save_state(self, job_id: str, data: bytes) -> None: ...

    def load_state(self, job_id: str) -> bytes | None: ...


class MemoryJobStore:
    """The embedded-mode store: everything in process memory, guarded by one condition variable."""

    def __init__(self) -> None:
        self._jobs: dict[str, bytes] = {}
        self._events: dict[str, list[jobs_pb2.JobEvent]] = {}
        self._idempotency: dict[tuple[str, str], str] = {}
        self._claims: set[str] = set()
        self._states: dict[str, bytes] = {}
        self._locks: dict[str, threading.Lock] = {}
        self._cond = threading.Condition()
        self._listeners: list[Callable[[jobs_pb2.JobEvent], None]] = []

    def subscribe(self, listener: Callable[[jobs_pb2.JobEvent], None]) -> None:
        """Calls `listener` with every event as it is appended (the embedded CLI shows progress this way)."""
        self._listeners.append(listener)

    def create(
        self,
        job: jobs_pb2.Job,
        *,
        events: Sequence[jobs_pb2.JobEvent] = (),
        loop_state: bytes | None = None,
    ) -> jobs_pb2.Job:
        with self._cond:
            idem = (job.tenant_id, job.spec.idempotency_key)
            if job.spec.idempotency_key and idem in self._idempotency:
                return self._load(self._idempotency[idem])
            if job.job_id in self._jobs:
                raise Conflict(f"job {job.job_id} already exists")
            self._jobs[job.job_id] = job.SerializeToString()
            self._events[job.job_id] = []
            if job.spec.idempotency_key:
                self._idempotency[idem] = job.job_id
            if loop_state is not None:
                self._states[job.job_id] = loop_state
        for event in events:
            self.append_event(event)
        return job

    def _load(self, job_id: str) -> jobs_pb2.Job:
        try:
            return jobs_pb2.Job.FromString(self._jobs[job_id])
        except KeyError:
            raise NotFound(f"job not found: {job_id}") from None

    def get(self, job_id: str) -> jobs_pb2.Job:
        with self._cond:
            return self._load(job_id)

    def put(self, job: jobs_pb2.Job) -> None:
        with self._cond:
            if job.job_id not in self._jobs:
                raise NotFound(f"job not found: {job.job_id}")
            self._jobs[job.job_id] = job.SerializeToString()

    def list_jobs(
        self, tenant_id: str, *, state: int = 0, limit: int = 50, page_token: str = ""
    ) -> tuple[list[jobs_pb2.Job], str]:
        with self._cond:
            jobs = [self._load(j) for j in self._jobs]
        jobs = [j for j in jobs if j.tenant_id == tenant_id and (not state or j.status.state == state)]
        jobs.sort(key=lambda j: (-j.created_at.ToNanoseconds(), j.job_id))
        start = int(page_token or 0)
        page = jobs[start : start + limit]
        return page, (str(start + limit) if start + limit < len(jobs) else "")

    def append_event(self, event: jobs_pb2.JobEvent) -> str:
        with self._cond:
            stream = self._events.setdefault(event.job_id, [])
            stored = jobs_pb2.JobEvent()
            stored.CopyFrom(event)
            stored.seq = f"{len(stream) + 1:012d}"
            stream.append(stored)
            self._cond.notify_all()
        for listener in self._listeners:
            listener(stored)
        return stored.seq

    def read_events(
        self, job_id: str, after_seq: str = "", timeout_s: float = 0.0
    ) -> list[jobs_pb2.JobEvent]:
        deadline = time.monotonic() + timeout_s
        with self._cond:
            if job_id not in self._events:
                raise NotFound(f"job not found: {job_id}")
            while True:
                fresh = [e for e in self._events[job_id] if e.seq > after_seq]
                remaining = deadline - time.monotonic()
                if fresh or remaining <= 0:
                    return fresh
                self._cond.wait(remaining)

    def claim(self, guard: str, ttl_s: int = 7 * 24 * 3600) -> bool:
        with self._cond:
            if guard in self._claims:
                return False
            self._claims.add(guard)
            return True

    def release(self, guard: str) -> None:
        with self._cond:
            self._claims.discard(guard)

    @contextlib.contextmanager
    def _job_lock(self, job_id: str, timeout_s: float) -> Iterator[None]:
        with self._cond:
            lock = self._locks.setdefault(job_id, threading.Lock())
        if not lock.acquire(timeout=timeout_s):
            raise Conflict(f"job {job_id} is busy")
        try:
            yield
        finally:
            lock.release()

    def lock(self, job_id: str, timeout_s: float = 30.0) -> contextlib.AbstractContextManager[None]:
        return self._job_lock(job_id, timeout_s)

    def save_state(self, job_id: str, data: bytes) -> None:
        with self._cond:
            self._states[job_id] = data

    def load_state(self, job_id: str) -> bytes | None:
        with self._cond:
            return self._states.get(job_id)
