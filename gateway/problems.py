"""RFC 9457 problem details, and the one mapping from the tidegate error tree to HTTP status codes.

Domain code raises `TidegateError`s and workers answer result statuses; only this module turns
either into a status code, for every HTTP API alike: the V2 facade, `/admin` and the schema
registry's REST API (which writes Confluent's `{"error_code", "message"}` body, but takes its status
from here too). Each body carries the standard members (`type`, `title`, `status`,
`detail`, `instance`) and extensions: `code` and `retriable` from the error, `field` naming the
field at fault, `request_id` when known, and `error` (a copy of `detail`) because V2 clients, such
as tritonclient, read the message of a failed call from `error`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from http import HTTPStatus
from typing import Any

from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from tidegate.clients.producer import RecordTooLargeError
from tidegate.core.errors import (
    ArtifactError,
    AuthenticationError,
    ConcurrencyConflictError,
    DeadlineExceededError,
    InvalidInputError,
    InvalidTransitionError,
    ModelExecutionError,
    ModelNotFoundError,
    ModelUnavailableError,
    OverloadedError,
    PermissionDeniedError,
    RateLimitedError,
    ResultTimeoutError,
    RetriableError,
    SchemaRegistryError,
    SerializationError,
    TidegateError,
)
from tidegate.gateway.http_errors import (
    PayloadTooLargeError,
    RequestIdTakenError,
    RequestInFlightError,
    RequestNotFoundError,
    UnsupportedMediaTypeError,
)
from tidegate.schemas.records import ErrorRecord, ResultRecord

__all__ = [
    "BEARER_CHALLENGE",
    "PROBLEM_JSON",
    "ProblemResponse",
    "error_problem",
    "problem",
    "problem_type",
    "registry_http_status",
    "registry_status_for_error",
    "result_problem",
    "status_for_error",
    "status_for_error_type",
    "status_for_result",
    "validation_problem",
]

PROBLEM_JSON = "application/problem+json"
RETRY_AFTER_S = 1
BEARER_CHALLENGE = 'Bearer realm="tidegate"'

# Most specific first: the first class an error is an instance of decides.
_ERROR_STATUS: tuple[tuple[type[TidegateError], int], ...] = (
    # Who is calling is unknown (401, with a `WWW-Authenticate` challenge), or may not do this.
    (AuthenticationError, 401),
    (PermissionDeniedError, 403),
    # The model changed since the caller read it: nothing was written, read again and decide.
    (ConcurrencyConflictError, 409),
    # A request id the caller chose is another caller's stored request.
    (RequestIdTakenError, 409),
    # An asynchronous request of this id is still being published: retry to learn its fate.
    (RequestInFlightError, 409),
    # Well-formed, but refused: a transition the state does not allow, a package that fails.
    (InvalidTransitionError, 422),
    (ArtifactError, 422),
    (PayloadTooLargeError, 413),
    # The body fits, but its record does not fit a Kafka message.
    (RecordTooLargeError, 413),
    (UnsupportedMediaTypeError, 415),
    (InvalidInputError, 400),
    (SerializationError, 400),
    (ModelNotFoundError, 404),
    (RequestNotFoundError, 404),
    (RateLimitedError, 429),
    (DeadlineExceededError, 504),
    (ResultTimeoutError, 504),
    (OverloadedError, 503),
    (ModelUnavailableError, 503),
    (ModelExecutionError, 500),
    (RetriableError, 503),
)

# A deadline that passed is a gateway timeout: the upstream (the worker) did not answer in time,
# which is 504; 408 would blame the client for being slow to send its request.
_RESULT_STATUS: dict[str, int] = {
    "OK": 200,
    "INVALID": 400,
    "NOT_FOUND": 404,
    "DEADLINE_EXCEEDED": 504,
    "ERROR": 500,
    "UNAVAILABLE": 503,
}
_RESULT_CODE: dict[str, str] = {
    "INVALID": InvalidInputError.code,
    "NOT_FOUND": ModelNotFoundError.code,
    "DEADLINE_EXCEEDED": DeadlineExceededError.code,
    "ERROR": ModelExecutionError.code,
    "UNAVAILABLE": ModelUnavailableError.code,
}


class ProblemResponse(JSONResponse):
    media_type = PROBLEM_JSON


def registry_http_status(error_code: int) -> int:
    """Confluent's rule: a 3-digit code is the status; a 5-digit one carries it in its first 3."""
    return error_code if error_code < 1000 else error_code // 100


def status_for_error(error: TidegateError) -> int:
    return status_for_error_type(type(error))


def status_for_error_type(error_type: type[TidegateError]) -> int:
    """The status every error of this class answers: what the OpenAPI documents for a route
    that raises it (`tidegate.gateway.openapi.openapi_docs`)."""
    return next((status for cls, status in _ERROR_STATUS if issubclass(error_type, cls)), 500)


def registry_status_for_error(error: TidegateError) -> int:
    """The registry API's statuses: the shared map first (a registry that is not ready is
    retriable: 503), then Confluent's numeric codes, which its clients expect. Elsewhere a
    registry error is the server's own fault (500), never a 404 that would read as "no model"."""
    status = next((status for cls, status in _ERROR_STATUS if isinstance(error, cls)), None)
    if status is not None:
        return status
    if isinstance(error, SchemaRegistryError):
        return registry_http_status(error.error_code)
    return 500


def validation_problem(exc: RequestValidationError, *, instance: str) -> ProblemResponse:
    """A request FastAPI could not bind (a missing field, a wrong type) is the caller's invalid
    input: the first error names the field."""
    first = exc.errors()[0] if exc.errors() else {}
    field = ".".join(str(p) for p in first.get("loc", ())) or None
    return error_problem(InvalidInputError(str(first.get("msg", exc)), field), instance=instance)


def status_for_result(status: str) -> int:
    """HTTP status of a result status; UNKNOWN (a symbol newer than this reader) is a 500."""
    return _RESULT_STATUS.get(status, 500)


def problem_type(code: str) -> str:
    # Not dereferenceable on purpose (RFC 9457 3.1.1 allows it): the code is the identifier.
    return f"urn:tidegate:problem:{code.lower().replace('_', '-')}"


def problem(
    status: int,
    detail: str,
    *,
    instance: str,
    code: str | None = None,
    title: str | None = None,
    headers: Mapping[str, str] | None = None,
    **extensions: Any,
) -> ProblemResponse:
    """A problem response; extension members whose value is None are left out."""
    phrase = HTTPStatus(status).phrase
    body: dict[str, Any] = {
        "type": problem_type(code) if code else "about:blank",
        "title": title or phrase,
        "status": status,
        "detail": detail,
        "instance": instance,
        "error": detail,
    }
    if code:
        body["code"] = code
    body.update({key: value for key, value in extensions.items() if value is not None})
    out_headers = dict(headers or {})
    if status == 503:
        out_headers.setdefault("Retry-After", str(RETRY_AFTER_S))
    if status == 401:
        # RFC 9110 11.6.1: a 401 says how to authenticate (RFC 6750's bearer scheme).
        out_headers.setdefault("WWW-Authenticate", BEARER_CHALLENGE)
    return ProblemResponse(body, status_code=status, headers=out_headers)


def error_problem(
    error: TidegateError,
    *,
    instance: str,
    request_id: str | None = None,
    headers: Mapping[str, str] | None = None,
) -> ProblemResponse:
    extensions: dict[str, Any] = {}
    if isinstance(error, ConcurrencyConflictError):
        extensions = {"expected_sequence": error.expected, "actual_sequence": error.actual}
    # Refusals that know when there is room again (a rate limit, shedding, an open breaker).
    wait_s = getattr(error, "retry_after_s", None)
    if wait_s is not None:
        # RFC 9110 Retry-After is whole seconds; rounding up never invites a retry that is early.
        retry_after = max(1, math.ceil(wait_s))
        headers = {**(headers or {}), "Retry-After": str(retry_after)}
        extensions = {"retry_after_s": retry_after}
    if isinstance(error, RequestInFlightError):
        headers = {**(headers or {}), "Retry-After": str(RETRY_AFTER_S)}
    if isinstance(error, RecordTooLargeError):
        extensions = {"max_bytes": error.limit, "size_bytes": error.size}
    return problem(
        status_for_error(error),
        str(error) or type(error).__name__,
        instance=instance,
        code=error.code,
        headers=headers,
        retriable=error.retriable,
        field=getattr(error, "field", None),
        request_id=request_id,
        **extensions,
    )


def result_problem(result: ResultRecord, *, instance: str) -> ProblemResponse:
    """The problem body of a result that is not OK, carrying its structured error."""
    status = str(result.get("status"))
    error: ErrorRecord = result.get("error") or {"code": "", "message": ""}
    code = error["code"] or _RESULT_CODE.get(status, "INTERNAL")
    return problem(
        status_for_result(status),
        error["message"] or f"the request ended with status {status}",
        instance=instance,
        code=code,
        result_status=status,
        retriable=error.get("retriable", False),
        field=error.get("field"),
        error_class=error.get("error_class") or None,
        details=dict(error.get("details") or {}) or None,
        request_id=result.get("request_id"),
        model_name=result.get("model"),
        model_version=result.get("model_version"),
    )
