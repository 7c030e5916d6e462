"""`stitchcuda admin` against the platform's Redis, and `stitchcuda up` starting and stopping everything."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc
import httpx
import pytest
from typer.testing import CliRunner

from stitchcuda.api.v1 import jobs_pb2
from stitchcuda.gateway.admin import app as admin_app
from stitchcuda.gateway.admin import open_tenancy
from stitchcuda.gateway.client import GatewayClient
from stitchcuda.gateway.local import free_port
from stitchcuda.gateway.settings import GatewaySettings
from stitchcuda.shared.errors import Unauthenticated
from tests.conftest import problem_source
from tests.integration.platform.harness import REDIS_URL, REPO, SECRET, wait_for

pytestmark = pytest.mark.integration


def test_admin_creates_tenants_issues_revokes_keys_and_sets_quotas(
    redis_db: object, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv("STITCH_REDIS_URL", REDIS_URL)
    monkeypatch.setenv("STITCH_SECRET_KEY", SECRET)
    runner = CliRunner()
    created = runner.invoke(admin_app, ["tenant", "create", "acme", "--max-concurrent-jobs", "2"])
    assert created.exit_code == 0, created.output
    key = created.stdout.strip().splitlines()[-1]
    tenancy = open_tenancy(GatewaySettings())
    tenant = tenancy.authenticate(key)
    assert tenant.tenant_id == "acme" and tenant.quota.max_concurrent_jobs == 2
    again = runner.invoke(admin_app, ["tenant", "create", "acme"])
    assert again.exit_code == 2 and "already exists" in again.output
    issued = runner.invoke(admin_app, ["key", "issue", "acme", "--label", "ci"])
    second = issued.stdout.strip().splitlines()[-1]
    assert second != key and tenancy.authenticate(second).tenant_id == "acme"
    listed = runner.invoke(admin_app, ["key", "list", "acme"])
    ids = [k.key_id for k in tenancy.store.list_keys("acme")]
    assert len(ids) == 2 and all(i in listed.stdout for i in ids)
    assert key not in listed.stdout and second not in listed.stdout  # keys are never shown again
    first_id = next(k.key_id for k in tenancy.store.list_keys("acme") if k.label != "ci")
    assert runner.invoke(admin_app, ["key", "revoke", first_id]).exit_code == 0
    with pytest.raises(Unauthenticated):
        tenancy.authenticate(key)
    assert runner.invoke(admin_app, ["quota", "set", "acme", "--submits-per-minute", "7"]).exit_code == 0
    assert tenancy.get_tenant("acme").quota.submits_per_minute == 7
    assert tenancy.get_tenant("acme").quota.max_concurrent_jobs == 2
    table = runner.invoke(admin_app, ["tenant", "list"], env={"COLUMNS": "200"})
    assert "acme" in table.stdout
    assert runner.invoke(admin_app, ["quota", "set", "nobody", "--submits-per-minute", "1"]).exit_code == 2


@pytest.mark.slow
def test_stitchcuda_up_starts_seaweedfs_and_the_services_and_ctrl_c_stops_all(
    redis_db: object, tmp_path: Path
):
    home = tmp_path / "home"
    grpc_port, http_port = free_port(), free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("STITCH_")}
    env.update({"STITCH_REDIS_URL": REDIS_URL, "STITCH_HOME": str(home), "STITCH_SECRET_KEY": SECRET,
                "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(REPO)})  # fmt: skip
    code = f"from stitchcuda.gateway.local import run_up; raise SystemExit(run_up(grpc_port={grpc_port}, http_port={http_port}))"
    log = (tmp_path / "up.log").open("wb")
    up = subprocess.Popen(
        [sys.executable, "-c", code], env=env, stdout=log, stderr=subprocess.STDOUT, cwd=REPO
    )
    try:
        wait_for(lambda: _ready(http_port) or up.poll() is not None, 180, "the platform to come up", 0.5)
        assert up.poll() is None, (tmp_path / "up.log").read_text()[-3000:]
        key = (home / "api_key").read_text().strip()
        assert key.startswith("stk_")
        with GatewayClient(f"127.0.0.1:{grpc_port}", key) as client:
            job = client.submit(
                jobs_pb2.JobSpec(reference_source=problem_source("01"), device=jobs_pb2.DEVICE_CPU)
            )
            assert client.get(job.job_id).tenant_id == "local"
        with GatewayClient(f"127.0.0.1:{grpc_port}", "stk_wrong") as client, pytest.raises(grpc.RpcError):
            client.list()
        assert (home / "seaweedfs" / "s3.json").is_file()
        weed = _pids(str(home / "seaweedfs"))
        assert weed, "SeaweedFS runs from STITCH_HOME"
    finally:
        up.send_signal(signal.SIGINT)
        returncode = up.wait(90)
    output = (tmp_path / "up.log").read_text()
    assert returncode == 0, output[-3000:]
    assert "stopped" in output
    assert _pids(str(home / "seaweedfs")) == []
    for port in (grpc_port, http_port):
        with pytest.raises(httpx.HTTPError):
            httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2)


def _ready(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def _pids(pattern: str) -> list[int]:
    time.sleep(0.2)
    out = subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True)
    return [int(p) for p in out.stdout.split()]
