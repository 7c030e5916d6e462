"""Admission of jobs: a bound on the platform's running jobs, filled round-robin across tenants' waiting jobs.

A job that arrives while every running slot is taken (or while other jobs wait) waits in its tenant's
list; a freed slot goes to the tenant whose turn is next, so one tenant's backlog of hundreds of jobs
delays another tenant's job by at most one slot per tenant with waiting jobs, instead of the whole
backlog. Slots are released by whoever ends the job (the Workflow, on every terminal path), together
with the job's place in its tenant's active set (the concurrency quota); a sweep repairs what a crashed
process left behind.

Keys (prefix `stitch:`):
  tenant:<t>:active        sorted set: the tenant's queued and running job ids, by reservation time
  admission:running        sorted set: job ids holding a running slot, by admission time
  admission:waiting:<t>    list: the tenant's job ids waiting for a slot, oldest first
  admission:turns          sorted set: tenants with waiting jobs, by their next turn
  admission:turn           the last turn handed out (a counter)
  admission:capacity       running slots of the platform (missing or 0: unbounded)
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from stitchcuda.shared.redis_store import PREFIX, unavailable_on_error

log = logging.getLogger("stitchcuda.admission")

QUEUED = 1
TERMINAL = frozenset({5, 6, 7})  # JOB_STATE_SUCCEEDED, _FAILED, _CANCELLED
# A place whose job record never appeared (a gateway died between reserving and storing it) is freed
# after this; a job taken for dispatch but still queued this long (its dispatcher died) is started again.
GRACE_S = 120.0
STUCK_S = 10.0
# Most jobs one dispatch call starts (the rest go on the next call).
_TAKE_MAX = 64


def active_key(tenant_id: str, prefix: str = PREFIX) -> str:
    """The tenant's active set (queued and running jobs), which its concurrency quota counts."""
    return f"{prefix}tenant:{tenant_id}:active"


@dataclass(frozen=True)
class Sweep:
    """What a sweep repaired: places released, and jobs that hold a slot but never started."""

    released: int
    stuck: list[str]


class Admission(Protocol):
    def set_capacity(self, running_jobs: int) -> None:
        """The platform's running slots (0: unbounded); every process reads the current value."""
        ...

    def arrive(self, tenant_id: str, job_id: str) -> bool:
        """True when the job takes a running slot at once: one is free and no job waits for one."""
        ...

    def enqueue(self, tenant_id: str, job_id: str) -> None:
        """The job (already stored, in its queued state) waits for a slot behind its tenant's others."""
        ...

    def take(self) -> list[str]:
        """Moves waiting jobs to free running slots, one tenant's turn at a time; returns their ids."""
        ...

    def finish(self, tenant_id: str, job_id: str) -> None:
        """The job ended: it leaves its running slot, its tenant's active set and the waiting list."""
        ...

    def waiting(self, tenant_id: str) -> int: ...

    def running(self) -> list[str]: ...

    def sweep(self) -> Sweep:
        """Releases every place held by a job that ended or never appeared."""
        ...


class MemoryAdmission:
    """One process's admission (tests, embedded use); `state_of` reads a job's state (0: no such job)."""

    def __init__(self, state_of: Callable[[str], int], running_jobs: int = 0) -> None:
        self._state_of = state_of
        self._capacity = running_jobs
        self._running: dict[str, float] = {}
        self._waiting: dict[str, deque[str]] = {}
        self._turns: OrderedDict[str, None] = OrderedDict()  # tenants with waiting jobs, next first
        self._lock = threading.Lock()

    def set_capacity(self, running_jobs: int) -> None:
        with self._lock:
            self._capacity = running_jobs

    def _full(self) -> bool:
        return bool(self._capacity) and len(self._running) >= self._capacity

    def arrive(self, tenant_id: str, job_id: str) -> bool:
        with self._lock:
            if self._turns or self._full() or self._state_of(job_id):
                return False
            self._running[job_id] = time.time()
            return True

    def enqueue(self, tenant_id: str, job_id: str) -> None:
        with self._lock:
            self._waiting.setdefault(tenant_id, deque()).append(job_id)
            self._turns.setdefault(tenant_id)

    def take(self) -> list[str]:
        out: list[str] = []
        with self._lock:
            while self._turns and not self._full() and len(out) < _TAKE_MAX:
                tenant_id, _ = self._turns.popitem(last=False)
                queue = self._waiting[tenant_id]
                job_id = queue.popleft()
                if queue:
                    self._turns[tenant_id] = None  # back of the line
                else:
                    del self._waiting[tenant_id]
                if self._state_of(job_id) == QUEUED:
                    self._running[job_id] = time.time()
                    out.append(job_id)
        return out

    def finish(self, tenant_id: str, job_id: str) -> None:
        with self._lock:
            self._running.pop(job_id, None)
            queue = self._waiting.get(tenant_id)
            if queue is not None and job_id in queue:
                queue.remove(job_id)
                if not queue:
                    del self._waiting[tenant_id]
                    self._turns.pop(tenant_id, None)

    def waiting(self, tenant_id: str) -> int:
        with self._lock:
            return len(self._waiting.get(tenant_id, ()))

    def running(self) -> list[str]:
        with self._lock:
            return sorted(self._running)

    def sweep(self) -> Sweep:
        now, released, stuck = time.time(), 0, []
        with self._lock:
            for job_id, since in list(self._running.items()):
                state = self._state_of(job_id)
                if state in TERMINAL or (not state and now - since > GRACE_S):
                    del self._running[job_id]
                    released += 1
                elif state == QUEUED and now - since > STUCK_S:
                    stuck.append(job_id)
        return Sweep(released, stuck)


_ARRIVE = """
if redis.call('EXISTS', KEYS[4]) == 1 then return 0 end
local cap = tonumber(redis.call('GET', KEYS[3]) or '0') or 0
if redis.call('ZCARD', KEYS[2]) == 0 and (cap <= 0 or redis.call('ZCARD', KEYS[1]) < cap) then
  redis.call('ZADD', KEYS[1], ARGV[2], ARGV[1])
  return 1
end
return 0
"""

_ENQUEUE = """
redis.call('RPUSH', KEYS[1], ARGV[1])
if not redis.call('ZSCORE', KEYS[2], ARGV[2]) then
  redis.call('ZADD', KEYS[2], redis.call('INCR', KEYS[3]), ARGV[2])
end
"""

# A tenant whose turn it is gives up its oldest waiting job and goes to the back of the line if it has
# more; jobs that ended while waiting (cancelled) are skipped.
_TAKE = """
local cap = tonumber(redis.call('GET', KEYS[4]) or '0') or 0
local out, pops = {}, 0
while #out < tonumber(ARGV[3]) and pops < 1000 do
  if cap > 0 and redis.call('ZCARD', KEYS[1]) >= cap then break end
  local head = redis.call('ZPOPMIN', KEYS[2])
  if #head == 0 then break end
  local waiting = ARGV[1] .. 'admission:waiting:' .. head[1]
  local job = redis.call('LPOP', waiting)
  pops = pops + 1
  if redis.call('LLEN', waiting) > 0 then
    redis.call('ZADD', KEYS[2], redis.call('INCR', KEYS[3]), head[1])
  end
  if job and redis.call('HGET', ARGV[1] .. 'job:' .. job, 'state') == '1' then
    redis.call('ZADD', KEYS[1], ARGV[2], job)
    out[#out + 1] = job
  end
end
return out
"""

_FINISH = """
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('LREM', KEYS[3], 0, ARGV[1])
if redis.call('LLEN', KEYS[3]) == 0 then redis.call('ZREM', KEYS[4], ARGV[2]) end
"""

# One sorted set (a tenant's active set or the running slots): members whose job ended, or never
# appeared within the grace, are removed; running members still queued after STUCK_S are returned.
_SWEEP_SET = """
local now, grace, stuck_s = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local members = redis.call('ZRANGE', KEYS[1], 0, -1, 'WITHSCORES')
local released, stuck = 0, {}
for i = 1, #members, 2 do
  local id, since = members[i], tonumber(members[i + 1])
  local state = redis.call('HGET', ARGV[1] .. 'job:' .. id, 'state')
  if state == '5' or state == '6' or state == '7' or ((not state) and now - since > grace) then
    redis.call('ZREM', KEYS[1], id)
    released = released + 1
  elseif state == '1' and stuck_s > 0 and now - since > stuck_s then
    stuck[#stuck + 1] = id
  end
end
return {released, stuck}
"""

# A tenant's waiting list: ids of jobs that are no longer queued leave it (and the tenant's turn with it
# when it empties); a tenant with waiting jobs but no turn (a lost write) gets one.
_SWEEP_WAITING = """
local released = 0
for _, id in ipairs(redis.call('LRANGE', KEYS[1], 0, -1)) do
  if redis.call('HGET', ARGV[1] .. 'job:' .. id, 'state') ~= '1' then
    released = released + redis.call('LREM', KEYS[1], 0, id)
  end
end
if redis.call('LLEN', KEYS[1]) == 0 then
  redis.call('ZREM', KEYS[2], ARGV[2])
elseif not redis.call('ZSCORE', KEYS[2], ARGV[2]) then
  redis.call('ZADD', KEYS[2], redis.call('INCR', KEYS[3]), ARGV[2])
end
return released
"""


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class RedisAdmission:
    """The platform's admission: every gateway and worker process shares it through Redis."""

    def __init__(self, client: Any, *, prefix: str = PREFIX) -> None:
        self.redis = client
        self.prefix = prefix
        self._running = f"{prefix}admission:running"
        self._turns = f"{prefix}admission:turns"
        self._turn = f"{prefix}admission:turn"
        self._capacity = f"{prefix}admission:capacity"
        self._arrive = client.register_script(_ARRIVE)
        self._enqueue = client.register_script(_ENQUEUE)
        self._take = client.register_script(_TAKE)
        self._finish = client.register_script(_FINISH)
        self._sweep_set = client.register_script(_SWEEP_SET)
        self._sweep_waiting = client.register_script(_SWEEP_WAITING)

    def _waiting(self, tenant_id: str) -> str:
        return f"{self.prefix}admission:waiting:{tenant_id}"

    @unavailable_on_error
    def set_capacity(self, running_jobs: int) -> None:
        self.redis.set(self._capacity, int(running_jobs))

    @unavailable_on_error
    def arrive(self, tenant_id: str, job_id: str) -> bool:
        keys = [self._running, self._turns, self._capacity, f"{self.prefix}job:{job_id}"]
        return bool(int(self._arrive(keys=keys, args=[job_id, time.time()])))

    @unavailable_on_error
    def enqueue(self, tenant_id: str, job_id: str) -> None:
        self._enqueue(keys=[self._waiting(tenant_id), self._turns, self._turn], args=[job_id, tenant_id])

    @unavailable_on_error
    def take(self) -> list[str]:
        keys = [self._running, self._turns, self._turn, self._capacity]
        return [_text(j) for j in self._take(keys=keys, args=[self.prefix, time.time(), _TAKE_MAX])]

    @unavailable_on_error
    def finish(self, tenant_id: str, job_id: str) -> None:
        keys = [active_key(tenant_id, self.prefix), self._running, self._waiting(tenant_id), self._turns]
        self._finish(keys=keys, args=[job_id, tenant_id])

    @unavailable_on_error
    def waiting(self, tenant_id: str) -> int:
        return int(self.redis.llen(self._waiting(tenant_id)))

    @unavailable_on_error
    def running(self) -> list[str]:
        return sorted(_text(j) for j in self.redis.zrange(self._running, 0, -1))

    @unavailable_on_error
    def sweep(self) -> Sweep:
        released, stuck = 0, []
        now = time.time()
        sets = [self._running, *(_text(k) for k in self.redis.scan_iter(active_key("*", self.prefix)))]
        for key in sets:
            stuck_s = STUCK_S if key == self._running else 0
            count, ids = self._sweep_set(keys=[key], args=[self.prefix, now, GRACE_S, stuck_s])
            released += int(count)
            stuck += [_text(i) for i in ids]
        waiting_prefix = self._waiting("")
        for key in self.redis.scan_iter(waiting_prefix + "*"):
            tenant_id = _text(key)[len(waiting_prefix) :]
            keys = [_text(key), self._turns, self._turn]
            released += int(self._sweep_waiting(keys=keys, args=[self.prefix, tenant_id]))
        return Sweep(released, stuck)
