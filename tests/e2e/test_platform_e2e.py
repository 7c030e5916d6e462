"""The whole platform through the gateway with the real Planner, Coder and Verifier on the CPU backend:
separate worker processes on Redis and a SeaweedFS S3, gRPC and HTTP over TCP. Builds are shared
through one cache folder (STITCH_TEST_BUILD_CACHE), so only the first test pays for the compile. The
platform is started once for the module: its start and stop take ~25 s of CI's two cores."""

import json
import os
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis

from stitchcuda.api.v1 import jobs_pb2
from stitchcuda.gateway.client import GatewayClient, submit_main
from stitchcuda.shared.isolation import bwrap_works
from tests.conftest import PROBLEMS, problem_source
from tests.integration.hostile import end_lingering, hostile, lingering
from tests.integration.platform.harness import (
    SECRET,
    Platform,
    flush_redis,
    make_tenant,
    platform_env,
    wait_for,
)

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

PROBLEM = "01_elementwise_chain"


@pytest.fixture(scope="module")
def real_platform(seaweed: object, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Platform]:
    flush_redis()
    env = platform_env(
        seaweed,  # type: ignore[arg-type]
        STITCH_BUILD_CACHE_DIR=os.environ["STITCH_TEST_BUILD_CACHE"],
        STITCH_HOME=str(tmp_path_factory.mktemp("home")),
        # Short measurements (2 shared cores): what is tested here is the platform around the services.
        STITCH_PLANNER_PROFILE_COMPILE="false",
        STITCH_PLANNER_NSYS_ENABLED="false",
        STITCH_PLANNER_PROFILE_ITERS="3",
        STITCH_COMPILE_BASELINE="false",
        STITCH_TRIALS="2",
        STITCH_TIMING_ITERATIONS="5",
        STITCH_WARMUP_ITERATIONS="1",
    )
    platform = Platform(env, Path(tmp_path_factory.mktemp("platform")), fake=False)
    try:
        platform.start_gateway()
        for service in ("planner", "coder", "verifier"):
            platform.start_worker(service)
        yield platform
    except BaseException:
        print(platform.logs())
        raise
    finally:
        platform.stop()


@pytest.fixture
def api_key(real_platform: Platform, redis_db: object) -> str:
    return make_tenant("acme")


def spec(source: str, rounds: int = 0) -> jobs_pb2.JobSpec:
    return jobs_pb2.JobSpec(problem_name=PROBLEM, reference_source=source, device=jobs_pb2.DEVICE_CPU,
                            options=jobs_pb2.JobOptions(max_rounds=rounds))  # fmt: skip


def test_grpc_submit_watch_and_download_a_verified_program(
    real_platform: Platform, api_key: str, tmp_path: Path
):
    with GatewayClient(real_platform.grpc_target, api_key) as client:
        job = client.submit(spec(problem_source("01")))
        events = list(client.watch(job.job_id))
        final = client.get(job.job_id)
        assert final.status.state == jobs_pb2.JOB_STATE_SUCCEEDED, (
            final.status.message,
            real_platform.logs(),
        )
        assert final.status.best_speedup_vs_eager > 0
        assert any(e.kind == jobs_pb2.EVENT_KIND_PROGRESS and e.stage == "verify" for e in events)
        verdicts = [e for e in events if e.kind == jobs_pb2.EVENT_KIND_VERDICT]
        assert verdicts and verdicts[0].data["accepted"] == "true"
        report = json.loads(client.download(job.job_id, "report.json"))
        assert report["succeeded"] and report["best_row"]["accepted"]
        assert report["plan"]["subtasks"]
        model_new = client.download(job.job_id, "result").decode()
        assert "class ModelNew" in model_new and "PYBIND11_MODULE" in model_new


def test_http_submit_sse_and_download(real_platform: Platform, api_key: str):
    headers = {"Authorization": f"Bearer {api_key}"}
    body = {"spec": {"problem_name": PROBLEM, "reference_source": problem_source("01"), "device": "DEVICE_CPU",
                     "options": {"max_rounds": 0}}}  # fmt: skip
    with httpx.Client(base_url=real_platform.http_url, headers=headers, timeout=60) as http:
        job_id = http.post("/v1/jobs", json=body).json()["job_id"]
        kinds = []
        with http.stream("GET", f"/v1/jobs/{job_id}/events", timeout=900) as stream:
            kinds = [line[7:] for line in stream.iter_lines() if line.startswith("event: ")]
        assert "verdict" in kinds and kinds[-1] == "end"
        job = http.get(f"/v1/jobs/{job_id}").json()
        assert job["status"]["state"] == "JOB_STATE_SUCCEEDED", job["status"]
        html = http.get(f"/v1/jobs/{job_id}/artifacts/report.html")
        assert html.status_code == 200 and "<table>" in html.text


def test_the_stitchcuda_submit_command_follows_and_downloads(real_platform: Platform, api_key: str, tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]):  # fmt: skip
    out = tmp_path / "result"
    code = submit_main(PROBLEMS / f"{PROBLEM}.py", real_platform.grpc_target, True, out, api_key, "cpu", 0)
    assert code == 0, capsys.readouterr().err[-3000:]
    assert {p.name for p in out.iterdir()} >= {"model_new.py", "report.json", "report.html"}
    assert "verified" in capsys.readouterr().err


def test_a_reference_that_does_not_import_fails_the_job_with_the_reason(
    real_platform: Platform, api_key: str
):
    broken = problem_source("01").replace(
        "import torch\n", "import torch\nraise RuntimeError('boom at import')\n", 1
    )
    with GatewayClient(real_platform.grpc_target, api_key) as client:
        job = client.submit(spec(broken))
        final = client.wait(job.job_id, timeout_s=300)
        assert final.status.state == jobs_pb2.JOB_STATE_FAILED
        assert "boom at import" in final.status.message or "boom at import" in " ".join(
            e.message for e in client.watch(job.job_id)
        )


def test_kill_9_of_the_verifier_mid_verification_still_completes(real_platform: Platform, api_key: str):
    verifier = real_platform.procs["verifier"]
    with GatewayClient(real_platform.grpc_target, api_key) as client:
        job = client.submit(spec(problem_source("01")))
        seen: list[jobs_pb2.JobEvent] = []
        for event in client.watch(job.job_id):
            seen.append(event)
            if event.kind == jobs_pb2.EVENT_KIND_PROGRESS and event.stage in ("verify", "build"):
                break
        children = verifier.children()
        assert children, "the verifier runs its task in a pool process"
        for pid in children:
            os.kill(pid, signal.SIGKILL)
        final = client.wait(job.job_id, timeout_s=900)
        assert final.status.state == jobs_pb2.JOB_STATE_SUCCEEDED, (
            final.status.message,
            real_platform.logs(),
        )
        verdicts = [e for e in client.watch(job.job_id) if e.kind == jobs_pb2.EVENT_KIND_VERDICT]
        assert len(verdicts) == 1
    wait_for(lambda: len(verifier.children()) >= 1, 30, "the pool to replace the killed process")


def test_a_hostile_reference_reaches_nothing_and_the_job_still_gets_a_verdict(
    real_platform: Platform, api_key: str, seaweed: object, tmp_path: Path
):
    # The hostile reference of tests/integration/hostile.py (tested in the embedded mode in
    # tests/integration/test_untrusted_reference.py): wherever the platform runs it (the Planner's
    # analysis, the Coder's trace, the Verifier's reference run), it must not reach Redis, write outside
    # its sandbox, read the workers' credentials (their environment, the S3 server's credential file) or
    # leave a process behind; having found nothing, it behaves, and the job gets its verdict.
    if not bwrap_works(False):
        pytest.skip("bubblewrap cannot start a sandbox on this machine")
    key, marker, token = f"stitch-test-{uuid.uuid4().hex}", tmp_path / "marker", uuid.uuid4().hex
    credentials = Path(seaweed.data_dir) / "s3.json"  # type: ignore[attr-defined]
    secrets = [SECRET, seaweed.secret_key]  # type: ignore[attr-defined]
    assert all(s in real_platform.env.values() for s in secrets)  # the workers do hold them
    assert seaweed.secret_key in credentials.read_text()  # type: ignore[attr-defined]
    default_db = redis.Redis(host="127.0.0.1", port=6379)  # where its raw SET lands: it selects no DB
    try:
        with GatewayClient(real_platform.grpc_target, api_key) as client:
            job = client.submit(spec(hostile(key, marker, token, [credentials])))
            final = client.wait(job.job_id, timeout_s=600)
            events = list(client.watch(job.job_id))
            shown = [final.status.message, *(e.message for e in events)]
            shown += [f"{k}={v}" for e in events for k, v in e.data.items()]
            if final.status.state == jobs_pb2.JOB_STATE_SUCCEEDED:
                shown.append(client.download(job.job_id, "report.json").decode(errors="replace"))
        time.sleep(2)  # a process that escaped its run would still be trying
        seen = "\n".join(shown)
        assert final.status.state == jobs_pb2.JOB_STATE_SUCCEEDED, (seen[-3000:], real_platform.logs())
        assert any(e.kind == jobs_pb2.EVENT_KIND_VERDICT for e in events)
        assert not [s for s in secrets if s in seen], "a worker's credential reached the tenant"
        assert default_db.get(key) is None and default_db.get(f"{key}:lingered") is None
        assert not marker.exists() and not Path(f"{marker}.lingered").exists()
        assert lingering(token) == [], "a process the reference started outlived the job"
    finally:
        end_lingering(token)
        default_db.delete(key, f"{key}:lingered")
        default_db.close()
