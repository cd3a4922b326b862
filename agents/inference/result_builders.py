"""Builders of `InferenceResult` records: the status an error maps to, timings, lineage."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from tidegate.agents.tasks.inference_task import InferenceTask
from tidegate.core.errors import (
    DeadlineExceededError,
    InvalidInputError,
    ModelNotFoundError,
    RetriableError,
)
from tidegate.dlq.envelopes import error_info
from tidegate.schemas.records import ResultRecord, ResultStatus, TensorRecord

__all__ = ["FAILED_STATUSES", "Timings", "error_result", "ok_result", "status_of"]

# Results with these statuses also go to the failed-requests dead-letter topic.
FAILED_STATUSES = frozenset({"ERROR", "UNAVAILABLE"})


def status_of(exc: BaseException) -> ResultStatus:
    """The result status an error maps to; anything unforeseen is an ERROR."""
    if isinstance(exc, InvalidInputError):
        return "INVALID"
    if isinstance(exc, ModelNotFoundError):
        return "NOT_FOUND"
    if isinstance(exc, DeadlineExceededError):
        return "DEADLINE_EXCEEDED"
    if isinstance(exc, RetriableError):
        return "UNAVAILABLE"
    return "ERROR"


@dataclass(slots=True)
class Timings:
    batch_ms: float = 0.0
    compute_ms: float = 0.0
    batch_size: int = 0


def _base(
    task: InferenceTask,
    *,
    status: ResultStatus,
    version: str | None,
    timings: Timings,
    worker_id: str,
    rule: str | None,
) -> ResultRecord:
    now = time.time() * 1000.0
    created = task.created_ms
    request = task.request
    lineage = task.lineage
    return {
        "request_id": task.request_id,
        "model": task.model,
        "model_version": version,
        "status": status,
        "outputs": [],
        "error": None,
        "timings": {
            "queue_ms": task.queue_ms,
            "batch_ms": timings.batch_ms,
            "compute_ms": timings.compute_ms,
            "total_ms": max(0.0, now - created) if created is not None else 0.0,
        },
        "batch_size": timings.batch_size,
        "worker_id": worker_id,
        "source": task.source,
        "routing_rule": rule,
        "tenant": request.get("tenant") or "default",
        "routing_key": request.get("routing_key"),
        "completed_at": int(now),
        "request_schema_id": task.schema_id,
        "request_digest": task.digest,
        "attempt": lineage.attempt if lineage is not None else 1,
        "origin": lineage.origin if lineage is not None else None,
        "history": lineage.history if lineage is not None else [],
        "cached": False,
        "features_at": int(task.features_at) if task.features_at is not None else None,
    }


def ok_result(
    task: InferenceTask,
    outputs: Sequence[TensorRecord],
    *,
    version: str,
    timings: Timings,
    worker_id: str,
    rule: str | None = None,
    cached: bool = False,
) -> ResultRecord:
    """A result with outputs; `cached` when they came from the prediction cache."""
    result = _base(
        task, status="OK", version=version, timings=timings, worker_id=worker_id, rule=rule
    )
    result["outputs"] = list(outputs)
    result["cached"] = cached
    return result


def error_result(
    task: InferenceTask,
    exc: BaseException,
    *,
    worker_id: str,
    version: str | None = None,
    timings: Timings | None = None,
    rule: str | None = None,
) -> ResultRecord:
    """A result that answers the request with the structured error instead of outputs."""
    result = _base(
        task,
        status=status_of(exc),
        version=version,
        timings=timings or Timings(),
        worker_id=worker_id,
        rule=rule,
    )
    result["error"] = error_info(exc)
    return result
