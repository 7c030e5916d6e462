"""Domain errors that know no transport; gateway.errors maps each to an HTTP status and a gRPC code."""

from __future__ import annotations


class StitchError(Exception):
    """Base of every error a user or a caller can act on."""

    code = "internal"

    def __init__(self, message: str, *, detail: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.detail = detail

    def __str__(self) -> str:
        return self.message


class InvalidRequest(StitchError):
    code = "invalid_argument"


class ProblemError(InvalidRequest):
    """The reference program is malformed: does not import, lacks Model/get_inputs, or fails on its inputs.

    `error_code` names how, where that is known: reference_timeout (it loops or hangs),
    reference_out_of_memory, reference_crashed (it raised, or its process died)."""

    code = "invalid_problem"

    def __init__(self, message: str, *, detail: str = "", error_code: str = "") -> None:
        super().__init__(message, detail=detail)
        if error_code:
            self.code = error_code


class HarnessError(StitchError):
    """The verification harness could not do its own part (the reference ran out of memory or time, the
    machine is too small for the problem): no candidate is to blame and another round cannot help."""

    code = "harness_failed"

    def __init__(self, message: str, *, detail: str = "", error_code: str = "harness_failed") -> None:
        super().__init__(message, detail=detail)
        self.error_code = error_code


class NotFound(StitchError):
    code = "not_found"


class Conflict(StitchError):
    code = "conflict"


class Unauthenticated(StitchError):
    code = "unauthenticated"


class PermissionDenied(StitchError):
    code = "permission_denied"


class QuotaExceeded(StitchError):
    code = "quota_exceeded"


class Unavailable(StitchError):
    """A dependency (Redis, S3, an LLM endpoint, a GPU) is down; retrying later may succeed."""

    code = "unavailable"


class DeadlineExceeded(StitchError):
    code = "deadline_exceeded"


class UnsupportedVersion(InvalidRequest):
    """A message carries a schema version newer than this build understands."""

    code = "unsupported_version"
