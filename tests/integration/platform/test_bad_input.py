"""Bad input at every door: a clear INVALID_ARGUMENT / 4xx with the reason, never a 500, never a stuck job."""

import grpc
import httpx
import pytest

from stitchcuda.api.v1 import gateway_pb2, jobs_pb2, messages_pb2
from stitchcuda.gateway.client import GatewayClient
from stitchcuda.shared.celery_app import TASK_NAMES, QueueSettings, create_celery
from stitchcuda.shared.envelope import new_envelope
from tests.conftest import problem_source
from tests.integration.platform.harness import REDIS_URL, Platform

pytestmark = pytest.mark.integration

SUBMIT = "/stitchcuda.api.v1.JobService/Submit"


def raw_submit(platform: Platform, api_key: str, data: bytes) -> grpc.RpcError:
    with grpc.insecure_channel(platform.grpc_target) as channel:
        call = channel.unary_unary(SUBMIT)
        with pytest.raises(grpc.RpcError) as err:
            call(data, metadata=(("authorization", f"Bearer {api_key}"),), timeout=10)
    return err.value


def request(source: str, **spec: object) -> gateway_pb2.SubmitRequest:
    return gateway_pb2.SubmitRequest(
        schema_version=1,
        spec=jobs_pb2.JobSpec(reference_source=source, device=jobs_pb2.DEVICE_CPU, **spec),  # type: ignore[arg-type]
    )


def test_grpc_refuses_bad_messages_with_the_reason(fake_platform: Platform, api_key: str):
    good = problem_source("01")
    cases: list[tuple[bytes, str]] = [
        (b"\xff\xff\xff\xff", "malformed"),
        (b"", "reference program is empty"),
    ]
    # A field number this build does not define, inside the spec (a newer client's message).
    newer = gateway_pb2.SubmitRequest(schema_version=1)
    newer.spec.MergeFromString(request(good).spec.SerializeToString() + b"\xf8\x06\x01")
    cases.append((newer.SerializeToString(), "#111"))
    cases.append(
        (gateway_pb2.SubmitRequest(schema_version=2, spec=request(good).spec).SerializeToString(), "newer")
    )
    cases.append((request(good + "\n# " + "x" * 300_000).SerializeToString(), "limit"))
    cases.append(
        (request("import not_a_module_anywhere\n" + good).SerializeToString(), "not_a_module_anywhere")
    )
    cases.append((request("import torch\nclass Model: pass\n").SerializeToString(), "get_inputs"))
    cases.append((request("def broken(:\n").SerializeToString(), "syntax error"))
    cases.append((request(good, problem_name="../../etc").SerializeToString(), "problem_name"))
    for data, reason in cases:
        error = raw_submit(fake_platform, api_key, data)
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, (reason, error.details())
        assert reason in error.details(), (reason, error.details())
    with GatewayClient(fake_platform.grpc_target, api_key) as client:
        for call in (lambda: client.get(""), lambda: client.list(page_token="bogus")):
            with pytest.raises(grpc.RpcError) as err:
                call()
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        options = jobs_pb2.JobOptions(max_rounds=1000)
        with pytest.raises(grpc.RpcError) as err:
            client.submit(jobs_pb2.JobSpec(reference_source=good, options=options))
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "max_rounds" in err.value.details()
        # None of the refused submissions left a job behind.
        assert list(client.list().jobs) == []


def test_http_refuses_bad_bodies_with_4xx_and_a_reason(fake_platform: Platform, api_key: str):
    good = problem_source("01")
    http = httpx.Client(base_url=fake_platform.http_url, headers={"x-api-key": api_key}, timeout=30)
    cases = [
        ({"content": b"{not json", "headers": {"content-type": "application/json"}}, 400, "not valid JSON"),
        ({"json": [1, 2]}, 400, "JSON object"),
        ({"json": {"spec": {"reference_source": good, "colour": "blue"}}}, 400, "colour"),
        ({"json": {"schema_version": 7, "spec": {"reference_source": good}}}, 400, "newer"),
        ({"json": {"spec": {"reference_source": good, "device": "DEVICE_TPU"}}}, 400, "DEVICE_TPU"),
        ({"json": {"spec": {"reference_source": good + "#" * 300_000}}}, 400, "limit"),
        (
            {"content": b"x" * (8 * 256 * 1024 + 70_000), "headers": {"content-type": "application/json"}},
            413,
            "limit",
        ),
        (
            {"content": b"\xff\xff\xff", "headers": {"content-type": "application/x-protobuf"}},
            400,
            "malformed",
        ),
        ({"json": {"spec": {"reference_source": "import nope_nope\n" + good}}}, 400, "nope_nope"),
    ]
    for kwargs, status, reason in cases:
        response = http.post("/v1/jobs", **kwargs)  # type: ignore[arg-type]
        assert response.status_code == status, (reason, response.text[:300])
        error = response.json()["error"]
        assert reason in error["message"], (reason, error)
    assert http.get("/v1/jobs/no-such-job").status_code == 404
    assert http.get("/v1/jobs", params={"state": "sleeping"}).status_code == 400
    assert http.get("/v1/jobs", params={"page_size": "many"}).status_code == 400
    assert http.post("/v1/jobs/x/cancel", content=b"[").status_code in (400, 404)
    job = http.post("/v1/jobs", json={"spec": {"reference_source": good, "device": "DEVICE_CPU"}}).json()
    assert http.get(f"/v1/jobs/{job['job_id']}/events", params={"after_seq": "garbage"}).status_code == 400
    missing = http.get(f"/v1/jobs/{job['job_id']}/artifacts/secrets.txt")
    assert missing.status_code == 404 and "available" in missing.json()["error"]["message"]
    assert http.get("/v1/jobs").json()["jobs"][0]["job_id"] == job["job_id"]


def test_workers_drop_malformed_and_too_new_messages_and_keep_serving(fake_platform: Platform, api_key: str):
    """A queue message that is not an envelope (or is from a newer build) is dropped with a log line;
    the worker goes on with the next job."""
    celery = create_celery(QueueSettings(redis_url=REDIS_URL))
    newer = new_envelope("job-from-the-future", "acme")
    newer.schema_version = 99
    newer.plan_request.CopyFrom(messages_pb2.PlanRequest(reference_key="tenants/acme/jobs/x/reference.py"))
    for data in (b"\x00garbage", newer.SerializeToString(), b""):
        celery.send_task(TASK_NAMES["planner"], args=(data,), queue="planner", serializer="msgpack")
    celery.close()
    with GatewayClient(fake_platform.grpc_target, api_key) as client:
        job = client.submit(jobs_pb2.JobSpec(reference_source=problem_source("01"), device=jobs_pb2.DEVICE_CPU,
                                             options=jobs_pb2.JobOptions(max_rounds=0)))  # fmt: skip
        assert client.wait(job.job_id, timeout_s=60).status.state == jobs_pb2.JOB_STATE_SUCCEEDED
    log = fake_platform.procs["planner"].tail(400)
    assert "dropping a malformed message on planner" in log
    assert "newer than this build" in log
