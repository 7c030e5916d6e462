"""A gateway of several processes sharing its ports: every process serves, jobs run, stop ends them all."""

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from stitchcuda.api.v1 import jobs_pb2
from stitchcuda.gateway.client import GatewayClient
from tests.conftest import problem_source
from tests.integration.platform.harness import Platform, flush_redis, make_tenant, platform_env, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture
def platform(seaweed: object, redis_db: object, tmp_path: Path) -> Iterator[Platform]:
    flush_redis().close()
    p = Platform(platform_env(seaweed, STITCH_GATEWAY_PROCESSES="2"), tmp_path)  # type: ignore[arg-type]
    try:
        yield p
    finally:
        p.stop()


def test_two_gateway_processes_share_the_ports_and_both_serve(platform: Platform):
    gateway = platform.start_gateway()
    platform.start_worker("planner")
    platform.start_worker("coder")
    platform.start_worker("verifier")
    wait_for(lambda: len(gateway.children()) == 1, 60, "the second gateway process")
    [sibling] = gateway.children()
    key = make_tenant()
    spec = jobs_pb2.JobSpec(reference_source=problem_source("01"), device=jobs_pb2.DEVICE_CPU,
                            options=jobs_pb2.JobOptions(max_rounds=0))  # fmt: skip
    # Each new connection is handed to one of the processes; a few dozen reach both.
    served: set[str] = set()
    job_ids = []
    for _ in range(24):
        with GatewayClient(platform.grpc_target, key) as client:
            job_ids.append(client.submit(spec).job_id)
        with httpx.Client(base_url=platform.http_url, headers={"x-api-key": key}) as http:
            served.add(http.get("/healthz").json()["process"])
    assert served == {str(gateway.process.pid), str(sibling)}  # type: ignore[union-attr]
    with GatewayClient(platform.grpc_target, key) as client:
        for job_id in job_ids:
            assert client.wait(job_id, timeout_s=120).status.state == jobs_pb2.JOB_STATE_SUCCEEDED
    gateway.stop()
    wait_for(lambda: not Path(f"/proc/{sibling}").exists(), 30, "the second process to stop")
