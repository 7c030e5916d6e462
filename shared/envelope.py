"""Packs and unpacks the protobuf Envelope every queue message travels in, with its version check."""

from __future__ import annotations

import uuid

from google.protobuf.message import DecodeError

from stitchcuda.api.v1 import messages_pb2
from stitchcuda.shared.errors import InvalidRequest, UnsupportedVersion

SCHEMA_VERSION = 1


def new_envelope(job_id: str, tenant_id: str, round_: int = 0, attempt: int = 0) -> messages_pb2.Envelope:
    env = messages_pb2.Envelope(
        schema_version=SCHEMA_VERSION,
        message_id=uuid.uuid4().hex,
        job_id=job_id,
        tenant_id=tenant_id,
        round=round_,
        attempt=attempt,
    )
    env.sent_at.GetCurrentTime()
    return env


def decode(data: bytes) -> messages_pb2.Envelope:
    """Decodes bytes from a queue; malformed or too-new messages raise InvalidRequest with the reason."""
    env = messages_pb2.Envelope()
    try:
        env.ParseFromString(bytes(data))
    except DecodeError as exc:
        raise InvalidRequest(f"malformed envelope: {exc}") from exc
    if env.schema_version == 0:
        raise InvalidRequest("envelope has no schema_version")
    if env.schema_version > SCHEMA_VERSION:
        raise UnsupportedVersion(
            f"envelope schema_version {env.schema_version} is newer than this build ({SCHEMA_VERSION})"
        )
    if not env.job_id or env.WhichOneof("body") is None:
        raise InvalidRequest("envelope lacks a job_id or a body")
    return env


def encode(env: messages_pb2.Envelope) -> bytes:
    return env.SerializeToString(deterministic=True)
