"""Tenancy admin on the real platform: counts that return to zero however jobs end, a sweep that repairs
what a crash left, fair admission under one tenant's flood, and admin changes seen by every gateway
process within a second."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis
from typer.testing import CliRunner

from stitchcuda.api.v1 import jobs_pb2
from stitchcuda.gateway.admin import app as admin_app
from stitchcuda.gateway.admin import open_tenancy
from stitchcuda.gateway.settings import GatewaySettings
from stitchcuda.shared.admission import RedisAdmission, active_key
from stitchcuda.shared.redis_store import RedisJobStore
from tests.conftest import problem_source
from tests.integration.platform.harness import (
    REDIS_URL,
    SECRET,
    Platform,
    flush_redis,
    make_tenant,
    platform_env,
    wait_for,
)

pytestmark = pytest.mark.integration

SLOTS = 2
TERMINAL = {"JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED", "JOB_STATE_CANCELLED"}


@pytest.fixture(scope="module")
def platform(seaweed: object, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Platform]:
    """Two running slots, one verifier process whose verifications take 0.15 s, a fast admission sweep."""
    flush_redis()
    env = platform_env(seaweed, STITCH_MAX_RUNNING_JOBS=str(SLOTS), STITCH_ADMISSION_SWEEP_S="0.5",  # type: ignore[arg-type]
                       STITCH_ADMISSION_DISPATCH_S="0.2")  # fmt: skip
    platform = Platform(env, Path(tmp_path_factory.mktemp("tenancy")))
    try:
        platform.start_gateway()
        platform.start_worker("planner", env={"STITCH_FAKE_PLAN_FAIL_PREFIX": "fail-"})
        platform.start_worker("coder")
        platform.start_worker("verifier", env={"STITCH_FAKE_VERIFY_SLEEP_S": "0.15"})
        yield platform
    except BaseException:
        print(platform.logs())
        raise
    finally:
        platform.stop()


@pytest.fixture
def store() -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(REDIS_URL)
    yield client
    client.close()


def body(name: str = "p01") -> dict[str, object]:
    return {"spec": {"problem_name": name, "reference_source": problem_source("01"), "device": "DEVICE_CPU",
                     "options": {"max_rounds": 0}}}  # fmt: skip


def http(platform: Platform, key: str) -> httpx.Client:
    return httpx.Client(base_url=platform.http_url, headers={"x-api-key": key}, timeout=30)


def states(client: httpx.Client, job_ids: list[str]) -> dict[str, str]:
    return {j: client.get(f"/v1/jobs/{j}").json()["status"]["state"] for j in job_ids}


def counts(store: redis.Redis, tenant_id: str) -> tuple[int, int, int]:
    """(the tenant's active jobs, its waiting jobs, the platform's running slots taken)."""
    admission = RedisAdmission(store)
    return int(store.zcard(active_key(tenant_id))), admission.waiting(tenant_id), len(admission.running())


def test_counts_return_to_zero_on_every_ending_and_the_sweep_repairs_a_crash(
    platform: Platform, store: redis.Redis, monkeypatch: pytest.MonkeyPatch
):
    key = make_tenant("leaky", max_concurrent_jobs=10)
    with http(platform, key) as client:
        ids = [client.post("/v1/jobs", json=body(name)).json()["job_id"] for name in ("ok-1", "ok-2")]
        queued = client.post("/v1/jobs", json=body("cancel-me")).json()
        assert queued["status"]["state"] == "JOB_STATE_QUEUED"  # both slots are taken
        assert client.post(f"/v1/jobs/{queued['job_id']}/cancel", json={}).status_code == 200
        ids.append(client.post("/v1/jobs", json=body("fail-1")).json()["job_id"])
        running = client.post("/v1/jobs", json=body("cancel-later")).json()["job_id"]
        wait_for(lambda: states(client, [running])[running] != "JOB_STATE_QUEUED", 10, "a job to start")
        assert client.post(f"/v1/jobs/{running}/cancel", json={}).status_code == 200
        ids += [queued["job_id"], running]
        wait_for(lambda: set(states(client, ids).values()) <= TERMINAL, 20, "every job to end")
        final = states(client, ids)
        assert sorted(final.values()) == sorted(["JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED", "JOB_STATE_SUCCEEDED",
                                                 "JOB_STATE_CANCELLED", "JOB_STATE_CANCELLED"])  # fmt: skip
        # Released by whoever ended each job, not by a later sweep or submit.
        wait_for(lambda: counts(store, "leaky") == (0, 0, 0), 0.5, "every place to be released", 0.05)

        # A crash: a worker died after the job ended but before it released its places, and a gateway
        # died between reserving a job and storing it. Both hold the platform's two slots.
        dead = ids[0]
        store.zadd(active_key("leaky"), {dead: time.time(), "ghost": time.time() - 3600})
        store.zadd("stitch:admission:running", {dead: time.time(), "ghost": time.time() - 3600})
        assert counts(store, "leaky") == (2, 0, 2)
        waiting = client.post("/v1/jobs", json=body("after-crash")).json()["job_id"]
        # The gateway's sweep releases both places and the waiting job runs.
        wait_for(
            lambda: states(client, [waiting])[waiting] == "JOB_STATE_SUCCEEDED", 10, "the job after the crash"
        )
        wait_for(lambda: counts(store, "leaky") == (0, 0, 0), 1, "the repaired counts")

    monkeypatch.setenv("STITCH_REDIS_URL", REDIS_URL)
    monkeypatch.setenv("STITCH_SECRET_KEY", SECRET)
    listed = CliRunner().invoke(admin_app, ["tenant", "list"], env={"COLUMNS": "80"})
    assert listed.exit_code == 0, listed.output
    row = next(line for line in listed.stdout.splitlines() if "leaky" in line)
    cells = [c.strip() for c in row.strip("│┃ ").split("│")]
    assert cells[:5] == ["leaky", "enabled", "10", "0", "0"], row
    assert max(len(line) for line in listed.stdout.splitlines()) <= 80


def test_a_tenants_one_job_starts_within_a_few_slots_of_another_tenants_flood(
    platform: Platform, store: redis.Redis
):
    flood_key, late_key = make_tenant("flood", max_concurrent_jobs=0), make_tenant("late")
    with http(platform, flood_key) as flood, http(platform, late_key) as late:
        flooded = [flood.post("/v1/jobs", json=body()).json()["job_id"] for _ in range(40)]
        submitted_at = time.time()
        job_id = late.post("/v1/jobs", json=body()).json()["job_id"]
        assert counts(store, "flood")[1] >= 30  # the flood is still waiting
        wait_for(lambda: states(late, [job_id])[job_id] == "JOB_STATE_SUCCEEDED", 20, "the late tenant's job")
        jobs = RedisJobStore(store)

        def verified_at(jid: str) -> float:
            events = jobs.read_events(jid)
            return min((e.at.ToNanoseconds() / 1e9 for e in events if e.kind == jobs_pb2.EVENT_KIND_VERDICT),
                       default=float("inf"))  # fmt: skip

        late_verified = verified_at(job_id)
        # Verifications of the flood that took the verifier between the late submit and its own.
        ahead = sum(submitted_at < verified_at(j) < late_verified for j in flooded)
        print(
            f"flood verifications between the late submit and its verdict: {ahead} (of {len(flooded)} queued)"
        )
        assert ahead <= 2 * SLOTS, ahead
        for jid in flooded:
            flood.post(f"/v1/jobs/{jid}/cancel", json={})
        wait_for(lambda: set(states(flood, flooded).values()) <= TERMINAL, 20, "the flood to end")
        wait_for(lambda: counts(store, "flood") == (0, 0, 0), 1, "the flood's places to be released")


def _status(url: str, key: str, method: str = "GET") -> int:
    if method == "POST":
        return httpx.post(f"{url}/v1/jobs", json=body(), headers={"x-api-key": key}, timeout=10).status_code
    return httpx.get(f"{url}/v1/jobs", headers={"x-api-key": key}, timeout=10).status_code


def _seen_within(urls: list[str], key: str, expected: int, method: str = "GET") -> float:
    """Seconds until every gateway answers `expected` (polled every 20 ms), at most 3 s."""
    start = time.monotonic()
    pending = list(urls)
    while pending and time.monotonic() - start < 3:
        pending = [u for u in pending if _status(u, key, method) != expected]
        if pending:
            time.sleep(0.02)
    assert not pending, f"{pending} still answer otherwise than {expected}"
    return time.monotonic() - start


def test_disable_revoke_and_quota_reach_every_gateway_process_within_a_second(
    platform: Platform, tmp_path: Path
):
    # A second gateway process with the production key cache, far longer than the test: only the
    # invalidation can make a change visible. The module's gateway caches the same way.
    env = {**platform.env, "STITCH_KEY_CACHE_S": "3600"}
    (tmp_path / "first").mkdir()
    first, other = Platform(env, tmp_path / "first"), Platform(env, tmp_path)
    try:
        other.start_gateway()
        first.start_gateway()
        urls = [first.http_url, other.http_url]
        key = make_tenant("admin-target")
        assert all(_status(u, key) == 200 for u in urls)  # both have the key cached now
        tenancy = open_tenancy(GatewaySettings(redis_url=REDIS_URL, secret_key=SECRET))
        seen = {}
        tenancy.set_disabled("admin-target", True)
        seen["disable"] = _seen_within(urls, key, 403)
        tenancy.set_disabled("admin-target", False)
        seen["enable"] = _seen_within(urls, key, 200)
        tenancy.set_quota("admin-target", requests_per_minute=1)
        seen["quota"] = _seen_within(urls, key, 429)
        tenancy.set_quota("admin-target", requests_per_minute=0)
        seen["quota back"] = _seen_within(urls, key, 200)
        (info,) = tenancy.store.list_keys("admin-target")
        tenancy.revoke_key(info.key_id)
        seen["revoke"] = _seen_within(urls, key, 401)
        print("seconds until both gateways saw the change:", {k: round(v, 3) for k, v in seen.items()})
        assert max(seen.values()) < 1.0, seen
    finally:
        first.stop()
        other.stop()
