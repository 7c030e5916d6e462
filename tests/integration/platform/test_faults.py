"""Faults a production platform meets: workers killed mid-task, duplicate deliveries, S3 down for a while,
the gateway restarted, and cancel of running work. Each test runs its own platform (fake services)."""

import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import pytest

from stitchcuda.api.v1 import jobs_pb2
from stitchcuda.gateway.client import GatewayClient
from tests.conftest import problem_source
from tests.integration.platform.harness import Platform, make_tenant, platform_env, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def spec(rounds: int = 0) -> jobs_pb2.JobSpec:
    return jobs_pb2.JobSpec(
        problem_name="p01",
        reference_source=problem_source("01"),
        device=jobs_pb2.DEVICE_CPU,
        options=jobs_pb2.JobOptions(max_rounds=rounds),
    )


@pytest.fixture
def platform(seaweed: object, redis_db: object, tmp_path: Path) -> Iterator[Platform]:
    from tests.integration.platform.harness import flush_redis

    flush_redis().close()  # a fresh DB: this platform declares its own broker bindings
    p = Platform(platform_env(seaweed), tmp_path)  # type: ignore[arg-type]
    try:
        yield p
    finally:
        p.stop()


def markers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.glob("verify-*")) if folder.is_dir() else []


def verdict_events(client: GatewayClient, job_id: str) -> list[jobs_pb2.JobEvent]:
    return [e for e in client.watch(job_id) if e.kind == jobs_pb2.EVENT_KIND_VERDICT]


def test_kill_9_of_the_verifier_pool_process_mid_task_still_completes_the_job(
    platform: Platform, tmp_path: Path
):
    marks = tmp_path / "markers"
    platform.start_gateway()
    platform.start_worker("planner")
    platform.start_worker("coder")
    verifier = platform.start_worker(
        "verifier", env={"STITCH_FAKE_VERIFY_SLEEP_S": "6", "STITCH_FAKE_MARKERS": str(marks)}
    )
    key = make_tenant()
    with GatewayClient(platform.grpc_target, key) as client:
        job = client.submit(spec())
        wait_for(lambda: markers(marks), 60, "the verifier to start the task")
        pid = int(markers(marks)[0].split("-")[1])
        assert pid in verifier.children(), "the task runs in a pool process of the verifier worker"
        os.kill(pid, signal.SIGKILL)
        final = client.wait(job.job_id, timeout_s=90)
        assert final.status.state == jobs_pb2.JOB_STATE_SUCCEEDED, (final.status.message, platform.logs())
        runs = markers(marks)
        assert len(runs) == 2 and len({r.split("-")[1] for r in runs}) == 2, (
            runs
        )  # redelivered to a new process
        assert len(verdict_events(client, job.job_id)) == 1
        assert len(final.rounds) == 1


def test_kill_9_of_a_whole_verifier_worker_is_recovered_by_another_worker(seaweed: object, redis_db: object,
                                                                          tmp_path: Path):  # fmt: skip
    """The worker and its pool die together (a lost node): the message comes back after the visibility
    timeout (here shortened, with the time limits under it) and a second worker finishes the job."""
    short = {"STITCH_TIME_LIMIT_VERIFY_S": "10", "STITCH_TIME_LIMIT_BUILD_S": "10",
             "STITCH_TIME_LIMIT_PLANNER_S": "10", "STITCH_TIME_LIMIT_CODER_S": "10",
             "STITCH_TIME_LIMIT_JUDGE_S": "10", "STITCH_SOFT_LIMIT_MARGIN_S": "2",
             "STITCH_VISIBILITY_TIMEOUT_S": "16", "STITCH_RESTORE_INTERVAL_S": "2"}  # fmt: skip
    marks = tmp_path / "markers"
    platform = Platform(platform_env(seaweed, **short), tmp_path)  # type: ignore[arg-type]
    try:
        platform.start_gateway()
        platform.start_worker("planner")
        platform.start_worker("coder")
        env = {"STITCH_FAKE_VERIFY_SLEEP_S": "4", "STITCH_FAKE_MARKERS": str(marks)}
        first = platform.start_worker("verifier", env=env)
        with GatewayClient(platform.grpc_target, make_tenant()) as client:
            job = client.submit(spec())
            wait_for(lambda: markers(marks), 60, "the first verifier to start the task")
            first.signal_group(signal.SIGKILL)
            first.process.wait(10)  # type: ignore[union-attr]
            platform.start_worker("verifier", name="verifier-2", env=env)
            final = client.wait(job.job_id, timeout_s=120)
            assert final.status.state == jobs_pb2.JOB_STATE_SUCCEEDED, (final.status.message, platform.logs())
            assert len(markers(marks)) == 2
            assert len(verdict_events(client, job.job_id)) == 1
    finally:
        platform.stop()


def test_the_same_message_delivered_twice_gives_one_result(platform: Platform, tmp_path: Path):
    marks = tmp_path / "markers"
    platform.start_gateway()
    client_redis = __import__("redis").Redis.from_url(platform.env["STITCH_REDIS_URL"])
    with GatewayClient(platform.grpc_target, make_tenant()) as client:
        job = client.submit(spec(rounds=0))
        # Duplicate the planner's message and, later, the verifier's: byte-identical copies on the queue.
        wait_for(lambda: client_redis.llen("planner") == 1, 30, "the plan message")
        client_redis.lpush("planner", client_redis.lindex("planner", 0))
        platform.start_worker("planner")
        platform.start_worker("coder")
        wait_for(lambda: client_redis.llen("verifier.cpu") == 1, 60, "the verify message")
        client_redis.lpush("verifier.cpu", client_redis.lindex("verifier.cpu", 0))
        assert client_redis.llen("verifier.cpu") == 2
        platform.start_worker("verifier", env={"STITCH_FAKE_MARKERS": str(marks)})
        final = client.wait(job.job_id, timeout_s=60)
        wait_for(lambda: client_redis.llen("verifier.cpu") == 0, 30, "both copies consumed")
        time.sleep(1.0)
        assert final.status.state == jobs_pb2.JOB_STATE_SUCCEEDED
        events = list(client.watch(job.job_id))
        assert len([e for e in events if e.kind == jobs_pb2.EVENT_KIND_VERDICT]) == 1
        terminal = [e for e in events if e.kind == jobs_pb2.EVENT_KIND_STATE and e.stage == "succeeded"]
        assert len(terminal) == 1
        assert len(markers(marks)) == 1, "the second copy was recognised and not verified again"
        assert len(client.get(job.job_id).rounds) == 1
        for name in ("planner", "verifier"):
            assert "duplicate dropped" in platform.procs[name].tail(300), name


def test_s3_down_for_a_while_is_retried_and_the_job_completes(
    platform: Platform, seaweed: object, tmp_path: Path
):
    marks = tmp_path / "markers"
    platform.start_gateway()
    platform.start_worker("planner")
    platform.start_worker("coder")
    platform.start_worker(
        "verifier", env={"STITCH_FAKE_VERIFY_SLEEP_S": "3", "STITCH_FAKE_MARKERS": str(marks)}
    )
    key = make_tenant()
    http = httpx.Client(base_url=platform.http_url, headers={"x-api-key": key}, timeout=60)
    weed = seaweed
    with GatewayClient(platform.grpc_target, key) as client:
        try:
            weed.stop()  # type: ignore[attr-defined]
            # While S3 is down a submit that must store its reference fails cleanly (nothing is left
            # half-created) ...
            large = spec()
            large.reference_source += "\n#" + "#" * (70 * 1024) + "\n"  # above the inline size
            with pytest.raises(grpc.RpcError) as err:
                client.submit(large, retries=0)
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE
            body = {"spec": {"reference_source": large.reference_source}}
            response = http.post("/v1/jobs", json=body)
            assert response.status_code == 503 and response.json()["error"]["code"] == "unavailable"
            assert http.get("/readyz").status_code == 503
            assert http.get("/v1/jobs").json()["jobs"] == []
            # ... while a small one, kept in the job record, is accepted and waits for S3 in its workers.
            early = client.submit(spec(), retries=0)
        finally:
            weed.start()  # type: ignore[attr-defined]
        assert client.wait(early.job_id, timeout_s=120).status.state == jobs_pb2.JOB_STATE_SUCCEEDED
        # ... and a job whose verification finishes while S3 is down is retried until S3 is back.
        job = client.submit(spec())
        wait_for(
            lambda: len(markers(marks)) == 2, 60, "the verification to start"
        )  # the early job's is first
        try:
            weed.stop()  # type: ignore[attr-defined]
            time.sleep(8)
            assert client.get(job.job_id).status.state == jobs_pb2.JOB_STATE_VERIFYING
        finally:
            weed.start()  # type: ignore[attr-defined]
        final = client.wait(job.job_id, timeout_s=120)
        assert final.status.state == jobs_pb2.JOB_STATE_SUCCEEDED, (final.status.message, platform.logs())
        assert "unavailable" in platform.procs["verifier"].tail(400).lower()
        assert b"ModelNew" in client.download(job.job_id, "result")


def test_gateway_restart_keeps_jobs_and_events_and_watchers_resume(platform: Platform):
    platform.start_gateway()
    platform.start_worker("planner")
    platform.start_worker("coder")
    platform.start_worker("verifier", env={"STITCH_FAKE_VERIFY_SLEEP_S": "2"})
    key = make_tenant()
    with GatewayClient(platform.grpc_target, key) as client:
        job = client.submit(spec(rounds=2))
        seen: list[jobs_pb2.JobEvent] = []
        failure: list[BaseException] = []

        def follow() -> None:
            try:
                seen.extend(client.watch(job.job_id))
            except BaseException as exc:
                failure.append(exc)

        watcher = threading.Thread(target=follow)
        watcher.start()
        wait_for(lambda: any(e.kind == jobs_pb2.EVENT_KIND_VERDICT for e in seen), 60, "a first verdict")
        before = client.get(job.job_id)
        ports = (platform.grpc_port, platform.http_port)
        platform.procs["gateway"].signal_group(signal.SIGKILL)
        platform.procs["gateway"].process.wait(10)  # type: ignore[union-attr]
        platform.start_gateway(ports=ports)
        watcher.join(120)
        assert not watcher.is_alive() and not failure, failure
        final = client.get(job.job_id)
        assert final.job_id == before.job_id and final.created_at == before.created_at
        assert final.status.state == jobs_pb2.JOB_STATE_SUCCEEDED
        replay = list(client.watch(job.job_id))
        assert [e.seq for e in seen] == [e.seq for e in replay], "the watcher resumed without gaps or repeats"
        assert seen[-1].stage == "succeeded"


def test_cancel_stops_queued_and_running_work(platform: Platform, tmp_path: Path):
    marks = tmp_path / "markers"
    platform.start_gateway()
    platform.start_worker("planner")
    platform.start_worker("coder")
    verifier = platform.start_worker(
        "verifier", env={"STITCH_FAKE_VERIFY_SLEEP_S": "120", "STITCH_FAKE_MARKERS": str(marks)}
    )
    key = make_tenant()
    http = httpx.Client(base_url=platform.http_url, headers={"x-api-key": key}, timeout=30)
    body = {
        "spec": {
            "reference_source": problem_source("01"),
            "device": "DEVICE_CPU",
            "options": {"max_rounds": 0},
        }
    }
    first = http.post("/v1/jobs", json=body).json()["job_id"]
    wait_for(lambda: len(markers(marks)) == 1, 60, "the first job's verification to start")
    busy_pid = int(markers(marks)[0].split("-")[1])
    cancelled = http.post(f"/v1/jobs/{first}/cancel", json={"reason": "not needed"}).json()
    assert cancelled["status"]["state"] == "JOB_STATE_CANCELLED"
    assert "not needed" in cancelled["status"]["message"]
    # The running verification was terminated: a second job gets the (only) verifier slot at once.
    second = http.post("/v1/jobs", json=body).json()["job_id"]
    wait_for(lambda: len(markers(marks)) == 2, 30, "the second job's verification to start")
    assert busy_pid not in verifier.children()
    http.post(f"/v1/jobs/{second}/cancel")
    with GatewayClient(platform.grpc_target, key) as client:
        events = list(client.watch(first))
        assert events[-1].stage == "cancelled"
        assert not [e for e in events if e.kind == jobs_pb2.EVENT_KIND_VERDICT]
        assert client.get(first).status.state == jobs_pb2.JOB_STATE_CANCELLED
