"""The one error table: every domain error has an HTTP status and a gRPC code; unknown errors are 500."""

import grpc
import pytest

from stitchcuda.gateway.errors import TABLE, error_body, status_of
from stitchcuda.shared import errors


def all_subclasses(cls: type) -> set[type]:
    out = set()
    for sub in cls.__subclasses__():
        out |= {sub} | all_subclasses(sub)
    return out


def test_every_domain_error_is_in_the_table():
    for cls in all_subclasses(errors.StitchError) | {errors.StitchError}:
        if cls.__module__ == errors.__name__:
            assert cls in TABLE, cls


@pytest.mark.parametrize(
    ("exc", "http", "code"),
    [
        (errors.InvalidRequest("x"), 400, grpc.StatusCode.INVALID_ARGUMENT),
        (errors.ProblemError("x"), 400, grpc.StatusCode.INVALID_ARGUMENT),
        (errors.UnsupportedVersion("x"), 400, grpc.StatusCode.INVALID_ARGUMENT),
        (errors.Unauthenticated("x"), 401, grpc.StatusCode.UNAUTHENTICATED),
        (errors.PermissionDenied("x"), 403, grpc.StatusCode.PERMISSION_DENIED),
        (errors.NotFound("x"), 404, grpc.StatusCode.NOT_FOUND),
        (errors.Conflict("x"), 409, grpc.StatusCode.ABORTED),
        (errors.QuotaExceeded("x"), 429, grpc.StatusCode.RESOURCE_EXHAUSTED),
        (errors.Unavailable("x"), 503, grpc.StatusCode.UNAVAILABLE),
        (errors.DeadlineExceeded("x"), 504, grpc.StatusCode.DEADLINE_EXCEEDED),
        (errors.StitchError("x"), 500, grpc.StatusCode.INTERNAL),
        (RuntimeError("bug"), 500, grpc.StatusCode.INTERNAL),
    ],
)
def test_status_of(exc: Exception, http: int, code: grpc.StatusCode):
    status = status_of(exc)
    assert (status.http, status.grpc) == (http, code)


def test_a_subclass_defined_elsewhere_inherits_its_parents_status():
    class BudgetExceeded(errors.QuotaExceeded):
        pass

    assert status_of(BudgetExceeded("x")).http == 429


def test_error_body_carries_code_message_and_detail():
    assert error_body(errors.NotFound("job not found: x")) == {
        "error": {"code": "not_found", "message": "job not found: x"}
    }
    body = error_body(errors.ProblemError("bad", detail="line 3"))
    assert body["error"] == {"code": "invalid_problem", "message": "bad", "detail": "line 3"}
