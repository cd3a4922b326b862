"""Builders of `DeadLetterEnvelope` records and of the `ErrorInfo` they (and results) carry.

An envelope keeps everything needed to replay a message: its original key, value and headers
byte for byte, where it was read from, and why and how often processing failed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from tidegate.core.errors import TidegateError
from tidegate.schemas.records import ErrorRecord, SourcePositionRecord

__all__ = ["dead_letter", "error_info", "source_position"]

Headers = Sequence[tuple[str, bytes | None]]


def error_info(
    exc: BaseException, *, field: str | None = None, details: Mapping[str, str] | None = None
) -> ErrorRecord:
    """A structured `ErrorInfo` record: the stable code and class come from the error tree."""
    if isinstance(exc, TidegateError):
        code, retriable = exc.code, exc.retriable
    else:
        code, retriable = TidegateError.code, False
    return {
        "code": code,
        "message": str(exc) or type(exc).__name__,
        "error_class": type(exc).__name__,
        "retriable": retriable,
        "field": field if field is not None else getattr(exc, "field", None),
        "details": dict(details or {}),
    }


def source_position(topic: str, partition: int, offset: int) -> SourcePositionRecord:
    return {"topic": topic, "partition": partition, "offset": offset}


def dead_letter(
    *,
    source: Mapping[str, Any],
    error: Mapping[str, Any],
    key: bytes | None,
    value: bytes | None,
    headers: Headers | None,
    timestamp_ms: int | None,
    failed_at_ms: int,
    first_failed_at_ms: int | None = None,
    attempt: int = 1,
    request_id: str | None = None,
    model: str | None = None,
    worker_id: str | None = None,
    origin: Mapping[str, Any] | None = None,
    history: Sequence[Mapping[str, Any]] = (),
    retry_at_ms: int | None = None,
) -> dict[str, Any]:
    """A `DeadLetterEnvelope` record for one message that could not be processed (or, with
    `retry_at_ms`, that waits on a retry topic)."""
    return {
        "original_key": key,
        "original_value": value,
        "original_headers": [{"key": k, "value": v} for k, v in headers or ()],
        "source": dict(source),
        "original_timestamp": timestamp_ms,
        "error": dict(error),
        "attempt": max(1, attempt),
        "first_failed_at": first_failed_at_ms if first_failed_at_ms is not None else failed_at_ms,
        "failed_at": failed_at_ms,
        "request_id": request_id,
        "model": model,
        "worker_id": worker_id,
        "origin": dict(origin) if origin is not None else None,
        "history": [dict(item) for item in history],
        "retry_at": retry_at_ms,
    }
