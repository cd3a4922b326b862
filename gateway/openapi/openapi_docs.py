"""The gateway's OpenAPI (`install_openapi`): every status each operation answers, with its real
body, rewritten from one table of route kinds (`RouteKind`) and the one error map in
`tidegate.gateway.problems`, so a status changed there is documented everywhere it applies.
What and how: docs/openapi.md ("What it documents", "How CI checks it").
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

from fastapi import FastAPI

from tidegate.clients.producer import PublishError, RecordTooLargeError
from tidegate.core.errors import (
    ArtifactError,
    AuthenticationError,
    ConcurrencyConflictError,
    DeadlineExceededError,
    InvalidInputError,
    InvalidTransitionError,
    LifecycleUnavailableError,
    ModelExecutionError,
    ModelNotFoundError,
    ModelUnavailableError,
    OverloadedError,
    PermissionDeniedError,
    RateLimitedError,
    ResultTimeoutError,
    SerializationError,
    TidegateError,
)
from tidegate.dlq.inspect import DeadLetterUnavailableError
from tidegate.gateway.auth.audit_hooks import PERMISSION_KEY
from tidegate.gateway.auth.identity import Permission
from tidegate.gateway.http_errors import (
    PayloadTooLargeError,
    RequestIdTakenError,
    RequestInFlightError,
    RequestNotFoundError,
    StoreUnavailableError,
    UnsupportedMediaTypeError,
)
from tidegate.gateway.openapi import openapi_schemas as schemas
from tidegate.gateway.problems import PROBLEM_JSON, status_for_error_type, status_for_result
from tidegate.schemas.catalog import INFERENCE_RESULT, load_schema

__all__ = ["PERMISSION_KEY", "RouteKind", "document", "install_openapi", "route_kind"]

Responses = dict[str, dict[str, Any]]


@dataclass(frozen=True)
class RouteKind:
    """What a kind of route answers: its success responses, the errors its code raises, whether
    it renders a worker's result (any result status), and the permission it needs when the route
    declares none."""

    name: str
    permission: Permission
    success: Callable[[str, str], Responses]
    errors: tuple[type[TidegateError], ...] = ()
    results: bool = False

    def error_statuses(self, permission: Permission) -> set[int]:
        """Every status but success; `permission` is the one the route declares."""
        statuses = {status_for_error_type(error) for error in self.errors}
        if self.results:
            statuses |= {status_for_result(symbol) for symbol in _result_symbols()} - {200}
        if permission is not Permission.PUBLIC:
            statuses |= {status_for_error_type(error) for error in _AUTH}
        return statuses


# Credentials that do not hold (401), a permission not granted (403), an address past its budget
# of uncached verifications (429), the key store down (503).
_AUTH = (AuthenticationError, PermissionDeniedError, RateLimitedError, LifecycleUnavailableError)
# Binding the request (path, query, headers, JSON body) fails as InvalidInputError: 400.
_BIND = (InvalidInputError,)
_V2_BODY = (SerializationError, PayloadTooLargeError, UnsupportedMediaTypeError)
_V2_WAIT = (OverloadedError, ModelUnavailableError, DeadlineExceededError, ResultTimeoutError)
_LIFECYCLE = (*_BIND, ModelNotFoundError, RequestNotFoundError, LifecycleUnavailableError)
_DLQ = (*_BIND, RequestNotFoundError, DeadLetterUnavailableError)

# The demo's model (README): "try it out" in Swagger UI, and schemathesis's explicit examples,
# then reach a model that exists rather than only its 404.
_PATH_EXAMPLES = {"model": "fraud", "name": "fraud", "version": "1"}

_KINDS = {
    kind.name: kind
    for kind in (
        RouteKind("live", Permission.PUBLIC, schemas.live),
        RouteKind("ready", Permission.PUBLIC, schemas.ready, (ModelUnavailableError,)),
        RouteKind("metrics", Permission.PUBLIC, schemas.metrics),
        RouteKind("server", Permission.READ, schemas.server_metadata),
        RouteKind("model", Permission.READ, schemas.model_metadata, (ModelNotFoundError,)),
        RouteKind(
            "model_ready",
            Permission.READ,
            schemas.model_ready,
            (ModelNotFoundError, ModelUnavailableError),
        ),
        RouteKind(
            "infer",
            Permission.INFER,
            schemas.inference,
            (
                *_BIND,
                *_V2_BODY,
                ModelNotFoundError,
                *_V2_WAIT,
                ModelExecutionError,
                RateLimitedError,
                RecordTooLargeError,
                PublishError,
                RequestIdTakenError,
                RequestInFlightError,
                StoreUnavailableError,
            ),
            results=True,
        ),
        RouteKind(
            "fetch",
            Permission.INFER,
            schemas.fetched,
            (*_BIND, RequestNotFoundError, StoreUnavailableError),
            results=True,
        ),
        RouteKind("admin_read", Permission.READ, schemas.json_object, _LIFECYCLE),
        RouteKind(
            "admin_write",
            Permission.DEPLOY,
            schemas.json_object,
            (*_LIFECYCLE, ConcurrencyConflictError, InvalidTransitionError, ArtifactError),
        ),
        RouteKind("dlq_read", Permission.ADMIN, schemas.json_object, _DLQ),
        RouteKind(
            "dlq_write", Permission.ADMIN, schemas.json_object, (*_DLQ, InvalidTransitionError)
        ),
    )
}


def route_kind(method: str, path: str) -> RouteKind:
    """The kind of the operation `method path` (an OpenAPI path template)."""
    method = method.lower()
    fixed = {"/v2/health/live": "live", "/v2/health/ready": "ready", "/metrics": "metrics"}
    if path in fixed:
        return _KINDS[fixed[path]]
    if path.startswith("/admin/dlq/"):
        return _KINDS["dlq_read" if method == "get" else "dlq_write"]
    if path.startswith("/admin/"):
        return _KINDS["admin_read" if method == "get" else "admin_write"]
    if path.endswith("/infer"):
        return _KINDS["infer"]
    if path.startswith("/v2/requests/"):
        return _KINDS["fetch"]
    if path.endswith("/ready"):
        return _KINDS["model_ready"]
    return _KINDS["server" if path == "/v2" else "model"]


def _result_symbols() -> list[str]:
    """The result statuses a worker may answer, from the InferenceResult schema itself."""
    (status,) = (f for f in load_schema(INFERENCE_RESULT).parsed["fields"] if f["name"] == "status")
    symbols: list[str] = status["type"]["symbols"]
    return symbols


def _problem_response(status: int) -> dict[str, Any]:
    headers: dict[str, Any] = {}
    if status in (429, 503):
        headers["Retry-After"] = schemas.header("Seconds to wait before trying again.", "integer")
    if status == 401:
        headers["WWW-Authenticate"] = schemas.header("The challenge: `Bearer`.")
    if status == 504:
        headers["Location"] = schemas.header(
            "Where the late result can be fetched.", required=False
        )
    schema = {"allOf": [schemas.PROBLEM_REF, {"properties": {"status": {"const": status}}}]}
    response: dict[str, Any] = {
        "description": HTTPStatus(status).phrase,
        "content": {PROBLEM_JSON: {"schema": schema}},
    }
    if headers:
        response["headers"] = headers
    return response


def _operation(method: str, path: str, operation: dict[str, Any]) -> None:
    kind = route_kind(method, path)
    declared = operation.get(PERMISSION_KEY)
    # Undeclared, the kind's permission decides what is documented; the key stays absent, so the
    # test that every route declares one still sees it missing.
    permission = Permission(declared) if declared else kind.permission
    responses: Responses = {}
    generated = operation.get("responses", {}).get("200", {})
    for status, response in kind.success(method, path).items():
        # A JSON read keeps FastAPI's schema of its return type, when that is all it has.
        if "content" not in response and "content" in generated:
            response = {**response, "content": generated["content"]}
        responses[status] = response
    for error_status in sorted(kind.error_statuses(permission)):
        responses[str(error_status)] = _problem_response(error_status)
    # Copies: no two places of the document share a dict that a reader might resolve in place.
    operation["responses"] = copy.deepcopy(responses)
    for parameter in operation.get("parameters", []):
        example = _PATH_EXAMPLES.get(parameter["name"])
        if parameter["in"] == "path" and example is not None:
            parameter.setdefault("example", example)
    if kind.name == "infer":
        operation["requestBody"] = copy.deepcopy(schemas.infer_body())
        operation.setdefault("parameters", []).extend(copy.deepcopy(schemas.infer_headers()))


def document(openapi: dict[str, Any]) -> dict[str, Any]:
    """`openapi` (FastAPI's document) with every operation's statuses and bodies, in place."""
    for path, item in openapi.get("paths", {}).items():
        for method, operation in item.items():
            _operation(method, path, operation)
    components = openapi.setdefault("components", {}).setdefault("schemas", {})
    for unused in ("HTTPValidationError", "ValidationError"):
        components.pop(unused, None)
    components.update(copy.deepcopy(schemas.COMPONENTS))
    return openapi


def install_openapi(app: FastAPI) -> None:
    """Serve `document(...)` of the app's own OpenAPI at /openapi.json (built once, on first use,
    so routers included after this call are documented too)."""
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = document(generate())
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
