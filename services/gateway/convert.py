"""Proto <-> wire conversions of the gateway: strict parsing of requests, JSON for the HTTP API."""

from __future__ import annotations

from typing import Any, TypeVar

from google.protobuf import json_format, unknown_fields
from google.protobuf.message import DecodeError, Message

from stitchcuda.api.v1 import jobs_pb2
from stitchcuda.shared.envelope import SCHEMA_VERSION
from stitchcuda.shared.errors import InvalidRequest, UnsupportedVersion

M = TypeVar("M", bound=Message)

TERMINAL_STATES = frozenset(
    {jobs_pb2.JOB_STATE_SUCCEEDED, jobs_pb2.JOB_STATE_FAILED, jobs_pb2.JOB_STATE_CANCELLED}
)


def unknown_field_paths(message: Message, prefix: str = "") -> list[str]:
    """Fields present on the wire that this build's schema does not define (a newer client's)."""
    name = prefix or message.DESCRIPTOR.name
    fields = unknown_fields.UnknownFieldSet(message)
    found = [f"{name}.#{fields[i].field_number}" for i in range(len(fields))]
    for descriptor, value in message.ListFields():
        if descriptor.message_type is None:
            continue
        path = f"{name}.{descriptor.name}"
        if descriptor.message_type.GetOptions().map_entry:
            value_field = descriptor.message_type.fields_by_name["value"]
            if value_field.message_type is not None:
                for key, item in value.items():
                    found += unknown_field_paths(item, f"{path}[{key}]")
        elif descriptor.is_repeated:
            for i, item in enumerate(value):
                found += unknown_field_paths(item, f"{path}[{i}]")
        else:
            found += unknown_field_paths(value, path)
    return found


def check_version(schema_version: int) -> None:
    if schema_version > SCHEMA_VERSION:
        raise UnsupportedVersion(
            f"the request's schema_version {schema_version} is newer than this gateway's ({SCHEMA_VERSION}): "
            "upgrade the gateway or use an older client"
        )


def parse_binary(data: bytes, message_type: type[M]) -> M:
    """Parses a protobuf request; corrupt bytes and fields unknown to this schema are refused."""
    message = message_type()
    try:
        message.ParseFromString(bytes(data))
    except DecodeError as exc:
        raise InvalidRequest(f"malformed {message_type.DESCRIPTOR.name}: {exc}") from exc
    version = getattr(message, "schema_version", 0)
    check_version(int(version))
    unknown = unknown_field_paths(message)
    if unknown:
        raise InvalidRequest(
            f"the request has fields this gateway does not know (a newer schema?): {', '.join(unknown[:10])}"
        )
    return message


def parse_json(body: Any, message_type: type[M]) -> M:
    """Parses a JSON request (proto3 JSON: snake_case or lowerCamelCase names, enums by name)."""
    if not isinstance(body, dict):
        raise InvalidRequest(f"the body must be a JSON object ({message_type.DESCRIPTOR.name})")
    version = body.get("schema_version", body.get("schemaVersion", 0))
    if isinstance(version, int):
        check_version(version)
    message = message_type()
    try:
        json_format.ParseDict(body, message, ignore_unknown_fields=False)
    except json_format.ParseError as exc:
        raise InvalidRequest(f"invalid {message_type.DESCRIPTOR.name}: {exc}") from exc
    return message


def to_json(message: Message) -> dict[str, Any]:
    return json_format.MessageToDict(
        message, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )


def job_summary(job: jobs_pb2.Job) -> jobs_pb2.Job:
    """A job without its reference source (List pages stay small)."""
    out = jobs_pb2.Job()
    out.CopyFrom(job)
    out.spec.reference_source = ""
    return out


def state_name(state: int) -> str:
    return jobs_pb2.JobState.Name(state).removeprefix("JOB_STATE_").lower()  # type: ignore[arg-type]


def parse_state(value: str) -> int:
    """ "succeeded", "SUCCEEDED" or "JOB_STATE_SUCCEEDED" -> the enum value ("" = any)."""
    if not value:
        return 0
    name = value.upper()
    name = name if name.startswith("JOB_STATE_") else f"JOB_STATE_{name}"
    try:
        return int(jobs_pb2.JobState.Value(name))
    except ValueError:
        raise InvalidRequest(f"unknown job state {value!r}") from None


def event_to_sse(event: jobs_pb2.JobEvent) -> str:
    """One server-sent event: the seq as its id (Last-Event-ID resumes), the kind as its type."""
    import json

    kind = jobs_pb2.EventKind.Name(event.kind).removeprefix("EVENT_KIND_").lower()
    return f"id: {event.seq}\nevent: {kind}\ndata: {json.dumps(to_json(event), separators=(',', ':'))}\n\n"
