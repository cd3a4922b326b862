"""RFC 9457 problem bodies and the one mapping of errors and result statuses to HTTP."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tidegate.clients.producer import PublishError, RecordTooLargeError
from tidegate.core.errors import (
    ArtifactError,
    ConcurrencyConflictError,
    DeadlineExceededError,
    IncompatibleSchemaError,
    InvalidInputError,
    InvalidSchemaError,
    InvalidTransitionError,
    MalformedRequestError,
    ModelExecutionError,
    ModelNotFoundError,
    ModelUnavailableError,
    OverloadedError,
    PromotionGateError,
    RegistryUnavailableError,
    ResultTimeoutError,
    SchemaMismatchError,
    SubjectNotFoundError,
    TidegateError,
)
from tidegate.gateway.http_errors import (
    PayloadTooLargeError,
    RequestInFlightError,
    RequestNotFoundError,
    StoreUnavailableError,
    UnsupportedMediaTypeError,
)
from tidegate.gateway.problems import (
    PROBLEM_JSON,
    error_problem,
    registry_status_for_error,
    result_problem,
    status_for_error,
    status_for_result,
)
from tidegate.schemas.records import ResultRecord


@pytest.mark.parametrize(
    ("error", "status"),
    [
        (InvalidInputError("x", "f"), 400),
        (MalformedRequestError("x"), 400),
        (SchemaMismatchError("x"), 400),
        (PayloadTooLargeError("x"), 413),
        (RecordTooLargeError(2_000_000, 1_000_000), 413),
        (RequestInFlightError("r"), 409),
        (UnsupportedMediaTypeError("x"), 415),
        (ModelNotFoundError("x"), 404),
        (RequestNotFoundError("x"), 404),
        (DeadlineExceededError("x"), 504),
        (ResultTimeoutError("x"), 504),
        (OverloadedError("x"), 503),
        (ModelUnavailableError("x"), 503),
        (PublishError("x"), 503),
        (StoreUnavailableError("x"), 503),
        (RegistryUnavailableError("x"), 503),
        (ModelExecutionError("x"), 500),
        (ArtifactError("x"), 422),
        (InvalidTransitionError("x"), 422),
        (PromotionGateError("x"), 422),
        (ConcurrencyConflictError("m", 1, 2), 409),
        (TidegateError("x"), 500),
    ],
)
def test_error_status(error: TidegateError, status: int) -> None:
    assert status_for_error(error) == status


@pytest.mark.parametrize(
    ("error", "v2_status", "registry_status"),
    [
        (SubjectNotFoundError("x"), 500, 404),
        (IncompatibleSchemaError("x"), 500, 409),
        (InvalidSchemaError("x"), 500, 422),
        (RegistryUnavailableError("x"), 503, 503),
        (InvalidInputError("x"), 400, 400),
    ],
)
def test_registry_errors_keep_confluent_statuses_on_the_registry_api_alone(
    error: TidegateError, v2_status: int, registry_status: int
) -> None:
    assert status_for_error(error) == v2_status
    assert registry_status_for_error(error) == registry_status


@pytest.mark.parametrize(
    ("status", "http"),
    [
        ("OK", 200),
        ("INVALID", 400),
        ("NOT_FOUND", 404),
        ("DEADLINE_EXCEEDED", 504),
        ("ERROR", 500),
        ("UNAVAILABLE", 503),
        ("UNKNOWN", 500),
    ],
)
def test_result_status(status: str, http: int) -> None:
    assert status_for_result(status) == http


def body_of(response: Any) -> dict[str, Any]:
    assert response.media_type == PROBLEM_JSON
    parsed: dict[str, Any] = json.loads(response.body)
    return parsed


def test_error_problem_members() -> None:
    response = error_problem(
        InvalidInputError("input 'x' must be FP32", "x"),
        instance="/v2/requests/r1",
        request_id="r1",
    )
    body = body_of(response)
    assert response.status_code == 400
    assert body == {
        "type": "urn:tidegate:problem:invalid-input",
        "title": "Bad Request",
        "status": 400,
        "detail": "input 'x' must be FP32",
        "instance": "/v2/requests/r1",
        "error": "input 'x' must be FP32",
        "code": "INVALID_INPUT",
        "retriable": False,
        "field": "x",
        "request_id": "r1",
    }


def test_shedding_says_when_to_retry() -> None:
    response = error_problem(OverloadedError("busy"), instance="/v2/models/m/infer")
    assert response.status_code == 503
    assert response.headers["retry-after"] == "1"
    assert body_of(response)["retriable"] is True


def test_a_record_too_large_for_kafka_names_the_limit() -> None:
    response = error_problem(RecordTooLargeError(1_024_321, 1_000_000), instance="/v2/requests/r")
    body = body_of(response)
    assert response.status_code == 413
    assert (body["code"], body["retriable"]) == ("RECORD_TOO_LARGE", False)
    assert (body["max_bytes"], body["size_bytes"]) == (1_000_000, 1_024_321)
    assert "1000000 bytes" in body["detail"]


def test_a_request_in_flight_is_retried_later() -> None:
    response = error_problem(RequestInFlightError("r"), instance="/v2/requests/r")
    assert response.status_code == 409
    assert response.headers["retry-after"] == "1"
    assert body_of(response)["retriable"] is True


def test_result_problem_carries_the_structured_error() -> None:
    result: ResultRecord = {
        "request_id": "r2",
        "model": "fraud",
        "model_version": "1",
        "status": "ERROR",
        "completed_at": 0,
        "error": {
            "code": "MODEL_ERROR",
            "message": "onnxruntime failed",
            "error_class": "ModelExecutionError",
            "retriable": False,
            "field": None,
            "details": {"node": "Gemm_0"},
        },
    }
    response = result_problem(result, instance="/v2/requests/r2")
    body = body_of(response)
    assert response.status_code == 500
    assert body["code"] == "MODEL_ERROR"
    assert body["detail"] == "onnxruntime failed"
    assert body["error_class"] == "ModelExecutionError"
    assert body["details"] == {"node": "Gemm_0"}
    assert body["request_id"] == "r2"
    assert body["model_version"] == "1"
    assert body["result_status"] == "ERROR"
    assert "field" not in body


def test_result_problem_without_error_record() -> None:
    result: ResultRecord = {
        "request_id": "r3",
        "model": "m",
        "status": "DEADLINE_EXCEEDED",
        "error": None,
        "completed_at": 0,
    }
    body = body_of(result_problem(result, instance="/v2/requests/r3"))
    assert body["status"] == 504
    assert body["code"] == "DEADLINE_EXCEEDED"
