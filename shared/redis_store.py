"""Redis adapters: the JobStore (hash per job, a Stream per job), the message ledger and the usage meter.

Keys (prefix `stitch:`):
  job:<id>                  hash: pb (the Job), tenant, state, loop (the loop-policy state)
  job:<id>:events           stream of JobEvent (field pb); the entry id is the event's seq
  tenant:<t>:jobs           sorted set of job ids by creation time (List, paging)
  idem:<t>:<key>            job id submitted under an idempotency key
  guard:<...>               SET NX once-only transition guards
  lock:job:<id>             the per-job lock (redis-py Lock, a lease that expires if its holder dies)
  msg:<id>:...              delivery counts and done markers of queue messages
  usage:<t>:<yyyy-mm>       hash of metered usage (gpu_seconds)
"""

from __future__ import annotations

import contextlib
import functools
import logging
import re
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, ParamSpec, TypeVar

import redis
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import LockError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.retry import Retry

from stitchcuda.api.v1 import jobs_pb2
from stitchcuda.shared.errors import Conflict, InvalidRequest, NotFound, Unavailable
from stitchcuda.shared.stores import usage_period

log = logging.getLogger("stitchcuda.redis")

P = ParamSpec("P")
R = TypeVar("R")

PREFIX = "stitch:"
_SEQ = re.compile(r"^\d{1,20}-\d{1,20}$")
# One blocking XREAD waits at most this long; longer waits loop (keeps sockets from idling out).
_MAX_BLOCK_S = 5.0
_STREAM_MAXLEN = 20_000

# One round trip creates the job whole: record, idempotency key, tenant index, loop state, first events.
_CREATE = """
if KEYS[2] ~= '' then
  local existing = redis.call('GET', KEYS[2])
  if existing then return {0, existing} end
end
if redis.call('EXISTS', KEYS[1]) == 1 then return {-1, ''} end
redis.call('HSET', KEYS[1], 'pb', ARGV[1], 'tenant', ARGV[2], 'state', ARGV[3])
if ARGV[6] == '1' then redis.call('HSET', KEYS[1], 'loop', ARGV[7]) end
if KEYS[2] ~= '' then redis.call('SET', KEYS[2], ARGV[4]) end
redis.call('ZADD', KEYS[3], ARGV[5], ARGV[4])
for i = 9, #ARGV do
  redis.call('XADD', KEYS[4], 'MAXLEN', '~', ARGV[8], '*', 'pb', ARGV[i])
end
return {1, ARGV[4]}
"""

_PUT = """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
redis.call('HSET', KEYS[1], 'pb', ARGV[1], 'state', ARGV[2])
return 1
"""


def connect(url: str, *, max_connections: int = 64) -> redis.Redis[bytes]:
    """A client that retries a dropped connection a few times before the caller sees Unavailable."""
    return redis.Redis.from_url(
        url,
        socket_connect_timeout=3,
        socket_timeout=_MAX_BLOCK_S + 10,
        health_check_interval=30,
        retry=Retry(ExponentialBackoff(cap=1.0, base=0.05), 3),
        retry_on_error=[RedisConnectionError, RedisTimeoutError],
        max_connections=max_connections,
    )


def unavailable_on_error(fn: Callable[P, R]) -> Callable[P, R]:
    """Redis connection failures surface as the domain's Unavailable (retryable) error."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return fn(*args, **kwargs)
        except (RedisConnectionError, RedisTimeoutError) as exc:
            raise Unavailable(f"Redis is unavailable: {exc}") from exc

    return wrapper


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class RedisJobStore:
    """The platform's JobStore: jobs survive a gateway restart; every worker sees the same state."""

    def __init__(
        self, client: redis.Redis[bytes], *, prefix: str = PREFIX, lock_lease_s: float = 120.0
    ) -> None:
        self.redis = client
        self.prefix = prefix
        self.lock_lease_s = lock_lease_s
        self._create = client.register_script(_CREATE)
        self._put = client.register_script(_PUT)

    @classmethod
    def from_url(cls, url: str) -> RedisJobStore:
        return cls(connect(url))

    def _job(self, job_id: str) -> str:
        return f"{self.prefix}job:{job_id}"

    def _events(self, job_id: str) -> str:
        return f"{self.prefix}job:{job_id}:events"

    def _tenant_jobs(self, tenant_id: str) -> str:
        return f"{self.prefix}tenant:{tenant_id}:jobs"

    @unavailable_on_error
    def ping(self) -> bool:
        return bool(self.redis.ping())

    @unavailable_on_error
    def create(
        self,
        job: jobs_pb2.Job,
        *,
        events: Sequence[jobs_pb2.JobEvent] = (),
        loop_state: bytes | None = None,
    ) -> jobs_pb2.Job:
        idem = (
            f"{self.prefix}idem:{job.tenant_id}:{job.spec.idempotency_key}"
            if job.spec.idempotency_key
            else ""
        )
        score = job.created_at.ToMilliseconds() or int(time.time() * 1000)
        status, job_id = self._create(
            keys=[self._job(job.job_id), idem, self._tenant_jobs(job.tenant_id), self._events(job.job_id)],
            args=[
                job.SerializeToString(),
                job.tenant_id,
                int(job.status.state),
                job.job_id,
                score,
                b"0" if loop_state is None else b"1",
                loop_state or b"",
                _STREAM_MAXLEN,
                *(event.SerializeToString() for event in events),
            ],
        )
        if int(status) == -1:
            raise Conflict(f"job {job.job_id} already exists")
        if int(status) == 0:
            return self.get(_text(job_id))
        return job

    @unavailable_on_error
    def get(self, job_id: str) -> jobs_pb2.Job:
        raw = self.redis.hget(self._job(job_id), "pb")
        if raw is None:
            raise NotFound(f"job not found: {job_id}")
        return jobs_pb2.Job.FromString(raw)

    @unavailable_on_error
    def put(self, job: jobs_pb2.Job) -> None:
        if not self._put(keys=[self._job(job.job_id)], args=[job.SerializeToString(), int(job.status.state)]):
            raise NotFound(f"job not found: {job.job_id}")

    @unavailable_on_error
    def state_of(self, job_id: str) -> int:
        """The job's state without decoding the whole record (admission checks)."""
        raw = self.redis.hget(self._job(job_id), "state")
        return int(raw) if raw is not None else 0

    @unavailable_on_error
    def list_jobs(
        self, tenant_id: str, *, state: int = 0, limit: int = 50, page_token: str = ""
    ) -> tuple[list[jobs_pb2.Job], str]:
        """Newest first. The page token is the last job id of the previous page (stable under inserts)."""
        limit = max(1, min(int(limit or 50), 1000))
        index = self._tenant_jobs(tenant_id)
        start = 0
        if page_token:
            rank = self.redis.zrevrank(index, page_token)
            if rank is None:
                raise InvalidRequest("invalid page token")
            start = int(rank) + 1
        out: list[jobs_pb2.Job] = []
        chunk = max(limit, 50)
        last_id = ""
        while len(out) < limit:
            ids = [_text(i) for i in self.redis.zrevrange(index, start, start + chunk - 1)]
            if not ids:
                return out, ""
            pipe = self.redis.pipeline(transaction=False)
            for job_id in ids:
                pipe.hget(self._job(job_id), "pb")
            for job_id, raw in zip(ids, pipe.execute(), strict=True):
                start += 1
                last_id = job_id
                if raw is None:
                    continue
                job = jobs_pb2.Job.FromString(raw)
                if state and job.status.state != state:
                    continue
                out.append(job)
                if len(out) == limit:
                    break
        more = self.redis.zrevrange(index, start, start)
        return out, (last_id if more else "")

    @unavailable_on_error
    def append_event(self, event: jobs_pb2.JobEvent) -> str:
        seq = self.redis.xadd(
            self._events(event.job_id),
            {"pb": event.SerializeToString()},
            maxlen=_STREAM_MAXLEN,
            approximate=True,
        )
        return _text(seq)

    @unavailable_on_error
    def read_events(
        self, job_id: str, after_seq: str = "", timeout_s: float = 0.0
    ) -> list[jobs_pb2.JobEvent]:
        if after_seq and not _SEQ.match(after_seq):
            raise InvalidRequest(f"invalid event seq {after_seq!r}")
        if not self.redis.exists(self._job(job_id)):
            raise NotFound(f"job not found: {job_id}")
        key, after = self._events(job_id), after_seq or "0-0"
        deadline = time.monotonic() + max(0.0, timeout_s)
        while True:
            remaining = deadline - time.monotonic()
            # BLOCK 0 means forever to Redis: never send it.
            block = max(1, int(min(remaining, _MAX_BLOCK_S) * 1000)) if remaining > 0.001 else None
            reply = self.redis.xread({key: after}, count=1000, block=block)
            entries = reply[0][1] if reply else []
            if entries or block is None or deadline - time.monotonic() <= 0:
                return [self._event(entry_id, fields) for entry_id, fields in entries]

    @staticmethod
    def _event(entry_id: Any, fields: dict[Any, Any]) -> jobs_pb2.JobEvent:
        event = jobs_pb2.JobEvent.FromString(fields[b"pb"] if b"pb" in fields else fields["pb"])
        event.seq = _text(entry_id)
        return event

    @unavailable_on_error
    def claim(self, guard: str, ttl_s: int = 7 * 24 * 3600) -> bool:
        return bool(self.redis.set(f"{self.prefix}guard:{guard}", b"1", nx=True, ex=ttl_s))

    def release(self, guard: str) -> None:
        self.redis.delete(f"{self.prefix}guard:{guard}")

    @contextlib.contextmanager
    def _job_lock(self, job_id: str, timeout_s: float) -> Iterator[None]:
        lock = self.redis.lock(
            f"{self.prefix}lock:job:{job_id}",
            timeout=self.lock_lease_s,
            blocking_timeout=timeout_s,
            thread_local=False,
        )
        try:
            acquired = lock.acquire()
        except (RedisConnectionError, RedisTimeoutError) as exc:
            raise Unavailable(f"Redis is unavailable: {exc}") from exc
        if not acquired:
            # Retryable: the holder finishes (or its lease expires) and the next attempt goes through.
            raise Unavailable(f"job {job_id} is busy")
        try:
            yield
        finally:
            try:
                lock.release()
            except LockError:
                log.warning("the lock of job %s expired before it was released", job_id)
            except (RedisConnectionError, RedisTimeoutError) as exc:
                log.warning("could not release the lock of job %s: %s", job_id, exc)

    def lock(self, job_id: str, timeout_s: float = 30.0) -> contextlib.AbstractContextManager[None]:
        return self._job_lock(job_id, timeout_s)

    @unavailable_on_error
    def save_state(self, job_id: str, data: bytes) -> None:
        self.redis.hset(self._job(job_id), "loop", data)

    @unavailable_on_error
    def load_state(self, job_id: str) -> bytes | None:
        raw = self.redis.hget(self._job(job_id), "loop")
        return bytes(raw) if raw is not None else None


class RedisMessageLedger:
    """Delivery counts and done markers per queue message (see celery_app.MessageLedger)."""

    def __init__(
        self, client: redis.Redis[bytes], *, prefix: str = PREFIX, ttl_s: int = 7 * 24 * 3600
    ) -> None:
        self.redis = client
        self.prefix = prefix
        self.ttl_s = ttl_s

    @unavailable_on_error
    def delivered(self, message_id: str, attempt: int) -> int:
        key = f"{self.prefix}msg:{message_id}:{attempt}:deliveries"
        pipe = self.redis.pipeline(transaction=True)
        pipe.incr(key)
        pipe.expire(key, self.ttl_s)
        count, _ = pipe.execute()
        return int(count)

    @unavailable_on_error
    def is_done(self, message_id: str) -> bool:
        return bool(self.redis.exists(f"{self.prefix}msg:{message_id}:done"))

    @unavailable_on_error
    def mark_done(self, message_id: str) -> None:
        self.redis.set(f"{self.prefix}msg:{message_id}:done", b"1", ex=self.ttl_s)


class RedisUsageMeter:
    """Metered usage per tenant and calendar month (UTC): GPU-seconds charged by the GPU verifiers."""

    def __init__(self, client: redis.Redis[bytes], *, prefix: str = PREFIX) -> None:
        self.redis = client
        self.prefix = prefix

    def _key(self, tenant_id: str, period: str) -> str:
        return f"{self.prefix}usage:{tenant_id}:{period}"

    @unavailable_on_error
    def add(self, tenant_id: str, metric: str, amount: float, *, period: str = "") -> float:
        key = self._key(tenant_id, period or usage_period())
        pipe = self.redis.pipeline(transaction=True)
        pipe.hincrbyfloat(key, metric, amount)
        pipe.expire(key, 400 * 24 * 3600)
        total, _ = pipe.execute()
        return float(total)

    @unavailable_on_error
    def get(self, tenant_id: str, metric: str, *, period: str = "") -> float:
        raw = self.redis.hget(self._key(tenant_id, period or usage_period()), metric)
        return float(raw) if raw is not None else 0.0
