"""JobService on memory stores: the loop end to end, tenant isolation, quotas, validation, cancel."""

import pytest

from stitchcuda.api.v1 import gateway_pb2, jobs_pb2
from stitchcuda.shared.errors import (
    InvalidRequest,
    NotFound,
    ProblemError,
    QuotaExceeded,
    Unavailable,
    UnsupportedVersion,
)
from tests.conftest import problem_source
from tests.unit.gateway.conftest import Rig, submit_request


def test_a_submitted_job_runs_to_success_and_its_events_end_with_the_final_state(rig: Rig):
    tenant = rig.tenant()
    job = rig.service.submit(tenant, submit_request())
    assert job.status.state == jobs_pb2.JOB_STATE_PLANNING and job.tenant_id == "acme"
    rig.run()
    final = rig.service.get(tenant, job.job_id)
    assert final.status.state == jobs_pb2.JOB_STATE_SUCCEEDED
    events = list(rig.service.watch(tenant, job.job_id))
    assert events[-1].kind == jobs_pb2.EVENT_KIND_STATE and events[-1].state == jobs_pb2.JOB_STATE_SUCCEEDED
    watch = rig.service.watch(tenant, job.job_id, after_seq=events[-2].seq)
    assert [e.seq for e in watch.poll(0.1)] == [events[-1].seq]
    assert watch.poll(0.1) == [] and watch.done
    assert "class ModelNew" in rig.service.download(tenant, job.job_id, "result").data.decode()
    report = rig.service.download(tenant, job.job_id, "report")
    assert report.name == "report.json" and report.content_type == "application/json"


def test_watch_of_a_running_job_waits_for_new_events(rig: Rig):
    tenant = rig.tenant()
    job = rig.service.submit(tenant, submit_request())
    watch = rig.service.watch(tenant, job.job_id)
    first = watch.poll(0.1)
    assert first and not watch.done
    assert watch.poll(0.05) == []  # nothing new until the workers run
    rig.run()
    rest = watch.poll(0.1)
    assert rest[-1].state == jobs_pb2.JOB_STATE_SUCCEEDED
    assert watch.poll(0.1) == [] and watch.done


def test_tenants_are_isolated_everywhere(rig: Rig):
    acme, globex = rig.tenant("acme"), rig.tenant("globex")
    job = rig.service.submit(acme, submit_request())
    rig.run()
    for call in (
        lambda: rig.service.get(globex, job.job_id),
        lambda: rig.service.watch(globex, job.job_id),
        lambda: rig.service.cancel(globex, job.job_id),
        lambda: rig.service.download(globex, job.job_id, "result"),
        lambda: rig.service.artifact_url(globex, job.job_id, "result"),
    ):
        with pytest.raises(NotFound) as err:
            call()
        assert "globex" not in str(err.value) and "acme" not in str(err.value)
    assert [j.job_id for j in rig.service.list(acme).jobs] == [job.job_id]
    assert list(rig.service.list(globex).jobs) == []


def test_artifacts_outside_the_tenants_folder_are_never_served(rig: Rig):
    tenant = rig.tenant()
    job = rig.service.submit(tenant, submit_request())
    rig.run()
    stored = rig.jobs.get(job.job_id)
    rig.artifacts.put("tenants/globex/jobs/x/secret.txt", b"not yours")
    stored.artifacts["stolen"] = "tenants/globex/jobs/x/secret.txt"
    rig.jobs.put(stored)
    with pytest.raises(NotFound):
        rig.service.download(tenant, job.job_id, "stolen")
    with pytest.raises(NotFound) as err:
        rig.service.download(tenant, job.job_id, "nothing-here")
    assert "model_new.py" in str(err.value)  # the reason lists what is available


def test_presigned_url_for_an_artifact(rig: Rig):
    tenant = rig.tenant()
    job = rig.service.submit(tenant, submit_request())
    rig.run()
    url = rig.service.artifact_url(tenant, job.job_id, "report.html", expires_s=120)
    assert url.url.endswith(f"tenants/acme/jobs/{job.job_id}/result/report.html?X-Amz-Expires=120")
    assert url.expires_at.seconds > 0


def test_cancel_ends_the_job_stops_its_work_and_frees_its_slot(rig: Rig):
    tenant = rig.tenant(max_concurrent_jobs=1)
    job = rig.service.submit(tenant, submit_request())
    with pytest.raises(QuotaExceeded):
        rig.service.submit(tenant, submit_request())
    cancelled = rig.service.cancel(tenant, job.job_id, "changed my mind")
    assert cancelled.status.state == jobs_pb2.JOB_STATE_CANCELLED
    assert rig.stopped == [job.job_id]
    rig.run()  # the queued plan message is dropped: the job stays cancelled
    assert rig.service.get(tenant, job.job_id).status.state == jobs_pb2.JOB_STATE_CANCELLED
    assert rig.service.cancel(tenant, job.job_id).status.state == jobs_pb2.JOB_STATE_CANCELLED
    assert rig.stopped == [job.job_id]
    rig.service.submit(tenant, submit_request())


def test_concurrency_slots_free_up_when_jobs_end(rig: Rig):
    tenant = rig.tenant(max_concurrent_jobs=2)
    rig.service.submit(tenant, submit_request())
    rig.service.submit(tenant, submit_request())
    with pytest.raises(QuotaExceeded) as err:
        rig.service.submit(tenant, submit_request())
    assert "2 jobs" in str(err.value)
    rig.run()
    rig.service.submit(tenant, submit_request())


def test_rate_limit_and_gpu_seconds_quota(rig: Rig):
    tenant = rig.tenant(submits_per_minute=2, gpu_seconds_per_month=100)
    rig.service.submit(tenant, submit_request())
    rig.service.submit(tenant, submit_request())
    with pytest.raises(QuotaExceeded, match="rate limit"):
        rig.service.submit(tenant, submit_request())
    gpu = rig.tenant("gpu-user", gpu_seconds_per_month=100)
    rig.usage.add("gpu-user", "gpu_seconds", 150)
    with pytest.raises(QuotaExceeded, match="GPU"):
        rig.service.submit(gpu, submit_request(device=jobs_pb2.DEVICE_CUDA))
    rig.service.submit(gpu, submit_request(device=jobs_pb2.DEVICE_CPU))  # CPU jobs are not GPU-metered


def test_idempotent_replays_return_the_first_job_and_hold_one_slot(rig: Rig):
    tenant = rig.tenant(max_concurrent_jobs=1)
    first = rig.service.submit(tenant, submit_request(idempotency_key="k1"))
    again = rig.service.submit(tenant, submit_request(idempotency_key="k1"))
    assert again.job_id == first.job_id
    assert rig.tenancy.store.active_jobs("acme") == [first.job_id]


@pytest.mark.parametrize(
    ("request_", "error", "reason"),
    [
        (
            gateway_pb2.SubmitRequest(schema_version=2, spec=submit_request().spec),
            UnsupportedVersion,
            "newer",
        ),
        (submit_request(""), ProblemError, "empty"),
        (submit_request("import torch\n" + "x = 1\n" * 60_000), ProblemError, "limit"),
        (
            submit_request(
                "import nowhere_module\nclass Model: pass\ndef get_inputs(): pass\n"
                "def get_init_inputs(): pass\n"
            ),
            ProblemError,
            "nowhere_module",
        ),
        (
            submit_request(
                "from . import sibling\nclass Model: pass\ndef get_inputs(): pass\n"
                "def get_init_inputs(): pass\n"
            ),
            ProblemError,
            ".",
        ),
        (submit_request(options=jobs_pb2.JobOptions(max_rounds=21)), InvalidRequest, "max_rounds"),
        (submit_request(options=jobs_pb2.JobOptions(samples=99)), InvalidRequest, "samples"),
        (submit_request(options=jobs_pb2.JobOptions(coder_backend="gpt")), InvalidRequest, "coder_backend"),
        (submit_request(options=jobs_pb2.JobOptions(target_speedup=-1)), InvalidRequest, "negative"),
        (submit_request(device=42), InvalidRequest, "device"),
        (submit_request(problem_name="a/b"), InvalidRequest, "problem_name"),
        (submit_request(labels={f"k{i}": "v" for i in range(40)}), InvalidRequest, "labels"),
    ],
)
def test_invalid_submissions_are_refused_with_the_reason_and_leave_nothing(rig: Rig, request_, error, reason):
    tenant = rig.tenant()
    with pytest.raises(error) as err:
        rig.service.submit(tenant, request_)
    assert reason in str(err.value)
    assert list(rig.service.list(tenant).jobs) == []
    assert rig.tenancy.store.active_jobs("acme") == []


def test_unknown_fields_of_a_newer_client_are_refused(rig: Rig):
    tenant = rig.tenant()
    request = submit_request()
    request.spec.options.MergeFromString(b"\xa0\x06\x05")  # field 100 of JobOptions, unknown here
    with pytest.raises(InvalidRequest, match=r"JobOptions|options\.#100"):
        rig.service.submit(tenant, request)


def test_auto_device_resolves_to_the_gateways_setting(rig: Rig):
    tenant = rig.tenant()
    job = rig.service.submit(tenant, submit_request(device=jobs_pb2.DEVICE_AUTO))
    assert job.spec.device == jobs_pb2.DEVICE_CPU


def large_reference() -> str:
    """A valid reference above the inline size, so it is put to the artifact store at submit."""
    return problem_source("01") + "\n# padding\n" + "#" * (70 * 1024) + "\n"


def test_storage_down_at_submit_fails_cleanly_and_frees_the_slot(rig: Rig, monkeypatch: pytest.MonkeyPatch):
    tenant = rig.tenant(max_concurrent_jobs=1)

    def down(*args: object, **kwargs: object) -> None:
        raise Unavailable("S3 is down")

    monkeypatch.setattr(rig.artifacts, "put", down)
    with pytest.raises(Unavailable):
        rig.service.submit(tenant, submit_request(large_reference()))
    assert list(rig.service.list(tenant).jobs) == []
    monkeypatch.undo()
    job = rig.service.submit(tenant, submit_request(large_reference()))  # the slot was given back
    assert rig.artifacts.get(job.artifacts["reference"]) == large_reference().encode()
    rig.run()
    assert rig.service.get(tenant, job.job_id).status.state == jobs_pb2.JOB_STATE_SUCCEEDED
    assert rig.service.download(tenant, job.job_id, "reference").data == large_reference().encode()


def test_a_small_reference_lives_in_the_job_record_and_needs_no_storage_at_submit(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
):
    tenant = rig.tenant()

    def down(*args: object, **kwargs: object) -> None:
        raise Unavailable("S3 is down")

    monkeypatch.setattr(rig.artifacts, "put", down)
    job = rig.service.submit(tenant, submit_request())
    monkeypatch.undo()
    key = job.artifacts["reference"]
    assert not rig.artifacts.exists(key)
    reference = rig.service.download(tenant, job.job_id, "reference")
    assert reference.data == problem_source("01").encode() and reference.key == key
    rig.run()
    assert rig.service.get(tenant, job.job_id).status.state == jobs_pb2.JOB_STATE_SUCCEEDED
    # A presigned URL needs the object: the first one copies the reference to the store.
    url = rig.service.artifact_url(tenant, job.job_id, "reference")
    assert url.url.startswith(f"https://s3.example/{key}")
    assert rig.artifacts.get(key) == problem_source("01").encode()


def test_a_submit_whose_plan_message_cannot_be_sent_fails_its_job_and_frees_the_slot(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
):
    tenant = rig.tenant(max_concurrent_jobs=1)

    def broker_down(*args: object, **kwargs: object) -> None:
        raise Unavailable("the broker is down")

    monkeypatch.setattr(rig.transport, "send", broker_down)
    with pytest.raises(Unavailable):
        rig.service.submit(tenant, submit_request())
    monkeypatch.undo()
    [failed] = rig.service.list(tenant).jobs
    assert failed.status.state == jobs_pb2.JOB_STATE_FAILED
    assert "the broker is down" in failed.status.message
    events = list(rig.service.watch(tenant, failed.job_id))
    assert events[-1].state == jobs_pb2.JOB_STATE_FAILED
    job = rig.service.submit(tenant, submit_request())  # the slot was given back
    rig.run()
    assert rig.service.get(tenant, job.job_id).status.state == jobs_pb2.JOB_STATE_SUCCEEDED


def test_list_filters_by_state_and_pages(rig: Rig):
    tenant = rig.tenant()
    done = rig.service.submit(tenant, submit_request())
    rig.run()
    queued = [rig.service.submit(tenant, submit_request()).job_id for _ in range(3)]
    succeeded = rig.service.list(tenant, state=jobs_pb2.JOB_STATE_SUCCEEDED)
    assert [j.job_id for j in succeeded.jobs] == [done.job_id]
    first = rig.service.list(tenant, page_size=2)
    second = rig.service.list(tenant, page_size=2, page_token=first.next_page_token)
    assert len(first.jobs) == 2 and first.next_page_token
    assert {j.job_id for j in [*first.jobs, *second.jobs]} == {done.job_id, *queued}
    assert all(not j.spec.reference_source for j in first.jobs)
