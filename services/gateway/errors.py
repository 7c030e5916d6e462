"""The one table that maps each domain error to an HTTP status and a gRPC status code."""

from __future__ import annotations

from dataclasses import dataclass

import grpc

from stitchcuda.shared.errors import (
    Conflict,
    DeadlineExceeded,
    HarnessError,
    InvalidRequest,
    NotFound,
    PermissionDenied,
    ProblemError,
    QuotaExceeded,
    StitchError,
    Unauthenticated,
    Unavailable,
    UnsupportedVersion,
)


@dataclass(frozen=True)
class Status:
    http: int
    grpc: grpc.StatusCode


# Most specific first is not needed: lookup walks each exception's MRO.
TABLE: dict[type[StitchError], Status] = {
    UnsupportedVersion: Status(400, grpc.StatusCode.INVALID_ARGUMENT),
    ProblemError: Status(400, grpc.StatusCode.INVALID_ARGUMENT),
    InvalidRequest: Status(400, grpc.StatusCode.INVALID_ARGUMENT),
    Unauthenticated: Status(401, grpc.StatusCode.UNAUTHENTICATED),
    PermissionDenied: Status(403, grpc.StatusCode.PERMISSION_DENIED),
    NotFound: Status(404, grpc.StatusCode.NOT_FOUND),
    Conflict: Status(409, grpc.StatusCode.ABORTED),
    # The harness cannot verify this problem here (the machine is too small, the reference fails): the
    # request was understood, retrying it unchanged will not help.
    HarnessError: Status(422, grpc.StatusCode.FAILED_PRECONDITION),
    QuotaExceeded: Status(429, grpc.StatusCode.RESOURCE_EXHAUSTED),
    Unavailable: Status(503, grpc.StatusCode.UNAVAILABLE),
    DeadlineExceeded: Status(504, grpc.StatusCode.DEADLINE_EXCEEDED),
    StitchError: Status(500, grpc.StatusCode.INTERNAL),
}
INTERNAL = Status(500, grpc.StatusCode.INTERNAL)


def status_of(exc: BaseException) -> Status:
    for cls in type(exc).__mro__:
        if cls in TABLE:
            return TABLE[cls]
    return INTERNAL


def error_body(exc: StitchError) -> dict[str, dict[str, str]]:
    """The JSON error of the HTTP API: a stable code, the message, and any detail."""
    body = {"code": exc.code, "message": exc.message}
    if exc.detail:
        body["detail"] = exc.detail
    return {"error": body}
