"""A client that leaves an event stream early costs the gateway one debug line, not a page of warnings.

The gateway runs as its own process on the test's Redis DB (no workers, local artifacts); the job's
event stream holds a long backlog, so the client goes away while the gateway is still writing it.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from stitchcuda.api.v1 import jobs_pb2
from stitchcuda.gateway.local import free_port
from stitchcuda.shared.redis_store import RedisJobStore
from tests.integration.platform.harness import REDIS_URL, SECRET, Proc, make_tenant, wait_for

pytestmark = pytest.mark.integration

BACKLOG = 3000
REFERENCE = Path(__file__).resolve().parents[3] / "benchmarks" / "problems" / "01_elementwise_chain.py"


@pytest.fixture
def gateway(redis_db: object, tmp_path: Path) -> Iterator[tuple[str, Proc]]:
    http_port, grpc_port = free_port(), free_port()
    env = {
        **os.environ,
        "STITCH_ENVIRONMENT": "test",
        "STITCH_JOB_STORE": "redis",
        "STITCH_REDIS_URL": REDIS_URL,
        "STITCH_ARTIFACT_STORE": "local",
        "STITCH_HOME": str(tmp_path / "home"),
        "STITCH_SECRET_KEY": SECRET,
        "STITCH_KEY_CACHE_S": "0",
        "STITCH_LOG_LEVEL": "DEBUG",
        "STITCH_WATCH_WAIT_S": "0.5",
        "PYTHONUNBUFFERED": "1",
    }
    args = ["--host", "127.0.0.1", "--grpc-port", str(grpc_port), "--http-port", str(http_port)]
    proc = Proc("gateway", [sys.executable, "-m", "stitchcuda.gateway", *args], env, tmp_path / "gateway.log")
    proc.start()
    url = f"http://127.0.0.1:{http_port}"

    def ready() -> bool:
        assert proc.alive(), proc.tail()
        try:
            return httpx.get(f"{url}/readyz", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_for(ready, 60, "the gateway")
        yield url, proc
    finally:
        proc.stop()


def _job_with_backlog(url: str, key: str) -> str:
    body = {"spec": {"reference_source": REFERENCE.read_text(), "device": "DEVICE_CPU"}}
    response = httpx.post(f"{url}/v1/jobs", headers={"x-api-key": key}, json=body, timeout=30)
    assert response.status_code == 200, response.text
    job_id = str(response.json()["job_id"])
    # No worker takes the job: these progress events are its whole history, read in one poll.
    store = RedisJobStore.from_url(REDIS_URL)
    pipe = store.redis.pipeline(transaction=False)
    for n in range(BACKLOG):
        event = jobs_pb2.JobEvent(job_id=job_id, message=f"progress {n} " + "x" * 200)
        pipe.xadd(store._events(job_id), {"pb": event.SerializeToString()})
    pipe.execute()
    return job_id


def test_a_client_closing_the_event_stream_is_one_debug_line(gateway: tuple[str, Proc]) -> None:
    url, proc = gateway
    key = make_tenant("acme")
    job_id = _job_with_backlog(url, key)
    closes = 3
    for _ in range(closes):
        with (
            httpx.Client(timeout=10) as client,
            client.stream("GET", f"{url}/v1/jobs/{job_id}/events", headers={"x-api-key": key}) as stream,
        ):
            assert stream.status_code == 200
            assert next(stream.iter_raw()).startswith(b"retry:")
        # Leaving the block closes the connection with most of the backlog still unsent.

    def closed_lines() -> list[str]:
        return [line for line in proc.tail(100_000).splitlines() if "closed by the client" in line]

    wait_for(lambda: len(closed_lines()) >= closes, 20, "the gateway to notice the closed streams")
    time.sleep(1.0)  # writes after a close would be logged by now
    log = proc.tail(100_000)
    assert "socket.send() raised exception" not in log, log[-4000:]
    assert "Traceback" not in log and "Exception" not in log, log[-4000:]
    assert len(closed_lines()) == closes, closed_lines()
    assert all(line.startswith("DEBUG stitchcuda.gateway.http") for line in closed_lines())
    # The gateway still serves the stream from the start to a client that stays.
    with (
        httpx.Client(timeout=10) as client,
        client.stream("GET", f"{url}/v1/jobs/{job_id}/events", headers={"x-api-key": key}) as stream,
    ):
        seen = 0
        for line in stream.iter_lines():
            seen += line.startswith("id: ")
            if seen >= BACKLOG:
                break
    assert seen >= BACKLOG
