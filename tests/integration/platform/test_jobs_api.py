"""The platform through its fronts (gRPC and HTTP over TCP), workers as processes on fake fast services."""

import json

import grpc
import httpx
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from stitchcuda.api.v1 import gateway_pb2, jobs_pb2
from stitchcuda.gateway.client import GatewayClient
from tests.conftest import problem_source
from tests.integration.platform.harness import Platform, make_tenant

pytestmark = pytest.mark.integration

TERMINAL = {jobs_pb2.JOB_STATE_SUCCEEDED, jobs_pb2.JOB_STATE_FAILED, jobs_pb2.JOB_STATE_CANCELLED}


def spec(rounds: int = 1, **kw: object) -> jobs_pb2.JobSpec:
    return jobs_pb2.JobSpec(
        problem_name="01_elementwise_chain",
        reference_source=problem_source("01"),
        device=jobs_pb2.DEVICE_CPU,
        options=jobs_pb2.JobOptions(max_rounds=rounds),
        **kw,
    )


def test_submit_over_grpc_watch_events_and_download_the_result(fake_platform: Platform, api_key: str):
    with GatewayClient(fake_platform.grpc_target, api_key) as client:
        job = client.submit(spec(rounds=1))
        assert job.status.state == jobs_pb2.JOB_STATE_PLANNING
        events = list(client.watch(job.job_id))
        final = client.get(job.job_id)
        assert final.status.state == jobs_pb2.JOB_STATE_SUCCEEDED, (
            final.status.message,
            fake_platform.logs(),
        )
        stages = [e.stage for e in events if e.kind == jobs_pb2.EVENT_KIND_STATE]
        assert stages[0] == "queued" and stages[-1] == "succeeded"
        assert {"planning", "coding", "verifying"} <= set(stages)
        verdicts = [e for e in events if e.kind == jobs_pb2.EVENT_KIND_VERDICT]
        assert [(e.round, e.data["accepted"]) for e in verdicts] == [(0, "true"), (1, "true")]
        seqs = [e.seq for e in events]
        assert len(set(seqs)) == len(seqs)
        assert abs(final.status.best_speedup_vs_eager - 1.5) < 1e-9
        model_new = client.download(job.job_id, "result").decode()
        assert "class ModelNew" in model_new and "_load(" in model_new
        report = json.loads(client.download(job.job_id, "report.json"))
        assert report["succeeded"] and report["job_id"] == job.job_id
        # Resuming after a seq gives exactly the later events.
        later = list(client.watch(job.job_id, after_seq=events[2].seq))
        assert [e.seq for e in later] == seqs[3:]


def test_submit_over_http_follow_sse_and_download(fake_platform: Platform, api_key: str):
    headers = {"Authorization": f"Bearer {api_key}"}
    body = {"schema_version": 1, "spec": {"problem_name": "p01", "reference_source": problem_source("01"),
                                          "device": "DEVICE_CPU", "options": {"max_rounds": 0}}}  # fmt: skip
    with httpx.Client(base_url=fake_platform.http_url, headers=headers, timeout=30) as http:
        created = http.post("/v1/jobs", json=body)
        assert created.status_code == 200, created.text
        job_id = created.json()["job_id"]
        kinds, states, ids = [], [], []
        with http.stream("GET", f"/v1/jobs/{job_id}/events") as stream:
            assert stream.headers["content-type"].startswith("text/event-stream")
            kind = ""
            for line in stream.iter_lines():
                if line.startswith("event: "):
                    kind = line[7:]
                    kinds.append(kind)
                elif line.startswith("id: "):
                    ids.append(line[4:])
                elif line.startswith("data: ") and kind == "state":
                    states.append(json.loads(line[6:])["state"])
        assert kinds[-1] == "end"
        assert states[-1] == "JOB_STATE_SUCCEEDED"
        job = http.get(f"/v1/jobs/{job_id}").json()
        assert job["status"]["state"] == "JOB_STATE_SUCCEEDED"
        assert sorted(job["artifacts"]) == sorted(
            [
                "reference",
                "plan",
                "model_new.py",
                "candidate.pb",
                "report.json",
                "report.html",
                "trajectory.json",
            ]
        )
        result = http.get(f"/v1/jobs/{job_id}/artifacts/result")
        assert result.status_code == 200 and "class ModelNew" in result.text
        # Presigned URL: the bytes come straight from S3, no API key needed.
        url = http.get(f"/v1/jobs/{job_id}/artifacts/report.html/url").json()["url"]
        assert url.startswith("http://127.0.0.1:")
        assert httpx.get(url, timeout=10).text == http.get(f"/v1/jobs/{job_id}/artifacts/report.html").text
        # Resume with Last-Event-ID: only the events after it.
        with http.stream("GET", f"/v1/jobs/{job_id}/events", headers={"Last-Event-ID": ids[-2]}) as stream:
            resumed = [line[4:] for line in stream.iter_lines() if line.startswith("id: ")]
        assert resumed == ids[-1:]


def test_a_tenant_never_sees_another_tenants_jobs(fake_platform: Platform, api_key: str):
    other = make_tenant("globex")
    with GatewayClient(fake_platform.grpc_target, api_key) as mine, \
            GatewayClient(fake_platform.grpc_target, other) as theirs:  # fmt: skip
        job = mine.submit(spec(rounds=0))
        mine.wait(job.job_id, timeout_s=60)
        calls = [
            lambda: theirs.get(job.job_id),
            lambda: list(theirs.watch(job.job_id)),
            lambda: theirs.download(job.job_id, "result"),
            lambda: theirs.artifact_url(job.job_id, "result"),
            lambda: theirs.cancel(job.job_id),
        ]
        for call in calls:
            with pytest.raises(grpc.RpcError) as err:
                call()
            assert err.value.code() == grpc.StatusCode.NOT_FOUND
        assert [j.job_id for j in mine.list().jobs] == [job.job_id]
        assert list(theirs.list().jobs) == []
    with httpx.Client(base_url=fake_platform.http_url, headers={"x-api-key": other}) as http:
        assert http.get(f"/v1/jobs/{job.job_id}").status_code == 404
        assert http.get(f"/v1/jobs/{job.job_id}/artifacts/reference").status_code == 404


def test_wrong_or_missing_api_key_is_unauthenticated(fake_platform: Platform, api_key: str):
    for key in ("stk_nope_nope", None):
        with GatewayClient(fake_platform.grpc_target, key) as client:
            with pytest.raises(grpc.RpcError) as err:
                client.submit(spec())
            assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    headers = {"Authorization": "Bearer stk_wrong"}
    assert httpx.get(f"{fake_platform.http_url}/v1/jobs", headers=headers).status_code == 401
    response = httpx.get(f"{fake_platform.http_url}/v1/jobs")
    assert response.status_code == 401 and response.json()["error"]["code"] == "unauthenticated"


def test_rate_limit_and_concurrency_quota_are_resource_exhausted(fake_platform: Platform, redis_db: object):
    limited = make_tenant("limited", submits_per_minute=2)
    with GatewayClient(fake_platform.grpc_target, limited) as client:
        client.submit(spec(rounds=0))
        client.submit(spec(rounds=0))
        with pytest.raises(grpc.RpcError) as err:
            client.submit(spec(rounds=0))
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "rate limit" in err.value.details()
    single = make_tenant("single", max_concurrent_jobs=1)
    body = {"spec": {"reference_source": problem_source("01"), "device": "DEVICE_CPU"}}
    with httpx.Client(base_url=fake_platform.http_url, headers={"x-api-key": single}, timeout=30) as http:
        first = http.post("/v1/jobs", json=body).json()
        second = http.post("/v1/jobs", json=body)
        if second.status_code == 200:  # the first one may already have finished on the fast fakes
            pytest.skip("the first job ended before the second submit")
        assert second.status_code == 429, second.text
        assert "limit" in second.json()["error"]["message"]
        http.post(f"/v1/jobs/{first['job_id']}/cancel", json={"reason": "make room"})
        assert http.post("/v1/jobs", json=body).status_code == 200


def test_idempotent_resubmission_returns_the_same_job(fake_platform: Platform, api_key: str):
    with GatewayClient(fake_platform.grpc_target, api_key) as client:
        first = client.submit(spec(rounds=0, idempotency_key="same-key"))
        again = client.submit(spec(rounds=0, idempotency_key="same-key"))
        assert again.job_id == first.job_id
        assert len(client.list().jobs) == 1


def test_list_pages_newest_first_without_duplicates(fake_platform: Platform, api_key: str):
    with GatewayClient(fake_platform.grpc_target, api_key) as client:
        ids = [client.submit(spec(rounds=0)).job_id for _ in range(5)]
        seen, token = [], ""
        while True:
            page = client.list(page_size=2, page_token=token)
            assert len(page.jobs) <= 2
            assert all(not j.spec.reference_source for j in page.jobs)
            seen += [j.job_id for j in page.jobs]
            token = page.next_page_token
            if not token:
                break
        assert seen == list(reversed(ids))
        with pytest.raises(grpc.RpcError) as err:
            client.list(page_token="not-a-job")
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_health_reflection_docs_and_metrics(fake_platform: Platform):
    with grpc.insecure_channel(fake_platform.grpc_target) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        for service in ("", "stitchcuda.api.v1.JobService"):
            reply = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
        from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        replies = stub.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]))
        names = {s.name for r in replies for s in r.list_services_response.service}
        assert "stitchcuda.api.v1.JobService" in names
    http = httpx.Client(base_url=fake_platform.http_url, timeout=10)
    assert http.get("/healthz").json()["status"] == "ok"
    ready = http.get("/readyz").json()
    assert ready["checks"] == {"jobs": "ok", "artifacts": "ok"}
    paths = http.get("/openapi.json").json()["paths"]
    assert {"/v1/jobs", "/v1/jobs/{job_id}", "/v1/jobs/{job_id}/events"} <= set(paths)
    assert http.get("/docs").status_code == 200
    metrics = http.get("/metrics").text
    assert "stitch_requests_total" in metrics and 'transport="http"' in metrics
    assert "stitch_queue_depth" in metrics


def test_grpc_download_streams_chunks_with_offsets(fake_platform: Platform, api_key: str):
    with GatewayClient(fake_platform.grpc_target, api_key) as client:
        job = client.submit(spec(rounds=0))
        client.wait(job.job_id, timeout_s=60)
        chunks = list(client.stub.DownloadArtifact(
            gateway_pb2.DownloadRequest(job_id=job.job_id, name="report.html"), metadata=client.metadata
        ))  # fmt: skip
        assert chunks and chunks[0].offset == 0 and chunks[0].total_size == sum(len(c.data) for c in chunks)
        assert b"<html" in b"".join(c.data for c in chunks).lower()
