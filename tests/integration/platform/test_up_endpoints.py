"""`stitchcuda up` prints every endpoint once they all serve: gateway gRPC and HTTP, each /metrics."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import grpc
import httpx
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from stitchcuda.gateway.local import SeaweedS3
from tests.integration.platform.harness import REDIS_URL, REPO, SECRET, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_up_prints_each_endpoint_and_each_one_answers(
    seaweed: SeaweedS3, redis_db: object, tmp_path: Path
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STITCH_")}
    env.update(seaweed.env(), STITCH_REDIS_URL=REDIS_URL, STITCH_HOME=str(tmp_path / "home"),
               STITCH_SECRET_KEY=SECRET, PYTHONUNBUFFERED="1", PYTHONPATH=str(REPO))  # fmt: skip
    log = tmp_path / "up.log"
    # Port 0: `up` picks free ports itself, and the banner must name the ones it picked.
    command = [sys.executable, "-m", "stitchcuda.cli", "up", "--grpc-port", "0", "--http-port", "0"]
    with log.open("wb") as handle:
        process = subprocess.Popen(command, env=env, stdout=handle, stderr=subprocess.STDOUT, cwd=REPO)
    try:
        wait_for(lambda: "Ctrl-C stops" in log.read_text() or process.poll() is not None, 180, "the banner")
        output = log.read_text()
        assert process.poll() is None, output[-4000:]
        grpc_target = re.search(r"gateway gRPC: (\S+:\d+)\n", output)
        http_url = re.search(r"gateway HTTP: (http://\S+:\d+) ", output)
        metrics = dict(re.findall(r"metrics of ([\w-]+): (http://\S+/metrics)\n", output))
        assert grpc_target and http_url, output[-3000:]
        assert not grpc_target.group(1).endswith(":0") and not http_url.group(1).endswith(":0")
        assert sorted(metrics) == ["coder", "gateway", "planner", "verifier"], output[-3000:]
        assert f"S3: {seaweed.endpoint}" in output and "Redis: redis://127.0.0.1:6379/" in output
        # Printed once everything serves: nothing to wait for after the banner.
        assert httpx.get(f"{http_url.group(1)}/readyz", timeout=5).status_code == 200
        for name, url in metrics.items():
            assert httpx.get(url, timeout=5).status_code == 200, name
        with grpc.insecure_channel(grpc_target.group(1)) as channel:
            reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
    finally:
        process.send_signal(signal.SIGINT)
        returncode = process.wait(90)
    output = log.read_text()
    assert returncode == 0, output[-3000:]
    assert "SecurityWarning" not in output and "superuser" not in output
    root_lines = [line for line in output.splitlines() if "runs as root" in line]
    assert len(root_lines) == (3 if os.geteuid() == 0 else 0), root_lines
