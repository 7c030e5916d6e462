"""Envelopes, artifact stores, the memory job store and problem validation."""

import threading
import time

import pytest

from stitchcuda.api.v1 import jobs_pb2, messages_pb2
from stitchcuda.shared.artifacts import Keys, LocalArtifactStore, MemoryArtifactStore
from stitchcuda.shared.envelope import SCHEMA_VERSION, decode, encode, new_envelope
from stitchcuda.shared.errors import InvalidRequest, NotFound, ProblemError, UnsupportedVersion
from stitchcuda.shared.jobstore import MemoryJobStore
from stitchcuda.shared.problem import load, validate_source


def test_envelope_round_trip():
    env = new_envelope("job1", "acme", round_=2)
    env.plan_request.reference_key = "tenants/acme/jobs/job1/reference.py"
    back = decode(encode(env))
    assert back.job_id == "job1" and back.round == 2 and back.schema_version == SCHEMA_VERSION
    assert back.WhichOneof("body") == "plan_request"


@pytest.mark.parametrize(
    ("data", "error", "match"),
    [
        (b"\xff\xff\xff garbage", InvalidRequest, "malformed envelope"),
        (messages_pb2.Envelope(job_id="j").SerializeToString(), InvalidRequest, "schema_version"),
        (messages_pb2.Envelope(schema_version=1, job_id="j").SerializeToString(), InvalidRequest, "body"),
        (
            messages_pb2.Envelope(
                schema_version=99, job_id="j", plan_ready=messages_pb2.PlanReady()
            ).SerializeToString(),
            UnsupportedVersion,
            "newer",
        ),
    ],
)
def test_bad_envelopes_are_rejected_with_a_reason(data, error, match):
    with pytest.raises(error, match=match):
        decode(data)


def test_unknown_fields_of_a_newer_writer_are_tolerated():
    env = new_envelope("j", "t")
    env.plan_ready.plan_key = "k"
    data = encode(env) + b"\xf8\x07\x01"  # field 127, varint 1: unknown to this build
    assert decode(data).plan_ready.plan_key == "k"


@pytest.mark.parametrize("store_kind", ["memory", "local"])
def test_artifact_stores(tmp_path, store_kind):
    store = MemoryArtifactStore() if store_kind == "memory" else LocalArtifactStore(tmp_path)
    key = Keys.reference("acme", "job1")
    store.put(key, b"print(1)")
    assert store.exists(key) and store.get(key) == b"print(1)"
    store.put(Keys.candidate("acme", "job1", 0, 0), b"c")
    assert store.list("tenants/acme/jobs/job1/rounds/") == [
        "tenants/acme/jobs/job1/rounds/000/candidate-0.pb"
    ]
    store.delete(key)
    with pytest.raises(NotFound):
        store.get(key)
    for bad in ("../etc/passwd", "/abs", "a//b", "tenants/../x", ""):
        with pytest.raises(InvalidRequest):
            store.put(bad, b"x")


def test_memory_job_store_events_and_guards():
    store = MemoryJobStore()
    store.create(jobs_pb2.Job(job_id="j1", tenant_id="t"))
    assert store.claim("g") and not store.claim("g")
    got = []

    def reader():
        got.extend(store.read_events("j1", "", timeout_s=5))

    thread = threading.Thread(target=reader)
    thread.start()
    time.sleep(0.05)
    seq = store.append_event(jobs_pb2.JobEvent(job_id="j1", message="hello"))
    thread.join(2)
    assert [e.message for e in got] == ["hello"]
    assert store.read_events("j1", seq) == []
    with pytest.raises(NotFound):
        store.get("missing")


def test_job_store_lists_only_the_tenants_jobs_with_paging():
    store = MemoryJobStore()
    for i in range(5):
        job = jobs_pb2.Job(job_id=f"j{i}", tenant_id="a" if i < 4 else "b")
        job.created_at.FromSeconds(1000 + i)
        store.create(job)
    page, token = store.list_jobs("a", limit=3)
    assert [j.job_id for j in page] == ["j3", "j2", "j1"] and token
    rest, token2 = store.list_jobs("a", limit=3, page_token=token)
    assert [j.job_id for j in rest] == ["j0"] and token2 == ""


@pytest.mark.parametrize(
    ("source", "match"),
    [
        ("", "empty"),
        ("def f(:\n", "syntax error at line 1"),
        ("class Model: pass\n", "does not define get_inputs, get_init_inputs"),
        ("x" * 300_000, "limit"),
    ],
)
def test_problem_validation_names_the_problem(source, match):
    with pytest.raises(ProblemError, match=match):
        validate_source(source)


def test_problem_load_reports_missing_file(tmp_path):
    with pytest.raises(ProblemError, match="no such file"):
        load(tmp_path / "nope.py")
