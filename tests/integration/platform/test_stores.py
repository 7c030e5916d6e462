"""The Redis and S3 adapters against real servers: the JobStore contract, events, guards, locks, S3 retries."""

import threading
import time

import httpx
import pytest

from stitchcuda.api.v1 import jobs_pb2
from stitchcuda.gateway.tenancy import Quota, RedisTenantStore, Reservation, Tenancy
from stitchcuda.shared.errors import Conflict, InvalidRequest, NotFound, Unavailable
from stitchcuda.shared.redis_store import RedisJobStore, RedisMessageLedger, RedisUsageMeter, connect
from stitchcuda.shared.s3_store import S3ArtifactStore
from stitchcuda.shared.transport import CODER, PLANNER, VERIFIER_CPU, InProcessTransport
from stitchcuda.shared.workflow import Workflow
from tests.conftest import problem_source
from tests.integration.platform.harness import REDIS_URL

pytestmark = pytest.mark.integration


@pytest.fixture
def store(redis_db: object) -> RedisJobStore:
    return RedisJobStore(connect(REDIS_URL))


@pytest.fixture
def s3(seaweed: object) -> S3ArtifactStore:
    return S3ArtifactStore(seaweed.endpoint, seaweed.access_key, seaweed.secret_key, seaweed.bucket)  # type: ignore[attr-defined]


def job(job_id: str, tenant: str = "acme", key: str = "", ms: int = 0) -> jobs_pb2.Job:
    out = jobs_pb2.Job(job_id=job_id, tenant_id=tenant, spec=jobs_pb2.JobSpec(idempotency_key=key),
                       status=jobs_pb2.JobStatus(state=jobs_pb2.JOB_STATE_QUEUED))  # fmt: skip
    out.created_at.FromMilliseconds(ms or int(time.time() * 1000))
    return out


def test_jobs_create_get_put_and_idempotency(store: RedisJobStore):
    assert store.create(job("j1", key="k")).job_id == "j1"
    assert store.create(job("j2", key="k")).job_id == "j1"  # same tenant + key: the first job
    assert store.create(job("j3", tenant="other", key="k")).job_id == "j3"  # keys are per tenant
    with pytest.raises(Conflict):
        store.create(job("j1"))
    stored = store.get("j1")
    stored.status.state = jobs_pb2.JOB_STATE_CODING
    store.put(stored)
    assert store.get("j1").status.state == jobs_pb2.JOB_STATE_CODING
    assert store.state_of("j1") == jobs_pb2.JOB_STATE_CODING
    with pytest.raises(NotFound):
        store.get("missing")
    with pytest.raises(NotFound):
        store.put(job("missing"))
    store.save_state("j1", b'{"x": 1}')
    assert store.load_state("j1") == b'{"x": 1}' and store.load_state("j3") is None


def test_create_stores_the_first_events_and_loop_state_with_the_job_or_nothing(store: RedisJobStore):
    first = job("j1", key="k")
    events = [jobs_pb2.JobEvent(job_id="j1", message=m) for m in ("submitted", "planning")]
    assert store.create(first, events=events, loop_state=b'{"phase": "planning"}') is first
    assert [e.message for e in store.read_events("j1")] == ["submitted", "planning"]
    assert store.load_state("j1") == b'{"phase": "planning"}'
    # A replay of the key returns the stored job and writes nothing: no events, no state, no record.
    replay = store.create(job("j2", key="k"), events=[jobs_pb2.JobEvent(job_id="j2", message="x")],
                          loop_state=b"{}")  # fmt: skip
    assert replay.job_id == "j1" and replay is not first
    assert len(store.read_events("j1")) == 2 and store.load_state("j2") is None
    with pytest.raises(NotFound):
        store.get("j2")
    assert not store.redis.exists("stitch:job:j2:events")


def test_reservations_free_ended_jobs_at_the_limit_and_stay_bounded_without_one(store: RedisJobStore):
    tenants = RedisTenantStore(store.redis)
    for i in range(3):
        store.create(job(f"a{i}"))
        assert tenants.reserve_job("acme", f"a{i}", 3)
    store.create(job("a3"))
    assert not tenants.reserve_job("acme", "a3", 3)
    assert tenants.reserve_job("acme", "a0", 3)  # a job holding a slot may reserve it again
    ended = store.get("a1")
    ended.status.state = jobs_pb2.JOB_STATE_SUCCEEDED
    store.put(ended)
    assert tenants.reserve_job("acme", "a3", 3)  # the full sweep at the limit found a1 ended
    assert tenants.active_jobs("acme") == ["a0", "a2", "a3"]
    # Unlimited: each reservation checks a sample, so ended jobs do not pile up in the set.
    for i in range(200):
        store.create(job(f"u{i}", tenant="globex"))
        assert tenants.reserve_job("globex", f"u{i}", 0)
        ended = store.get(f"u{i}")
        ended.status.state = jobs_pb2.JOB_STATE_FAILED
        store.put(ended)
    assert len(tenants.active_jobs("globex")) < 100


def test_a_replay_of_a_stored_job_takes_no_slot_even_at_the_limit(store: RedisJobStore):
    tenants = RedisTenantStore(store.redis)
    store.create(job("r0"))
    assert tenants.reserve_job("acme", "r0", 1) is Reservation.RESERVED
    assert tenants.reserve_job("acme", "r1", 1) is Reservation.FULL
    assert tenants.reserve_job("acme", "r0", 1, unless_exists=True) is Reservation.EXISTS
    assert tenants.reserve_job("acme", "r1", 1, unless_exists=True) is Reservation.FULL  # not stored yet
    assert tenants.active_jobs("acme") == ["r0"]


def test_list_is_newest_first_pages_and_filters(store: RedisJobStore):
    for i in range(7):
        j = job(f"j{i}", ms=1_000 + i)
        j.status.state = jobs_pb2.JOB_STATE_SUCCEEDED if i % 2 else jobs_pb2.JOB_STATE_QUEUED
        store.create(j)
    store.create(job("x", tenant="other"))
    ids, token = [], ""
    while True:
        page, token = store.list_jobs("acme", limit=3, page_token=token)
        ids += [j.job_id for j in page]
        if not token:
            break
    assert ids == [f"j{i}" for i in reversed(range(7))]
    done, _ = store.list_jobs("acme", state=jobs_pb2.JOB_STATE_SUCCEEDED, limit=10)
    assert [j.job_id for j in done] == ["j5", "j3", "j1"]
    with pytest.raises(InvalidRequest):
        store.list_jobs("acme", page_token="x")  # another tenant's job id is no token here either


def test_events_stream_in_order_resume_and_wake_a_blocked_reader(store: RedisJobStore):
    store.create(job("j1"))
    seqs = [store.append_event(jobs_pb2.JobEvent(job_id="j1", message=f"m{i}")) for i in range(3)]
    events = store.read_events("j1")
    assert [e.message for e in events] == ["m0", "m1", "m2"] and [e.seq for e in events] == seqs
    assert [e.message for e in store.read_events("j1", after_seq=seqs[0])] == ["m1", "m2"]
    started = time.monotonic()
    assert store.read_events("j1", after_seq=seqs[-1], timeout_s=0.3) == []
    assert 0.25 < time.monotonic() - started < 2
    woke: list[float] = []

    def reader() -> None:
        got = store.read_events("j1", after_seq=seqs[-1], timeout_s=10)
        woke.append(time.monotonic())
        assert [e.message for e in got] == ["late"]

    thread = threading.Thread(target=reader)
    thread.start()
    time.sleep(0.3)
    sent = time.monotonic()
    store.append_event(jobs_pb2.JobEvent(job_id="j1", message="late"))
    thread.join(5)
    assert woke and woke[0] - sent < 0.1, "a blocked reader sees a new event within 100 ms"
    with pytest.raises(NotFound):
        store.read_events("nope")
    with pytest.raises(InvalidRequest):
        store.read_events("j1", after_seq="12; DROP")


def test_claim_is_once_and_the_job_lock_excludes(store: RedisJobStore):
    assert store.claim("plan:0") and not store.claim("plan:0") and store.claim("plan:1")
    inside: list[int] = []
    overlap: list[bool] = []

    def worker() -> None:
        for _ in range(20):
            with store.lock("j1"):
                inside.append(1)
                overlap.append(len(inside) > 1)
                time.sleep(0.002)
                inside.pop()

    threads = [threading.Thread(target=worker) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(overlap) == 60 and not any(overlap)
    with store.lock("j2"), pytest.raises(Unavailable, match="busy"):
        with store.lock("j2", timeout_s=0.2):
            pass
    short = RedisJobStore(store.redis, lock_lease_s=0.3)
    with short.lock("j3"):
        time.sleep(0.5)  # the lease expired: a dead holder does not block the job forever
        with short.lock("j3", timeout_s=0.5):
            pass


def test_redis_down_is_unavailable_quickly():
    dead = RedisJobStore(connect("redis://127.0.0.1:1/0"))
    started = time.monotonic()
    with pytest.raises(Unavailable):
        dead.get("j1")
    assert time.monotonic() - started < 10


def test_ledger_usage_and_tenants_on_redis(store: RedisJobStore):
    ledger = RedisMessageLedger(store.redis)
    assert [ledger.delivered("m1", 0) for _ in range(3)] == [1, 2, 3]
    assert ledger.delivered("m1", 1) == 1
    assert not ledger.is_done("m1")
    ledger.mark_done("m1")
    assert ledger.is_done("m1")
    usage = RedisUsageMeter(store.redis)
    usage.add("acme", "gpu_seconds", 1.5)
    usage.add("acme", "gpu_seconds", 2.0)
    assert usage.get("acme", "gpu_seconds") == 3.5 and usage.get("other", "gpu_seconds") == 0.0
    tenancy = Tenancy(RedisTenantStore(store.redis), usage, "s3cret", key_cache_s=0)
    tenant = tenancy.create_tenant("acme", quota=Quota(max_concurrent_jobs=1))
    info, key = tenancy.issue_key("acme")
    assert key.encode() not in b"".join(store.redis.get(k) or b"" for k in store.redis.scan_iter("stitch:*")
                                          if store.redis.type(k) == b"string")  # fmt: skip
    assert tenancy.authenticate(key).tenant_id == "acme"
    store.create(job("r1"))
    tenancy.admit(tenant, "r1", jobs_pb2.DEVICE_CPU)
    with pytest.raises(Exception, match="limit"):
        tenancy.admit(tenant, "r2", jobs_pb2.DEVICE_CPU)
    finished = store.get("r1")
    finished.status.state = jobs_pb2.JOB_STATE_FAILED
    store.put(finished)
    tenancy.admit(tenant, "r2", jobs_pb2.DEVICE_CPU)  # the Lua check read the job's final state
    assert [k.key_id for k in tenancy.store.list_keys("acme")] == [info.key_id]
    tenancy.revoke_key(info.key_id)
    assert tenancy.store.list_keys("acme") == []


def test_s3_store_round_trip_listing_presigning_and_not_found(s3: S3ArtifactStore):
    s3.put("tenants/acme/jobs/j1/a.txt", b"alpha", "text/plain")
    s3.put("tenants/acme/jobs/j1/rounds/000/b.pb", b"\x00\x01")
    s3.put("tenants/acme/jobs/j2/c.txt", b"gamma")
    assert s3.get("tenants/acme/jobs/j1/a.txt") == b"alpha"
    assert s3.exists("tenants/acme/jobs/j1/a.txt") and not s3.exists("tenants/acme/jobs/j1/zzz")
    assert s3.size("tenants/acme/jobs/j1/rounds/000/b.pb") == 2
    assert s3.list("tenants/acme/jobs/j1/") == [
        "tenants/acme/jobs/j1/a.txt",
        "tenants/acme/jobs/j1/rounds/000/b.pb",
    ]
    url = s3.presigned_url("tenants/acme/jobs/j1/a.txt", 60)
    assert httpx.get(url, timeout=10).content == b"alpha"
    tampered = url.replace("j1/a.txt", "j2/c.txt")
    assert httpx.get(tampered, timeout=10).status_code == 403  # the signature covers the key
    with pytest.raises(NotFound):
        s3.get("tenants/acme/jobs/j1/missing")
    s3.delete("tenants/acme/jobs/j1/a.txt")
    assert not s3.exists("tenants/acme/jobs/j1/a.txt")
    with pytest.raises(InvalidRequest):
        s3.put("tenants/acme/../globex/x", b"")


def test_s3_unreachable_is_unavailable_after_a_bounded_retry():
    from stitchcuda.gateway.local import free_port

    dead = S3ArtifactStore(f"127.0.0.1:{free_port()}", "k", "s", "bucket", attempts=3, backoff_s=0.05)
    started = time.monotonic()
    with pytest.raises(Unavailable, match=r"unavailable"):
        dead.get("tenants/a/jobs/b/c")
    assert time.monotonic() - started < 5


def test_the_workflow_runs_a_job_on_the_redis_and_s3_adapters(store: RedisJobStore, s3: S3ArtifactStore):
    """The lead's Workflow over these adapters (queues in process): the same loop as the platform's."""
    from stitchcuda.shared.envelope import decode
    from tests.integration.platform.fakes import FakePlanner, FakeVerifier, candidate

    transport = InProcessTransport()
    flow = Workflow(store, s3, transport)
    transport.register(PLANNER, lambda d: flow.record_plan(decode(d), FakePlanner().plan("")))
    transport.register(CODER, lambda d: flow.record_candidates(decode(d), [candidate(decode(d).round)]))
    transport.register(VERIFIER_CPU, lambda d: flow.record_verdict(
        decode(d), decode(d).candidate_index, FakeVerifier().verify("", candidate(decode(d).round))))  # fmt: skip
    spec = jobs_pb2.JobSpec(reference_source=problem_source("01"), device=jobs_pb2.DEVICE_CPU,
                            options=jobs_pb2.JobOptions(max_rounds=2))  # fmt: skip
    submitted = flow.submit(spec, "acme")
    transport.drain()
    final = store.get(submitted.job_id)
    assert final.status.state == jobs_pb2.JOB_STATE_SUCCEEDED
    assert len(final.rounds) == 3
    assert s3.exists(final.artifacts["model_new.py"]) and s3.exists(final.artifacts["report.html"])
    kinds = [e.kind for e in store.read_events(final.job_id)]
    assert kinds.count(jobs_pb2.EVENT_KIND_VERDICT) == 3
