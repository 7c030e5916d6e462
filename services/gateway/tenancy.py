"""Tenants, API keys (stored only as HMAC-SHA256), quotas (concurrent jobs, GPU-seconds) and rate limits.

A key is shown once, when issued; the store keeps HMAC(secret_key, key), so a stolen Redis dump
yields no usable key. Concurrency is enforced atomically (a Lua script on Redis, a lock in memory):
a tenant's active set holds its queued and running jobs; the Workflow removes a job when it ends, and
the reservation (and the admission's sweep) drop any that a crash left behind.

Every change to tenants or keys bumps a version in the store. A gateway trusts its cache of
authenticated keys only while that version is unchanged, and reads it at most every `refresh_s`, so an
admin change (disable, revoke, quota) reaches every gateway process within that time.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import hmac
import json
import re
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from stitchcuda.api.v1 import jobs_pb2
from stitchcuda.shared.admission import active_key
from stitchcuda.shared.errors import (
    Conflict,
    InvalidRequest,
    NotFound,
    PermissionDenied,
    QuotaExceeded,
    Unauthenticated,
)
from stitchcuda.shared.redis_store import PREFIX, unavailable_on_error
from stitchcuda.shared.stores import UsageMeter, usage_period

_TENANT_ID = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")
KEY_PREFIX = "stk_"
TERMINAL = (jobs_pb2.JOB_STATE_SUCCEEDED, jobs_pb2.JOB_STATE_FAILED, jobs_pb2.JOB_STATE_CANCELLED)
# A reservation whose job record never appeared (the gateway died mid-submit) is freed after this.
RESERVATION_GRACE_S = 120.0


class Reservation(enum.IntEnum):
    """What a concurrency reservation found (FULL is falsy)."""

    FULL = 0
    RESERVED = 1
    EXISTS = 2  # the job is already stored: an idempotent replay takes no slot


@dataclass(frozen=True)
class Quota:
    """Limits of one tenant; 0 means unlimited."""

    max_concurrent_jobs: int = 4
    gpu_seconds_per_month: float = 36_000.0
    submits_per_minute: int = 120
    requests_per_minute: int = 6_000


@dataclass(frozen=True)
class Tenant:
    tenant_id: str
    name: str
    quota: Quota = field(default_factory=Quota)
    disabled: bool = False
    created_at: float = 0.0

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @staticmethod
    def from_json(raw: str | bytes) -> Tenant:
        data = json.loads(raw)
        return Tenant(**{**data, "quota": Quota(**data["quota"])})


@dataclass(frozen=True)
class ApiKeyInfo:
    key_id: str
    tenant_id: str
    label: str = ""
    created_at: float = 0.0

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @staticmethod
    def from_json(raw: str | bytes) -> ApiKeyInfo:
        return ApiKeyInfo(**json.loads(raw))


class TenantStore(Protocol):
    def put_tenant(self, tenant: Tenant) -> None: ...

    def get_tenant(self, tenant_id: str) -> Tenant | None: ...

    def list_tenants(self) -> list[Tenant]: ...

    def add_key(self, key_hash: str, info: ApiKeyInfo) -> None: ...

    def key_by_hash(self, key_hash: str) -> ApiKeyInfo | None: ...

    def remove_key(self, key_id: str) -> ApiKeyInfo | None: ...

    def list_keys(self, tenant_id: str) -> list[ApiKeyInfo]: ...

    def hit(self, bucket: str, window_s: int) -> int:
        """Counts one event in the current fixed window of `bucket`; returns the window's count."""
        ...

    def reserve_job(
        self, tenant_id: str, job_id: str, limit: int, *, unless_exists: bool = False
    ) -> Reservation:
        """Adds job_id to the tenant's active jobs unless `limit` (0 = none) active jobs are running.

        `unless_exists`: a job with that id already stored takes nothing and answers EXISTS (an
        idempotent replay, checked in the same step as the slot).
        """
        ...

    def release_job(self, tenant_id: str, job_id: str) -> None: ...

    def active_jobs(self, tenant_id: str) -> list[str]:
        """The tenant's queued and running jobs (ids of ended jobs are dropped on the way)."""
        ...

    def version(self) -> int:
        """Changes whenever a tenant or a key is written or removed (caches compare it)."""
        ...


class MemoryTenantStore:
    """For tests and the embedded mode; `state_of` reads a job's state (0 when there is none)."""

    def __init__(self, state_of: Callable[[str], int]) -> None:
        self._state_of = state_of
        self._tenants: dict[str, Tenant] = {}
        self._keys: dict[str, tuple[str, ApiKeyInfo]] = {}  # key_id -> (hash, info)
        self._by_hash: dict[str, ApiKeyInfo] = {}
        self._windows: dict[tuple[str, int], int] = {}
        self._active: dict[str, dict[str, float]] = {}
        self._version = 0
        self._lock = threading.Lock()

    def put_tenant(self, tenant: Tenant) -> None:
        with self._lock:
            self._tenants[tenant.tenant_id] = tenant
            self._version += 1

    def get_tenant(self, tenant_id: str) -> Tenant | None:
        with self._lock:
            return self._tenants.get(tenant_id)

    def list_tenants(self) -> list[Tenant]:
        with self._lock:
            return sorted(self._tenants.values(), key=lambda t: t.tenant_id)

    def add_key(self, key_hash: str, info: ApiKeyInfo) -> None:
        with self._lock:
            self._keys[info.key_id] = (key_hash, info)
            self._by_hash[key_hash] = info
            self._version += 1

    def key_by_hash(self, key_hash: str) -> ApiKeyInfo | None:
        with self._lock:
            return self._by_hash.get(key_hash)

    def remove_key(self, key_id: str) -> ApiKeyInfo | None:
        with self._lock:
            entry = self._keys.pop(key_id, None)
            if entry is None:
                return None
            self._by_hash.pop(entry[0], None)
            self._version += 1
            return entry[1]

    def list_keys(self, tenant_id: str) -> list[ApiKeyInfo]:
        with self._lock:
            return sorted(
                (i for _, i in self._keys.values() if i.tenant_id == tenant_id), key=lambda i: i.key_id
            )

    def hit(self, bucket: str, window_s: int) -> int:
        window = int(time.time() // window_s)
        with self._lock:
            self._windows = {k: v for k, v in self._windows.items() if k[1] >= window}
            self._windows[(bucket, window)] = self._windows.get((bucket, window), 0) + 1
            return self._windows[(bucket, window)]

    def reserve_job(
        self, tenant_id: str, job_id: str, limit: int, *, unless_exists: bool = False
    ) -> Reservation:
        with self._lock:
            if unless_exists and self._state_of(job_id):
                return Reservation.EXISTS
            active = self._sweep(tenant_id)
            if limit and len(active) >= limit and job_id not in active:
                return Reservation.FULL
            active[job_id] = time.time()
            return Reservation.RESERVED

    def release_job(self, tenant_id: str, job_id: str) -> None:
        with self._lock:
            self._active.get(tenant_id, {}).pop(job_id, None)

    def _sweep(self, tenant_id: str) -> dict[str, float]:
        active = self._active.setdefault(tenant_id, {})
        now = time.time()
        for jid, since in list(active.items()):
            state = self._state_of(jid)
            if state in TERMINAL or (state == 0 and now - since > RESERVATION_GRACE_S):
                del active[jid]
        return active

    def active_jobs(self, tenant_id: str) -> list[str]:
        with self._lock:
            return sorted(self._sweep(tenant_id))

    def version(self) -> int:
        with self._lock:
            return self._version


# Ended jobs (and reservations whose job never appeared) leave the active set lazily: all of them when
# the limit is reached, otherwise a small random sample per call, so a submit costs O(1) however many
# jobs the tenant has queued while the set stays within a small factor of the active jobs.
_RESERVE = """
local now, limit, grace = tonumber(ARGV[3]), tonumber(ARGV[2]), tonumber(ARGV[5])
if ARGV[7] == '1' and redis.call('EXISTS', ARGV[4] .. ARGV[1]) == 1 then return 2 end
local function sweep(members)
  for i = 1, #members, 2 do
    local id, since = members[i], tonumber(members[i + 1])
    local state = redis.call('HGET', ARGV[4] .. id, 'state')
    if state == '5' or state == '6' or state == '7' or ((not state) and now - since > grace) then
      redis.call('ZREM', KEYS[1], id)
    end
  end
end
if limit > 0 and redis.call('ZCARD', KEYS[1]) >= limit and not redis.call('ZSCORE', KEYS[1], ARGV[1]) then
  sweep(redis.call('ZRANGE', KEYS[1], 0, -1, 'WITHSCORES'))
  if redis.call('ZCARD', KEYS[1]) >= limit then return 0 end
else
  sweep(redis.call('ZRANDMEMBER', KEYS[1], tonumber(ARGV[6]), 'WITHSCORES'))
end
redis.call('ZADD', KEYS[1], now, ARGV[1])
return 1
"""
# Members of the active set checked per reservation below the limit.
_SWEEP_SAMPLE = 4


class RedisTenantStore:
    """Tenants and keys in Redis, next to the jobs (the active-job check reads the job hashes)."""

    def __init__(self, client: Any, *, prefix: str = PREFIX) -> None:
        self.redis = client
        self.prefix = prefix
        self._reserve = client.register_script(_RESERVE)
        self._version_key = self._k("tenancy", "version")

    def _k(self, *parts: str) -> str:
        return self.prefix + ":".join(parts)

    @unavailable_on_error
    def put_tenant(self, tenant: Tenant) -> None:
        pipe = self.redis.pipeline(transaction=True)
        pipe.set(self._k("tenant", tenant.tenant_id), tenant.to_json())
        pipe.sadd(self._k("tenants"), tenant.tenant_id)
        pipe.incr(self._version_key)
        pipe.execute()

    @unavailable_on_error
    def get_tenant(self, tenant_id: str) -> Tenant | None:
        raw = self.redis.get(self._k("tenant", tenant_id))
        return Tenant.from_json(raw) if raw else None

    @unavailable_on_error
    def list_tenants(self) -> list[Tenant]:
        ids = sorted(
            i.decode() if isinstance(i, bytes) else i for i in self.redis.smembers(self._k("tenants"))
        )
        raws = self.redis.mget([self._k("tenant", i) for i in ids]) if ids else []
        return [Tenant.from_json(r) for r in raws if r]

    @unavailable_on_error
    def add_key(self, key_hash: str, info: ApiKeyInfo) -> None:
        pipe = self.redis.pipeline(transaction=True)
        pipe.set(self._k("apikey", key_hash), info.to_json())
        pipe.hset(self._k("tenant", info.tenant_id, "keys"), info.key_id, key_hash)
        pipe.set(self._k("apikey-id", info.key_id), key_hash)
        pipe.incr(self._version_key)
        pipe.execute()

    @unavailable_on_error
    def key_by_hash(self, key_hash: str) -> ApiKeyInfo | None:
        raw = self.redis.get(self._k("apikey", key_hash))
        return ApiKeyInfo.from_json(raw) if raw else None

    @unavailable_on_error
    def remove_key(self, key_id: str) -> ApiKeyInfo | None:
        key_hash = self.redis.get(self._k("apikey-id", key_id))
        if key_hash is None:
            return None
        key_hash = key_hash.decode() if isinstance(key_hash, bytes) else key_hash
        info = self.key_by_hash(key_hash)
        pipe = self.redis.pipeline(transaction=True)
        pipe.delete(self._k("apikey", key_hash), self._k("apikey-id", key_id))
        if info is not None:
            pipe.hdel(self._k("tenant", info.tenant_id, "keys"), key_id)
        pipe.incr(self._version_key)
        pipe.execute()
        return info

    @unavailable_on_error
    def list_keys(self, tenant_id: str) -> list[ApiKeyInfo]:
        hashes = self.redis.hgetall(self._k("tenant", tenant_id, "keys"))
        infos = [self.key_by_hash(h.decode() if isinstance(h, bytes) else h) for h in hashes.values()]
        return sorted((i for i in infos if i is not None), key=lambda i: i.key_id)

    @unavailable_on_error
    def hit(self, bucket: str, window_s: int) -> int:
        window = int(time.time() // window_s)
        key = self._k("rate", bucket, str(window))
        pipe = self.redis.pipeline(transaction=False)
        pipe.incr(key)
        pipe.expire(key, window_s * 2)
        count, _ = pipe.execute()
        return int(count)

    @unavailable_on_error
    def reserve_job(
        self, tenant_id: str, job_id: str, limit: int, *, unless_exists: bool = False
    ) -> Reservation:
        return Reservation(
            int(
                self._reserve(
                    keys=[active_key(tenant_id, self.prefix)],
                    args=[
                        job_id,
                        int(limit),
                        time.time(),
                        self._k("job", ""),
                        RESERVATION_GRACE_S,
                        _SWEEP_SAMPLE,
                        int(unless_exists),
                    ],
                )
            )
        )

    @unavailable_on_error
    def release_job(self, tenant_id: str, job_id: str) -> None:
        self.redis.zrem(active_key(tenant_id, self.prefix), job_id)

    @unavailable_on_error
    def active_jobs(self, tenant_id: str) -> list[str]:
        ids = self.redis.zrange(active_key(tenant_id, self.prefix), 0, -1)
        return sorted(i.decode() if isinstance(i, bytes) else i for i in ids)

    @unavailable_on_error
    def version(self) -> int:
        return int(self.redis.get(self._version_key) or 0)


class Tenancy:
    """Authentication, admission and administration of tenants over a TenantStore."""

    def __init__(
        self,
        store: TenantStore,
        usage: UsageMeter,
        secret_key: str,
        *,
        default_quota: Quota | None = None,
        key_cache_s: float = 5.0,
        refresh_s: float = 0.2,
    ) -> None:
        if not secret_key:
            raise ValueError("tenancy needs a secret key (STITCH_SECRET_KEY) to hash API keys")
        self.store = store
        self.usage = usage
        self._secret = secret_key.encode()
        self.default_quota = default_quota or Quota()
        self.key_cache_s = key_cache_s
        self.refresh_s = refresh_s
        # digest -> (expires at, the store's version it was read under, the tenant)
        self._cache: dict[str, tuple[float, int, Tenant]] = {}
        self._cache_lock = threading.Lock()
        self._version = -1
        self._version_due = 0.0

    def hash_key(self, api_key: str) -> str:
        return hmac.new(self._secret, api_key.encode(), hashlib.sha256).hexdigest()

    # -- administration --------------------------------------------------------------------------------

    def create_tenant(self, tenant_id: str, name: str = "", quota: Quota | None = None) -> Tenant:
        if not _TENANT_ID.match(tenant_id):
            raise InvalidRequest(f"invalid tenant id {tenant_id!r}: lowercase letters, digits and '-'")
        if self.store.get_tenant(tenant_id) is not None:
            raise Conflict(f"tenant {tenant_id} already exists")
        tenant = Tenant(tenant_id, name or tenant_id, quota or self.default_quota, created_at=time.time())
        self.store.put_tenant(tenant)
        return tenant

    def get_tenant(self, tenant_id: str) -> Tenant:
        tenant = self.store.get_tenant(tenant_id)
        if tenant is None:
            raise NotFound(f"tenant not found: {tenant_id}")
        return tenant

    def set_quota(self, tenant_id: str, **changes: Any) -> Tenant:
        tenant = self.get_tenant(tenant_id)
        valid = {f.name for f in dataclasses.fields(Quota)}
        unknown = set(changes) - valid
        if unknown:
            raise InvalidRequest(f"unknown quota field(s): {', '.join(sorted(unknown))}")
        if any(v is not None and v < 0 for v in changes.values()):
            raise InvalidRequest("quotas cannot be negative (0 means unlimited)")
        quota = dataclasses.replace(tenant.quota, **{k: v for k, v in changes.items() if v is not None})
        updated = dataclasses.replace(tenant, quota=quota)
        self.store.put_tenant(updated)
        return updated

    def set_disabled(self, tenant_id: str, disabled: bool) -> Tenant:
        updated = dataclasses.replace(self.get_tenant(tenant_id), disabled=disabled)
        self.store.put_tenant(updated)
        return updated

    def issue_key(self, tenant_id: str, label: str = "") -> tuple[ApiKeyInfo, str]:
        """A new key for the tenant: (its record, the key itself, which is never stored)."""
        self.get_tenant(tenant_id)
        key_id = secrets.token_hex(6)
        api_key = f"{KEY_PREFIX}{key_id}_{secrets.token_urlsafe(32)}"
        info = ApiKeyInfo(key_id, tenant_id, label, time.time())
        self.store.add_key(self.hash_key(api_key), info)
        return info, api_key

    def revoke_key(self, key_id: str) -> ApiKeyInfo:
        info = self.store.remove_key(key_id)
        if info is None:
            raise NotFound(f"API key not found: {key_id}")
        with self._cache_lock:
            self._cache.clear()
        return info

    # -- requests ---------------------------------------------------------------------------------------

    def authenticate(self, api_key: str | None) -> Tenant:
        if not api_key:
            raise Unauthenticated("an API key is required (authorization: Bearer <key>, or x-api-key)")
        digest = self.hash_key(api_key)
        now = time.monotonic()
        version = self._current_version(now) if self.key_cache_s > 0 else 0
        with self._cache_lock:
            cached = self._cache.get(digest)
        if cached is not None and cached[0] > now and cached[1] == version:
            tenant = cached[2]
        else:
            info = self.store.key_by_hash(digest)
            tenant_or_none = self.store.get_tenant(info.tenant_id) if info is not None else None
            if tenant_or_none is None:
                raise Unauthenticated("invalid API key")
            tenant = tenant_or_none
            if self.key_cache_s > 0:
                with self._cache_lock:
                    if len(self._cache) > 10_000:
                        self._cache.clear()
                    # Tagged with the version read before the lookup: if the store changed meanwhile,
                    # the next check sees a newer version and the entry is never used.
                    self._cache[digest] = (now + self.key_cache_s, version, tenant)
        if tenant.disabled:
            raise PermissionDenied(f"tenant {tenant.tenant_id} is disabled")
        return tenant

    def _current_version(self, now: float) -> int:
        """The store's tenancy version, read at most every refresh_s; a change empties the cache."""
        with self._cache_lock:
            if now < self._version_due:
                return self._version
        version = self.store.version()
        with self._cache_lock:
            if version != self._version:
                self._cache.clear()
                self._version = version
            self._version_due = now + self.refresh_s
            return version

    def check_rate(self, tenant: Tenant, kind: str = "requests") -> None:
        limit = tenant.quota.requests_per_minute if kind == "requests" else tenant.quota.submits_per_minute
        if limit and self.store.hit(f"{tenant.tenant_id}:{kind}", 60) > limit:
            raise QuotaExceeded(
                f"rate limit: at most {limit} {kind} per minute for tenant {tenant.tenant_id}"
            )

    def admit(self, tenant: Tenant, job_id: str, device: int, *, unless_exists: bool = False) -> bool:
        """Reserves a concurrency slot for the job, or raises QuotaExceeded with the limit hit.

        False (and nothing reserved) when `unless_exists` and the job is already stored: a replay.
        """
        quota = tenant.quota
        got = self.store.reserve_job(
            tenant.tenant_id, job_id, quota.max_concurrent_jobs, unless_exists=unless_exists
        )
        if got is Reservation.EXISTS:
            return False
        if got is Reservation.FULL:
            raise QuotaExceeded(
                f"tenant {tenant.tenant_id} already runs {quota.max_concurrent_jobs} jobs (its limit); "
                "wait for one to finish or cancel one"
            )
        if device == jobs_pb2.DEVICE_CUDA and quota.gpu_seconds_per_month:
            used = self.usage.get(tenant.tenant_id, "gpu_seconds", period=_month())
            if used >= quota.gpu_seconds_per_month:
                self.release(tenant, job_id)
                raise QuotaExceeded(
                    f"GPU quota used: {used:.0f} of {quota.gpu_seconds_per_month:.0f} GPU-seconds this month"
                )
        return True

    def release(self, tenant: Tenant, job_id: str) -> None:
        self.store.release_job(tenant.tenant_id, job_id)

    def usage_of(self, tenant_id: str) -> dict[str, float]:
        return {
            "gpu_seconds": self.usage.get(tenant_id, "gpu_seconds", period=_month()),
            "active_jobs": float(len(self.store.active_jobs(tenant_id))),
        }


def _month() -> str:
    return usage_period()
