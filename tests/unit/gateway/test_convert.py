"""Strict request parsing (binary and JSON) and the JSON/SSE renderings of the HTTP API."""

import json

import pytest

from stitchcuda.api.v1 import gateway_pb2, jobs_pb2
from stitchcuda.gateway.convert import (
    event_to_sse,
    job_summary,
    parse_binary,
    parse_json,
    parse_state,
    to_json,
    unknown_field_paths,
)
from stitchcuda.shared.errors import InvalidRequest, UnsupportedVersion


def test_unknown_fields_are_found_in_nested_messages_and_maps():
    request = gateway_pb2.SubmitRequest(spec=jobs_pb2.JobSpec(problem_name="p"))
    request.spec.options.MergeFromString(b"\xa0\x06\x05")
    assert unknown_field_paths(request) == ["SubmitRequest.spec.options.#100"]
    job = jobs_pb2.Job()
    job.rounds.add().MergeFromString(b"\xa0\x06\x05")
    assert unknown_field_paths(job) == ["Job.rounds[0].#100"]
    assert unknown_field_paths(jobs_pb2.Job(artifacts={"a": "b"})) == []


def test_parse_binary_refuses_corrupt_newer_and_unknown():
    good = gateway_pb2.SubmitRequest(schema_version=1, spec=jobs_pb2.JobSpec(problem_name="p"))
    assert parse_binary(good.SerializeToString(), gateway_pb2.SubmitRequest) == good
    with pytest.raises(InvalidRequest, match="malformed SubmitRequest"):
        parse_binary(b"\x0a\xff", gateway_pb2.SubmitRequest)
    with pytest.raises(UnsupportedVersion, match="newer"):
        parse_binary(
            gateway_pb2.SubmitRequest(schema_version=9).SerializeToString(), gateway_pb2.SubmitRequest
        )
    with pytest.raises(InvalidRequest, match="#55"):
        parse_binary(good.SerializeToString() + b"\xb8\x03\x01", gateway_pb2.SubmitRequest)


def test_parse_json_accepts_both_name_styles_and_refuses_unknown_names():
    snake = parse_json({"spec": {"problem_name": "p", "device": "DEVICE_CPU"}}, gateway_pb2.SubmitRequest)
    camel = parse_json({"spec": {"problemName": "p", "device": "DEVICE_CPU"}}, gateway_pb2.SubmitRequest)
    assert snake == camel and snake.spec.device == jobs_pb2.DEVICE_CPU
    with pytest.raises(InvalidRequest, match="flavour"):
        parse_json({"spec": {"flavour": "x"}}, gateway_pb2.SubmitRequest)
    with pytest.raises(InvalidRequest, match="JSON object"):
        parse_json("spec", gateway_pb2.SubmitRequest)
    with pytest.raises(UnsupportedVersion):
        parse_json({"schemaVersion": 5}, gateway_pb2.SubmitRequest)


def test_states_parse_from_short_and_long_names():
    assert parse_state("") == 0
    assert parse_state("succeeded") == parse_state("JOB_STATE_SUCCEEDED") == jobs_pb2.JOB_STATE_SUCCEEDED
    with pytest.raises(InvalidRequest):
        parse_state("sleeping")


def test_json_and_sse_renderings():
    job = jobs_pb2.Job(
        job_id="j", spec=jobs_pb2.JobSpec(reference_source="big source"), status=jobs_pb2.JobStatus()
    )
    data = to_json(job)
    # Defaults are spelled out (a client need not know proto3's omissions); enums by name.
    assert data["job_id"] == "j" and data["status"]["state"] == "JOB_STATE_UNSPECIFIED"
    assert data["status"]["round"] == 0 and data["rounds"] == []
    assert job_summary(job).spec.reference_source == "" and job.spec.reference_source == "big source"
    event = jobs_pb2.JobEvent(job_id="j", seq="17-0", kind=jobs_pb2.EVENT_KIND_VERDICT, message="ok")
    text = event_to_sse(event)
    lines = text.split("\n")
    assert lines[0] == "id: 17-0" and lines[1] == "event: verdict" and text.endswith("\n\n")
    assert json.loads(lines[2].removeprefix("data: "))["message"] == "ok"
