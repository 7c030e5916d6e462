"""The Celery app's configuration and the task runner's decisions (no broker needed)."""

from types import SimpleNamespace

import pytest
from celery.exceptions import Retry, SoftTimeLimitExceeded

from stitchcuda.api.v1 import messages_pb2
from stitchcuda.shared.celery_app import (
    TASK_NAMES,
    QueueSettings,
    Runtime,
    create_celery,
    run_envelope_task,
    task_options,
)
from stitchcuda.shared.envelope import encode, new_envelope
from stitchcuda.shared.errors import InvalidRequest, NotFound, Unavailable
from stitchcuda.shared.stores import MemoryMessageLedger
from stitchcuda.shared.transport import QUEUES


class FakeTask:
    def __init__(self, retries: int = 0) -> None:
        self.request = SimpleNamespace(retries=retries)
        self.countdowns: list[float] = []

    def retry(self, exc: BaseException, countdown: float) -> Retry:
        self.countdowns.append(countdown)
        return Retry(exc=exc, when=countdown)


def message() -> tuple[messages_pb2.Envelope, bytes]:
    env = new_envelope("job1", "acme", 2)
    env.plan_request.reference_key = "tenants/acme/jobs/job1/reference.py"
    return env, encode(env)


def runtime(handle, **kw) -> tuple[Runtime, list[str]]:  # type: ignore[no-untyped-def]
    failures: list[str] = []
    settings = QueueSettings(task_max_retries=2, max_deliveries=2, retry_backoff_s=1, retry_backoff_max_s=3)
    rt = Runtime(handle, lambda env, reason: failures.append(reason), MemoryMessageLedger(), settings, **kw)
    return rt, failures


def test_the_app_is_msgpack_only_acks_late_prefetch_one_with_routes_and_limits():
    settings = QueueSettings()
    conf = create_celery(settings).conf
    assert conf.task_serializer == "msgpack" and conf.accept_content == ["msgpack"]
    assert conf.result_accept_content == ["msgpack"]
    assert conf.task_acks_late and conf.task_reject_on_worker_lost and conf.worker_prefetch_multiplier == 1
    assert {q.name for q in conf.task_queues} == set(QUEUES)
    assert {conf.task_routes[TASK_NAMES[q]]["queue"] for q in QUEUES} == set(QUEUES)
    longest = max(settings.time_limits().values())
    assert conf.broker_transport_options["visibility_timeout"] > longest
    for queue in QUEUES:
        options = task_options(queue, settings)
        assert options["acks_late"] and options["reject_on_worker_lost"]
        assert 0 < options["soft_time_limit"] < options["time_limit"]


def test_a_visibility_timeout_below_the_longest_task_is_refused_at_start_up():
    with pytest.raises(ValueError, match="VISIBILITY_TIMEOUT"):
        QueueSettings(time_limit_verify_s=4000, visibility_timeout_s=3900)


def test_success_marks_the_message_done_and_a_redelivery_is_skipped():
    calls: list[bytes] = []
    rt, failures = runtime(calls.append)
    env, data = message()
    run_envelope_task(FakeTask(), data, rt, "planner")
    run_envelope_task(FakeTask(), data, rt, "planner")
    assert calls == [data] and failures == []
    assert rt.ledger.is_done(env.message_id)


def test_unavailable_is_retried_with_backoff_then_reported():
    def down(data: bytes) -> None:
        raise Unavailable("S3 down")

    rt, failures = runtime(down)
    _, data = message()
    for retries, expected in ((0, 1.0), (1, 2.0)):
        task = FakeTask(retries)
        with pytest.raises(Retry):
            run_envelope_task(task, data, rt, "coder")
        assert task.countdowns == [expected]
    run_envelope_task(FakeTask(2), data, rt, "coder")  # retries used up: the job hears about it
    assert len(failures) == 1 and "gave up after 2 retries" in failures[0]


@pytest.mark.parametrize(
    ("error", "reported"),
    [
        (InvalidRequest("bad plan"), "bad plan"),
        (SoftTimeLimitExceeded(), "time limit"),
        (RuntimeError("bug"), "internal error: RuntimeError: bug"),
    ],
)
def test_permanent_failures_are_reported_to_the_job_once(error: BaseException, reported: str):
    def fail(data: bytes) -> None:
        raise error

    rt, failures = runtime(fail)
    env, data = message()
    run_envelope_task(FakeTask(), data, rt, "verifier.cpu")
    assert len(failures) == 1 and reported in failures[0]
    assert rt.ledger.is_done(env.message_id)


def test_a_message_for_an_unknown_job_is_dropped_without_a_report():
    def missing(data: bytes) -> None:
        raise NotFound("job not found")

    rt, failures = runtime(missing)
    run_envelope_task(FakeTask(), message()[1], rt, "planner")
    assert failures == []


def test_malformed_bytes_are_dropped():
    rt, failures = runtime(lambda data: pytest.fail("must not run"))
    for data in (b"", b"\xff\x00", encode(messages_pb2.Envelope(schema_version=1))):
        run_envelope_task(FakeTask(), data, rt, "planner")
    assert failures == []


def test_a_poison_message_that_keeps_killing_its_worker_is_reported_not_looped():
    calls: list[bytes] = []
    rt, failures = runtime(calls.append)
    env, data = message()
    rt.ledger.delivered(env.message_id, 0)
    rt.ledger.delivered(env.message_id, 0)  # two deliveries whose worker died mid-task
    run_envelope_task(FakeTask(), data, rt, "verifier.gpu")
    assert calls == [] and "died 2 times" in failures[0]


def test_gpu_time_is_metered_per_delivery():
    seen: list[tuple[str, str, float]] = []
    rt, _ = runtime(lambda data: None, on_finished=lambda q, env, s: seen.append((q, env.tenant_id, s)))
    run_envelope_task(FakeTask(), message()[1], rt, "verifier.gpu")
    assert seen and seen[0][:2] == ("verifier.gpu", "acme") and seen[0][2] >= 0
