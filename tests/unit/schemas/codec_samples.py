"""A valid record of each project schema, for the codec's tests and the registry's."""

from __future__ import annotations

import struct
from datetime import UTC, datetime
from typing import Any

from tidegate.schemas.catalog import (
    AUDIT_EVENT,
    DEAD_LETTER_ENVELOPE,
    INFERENCE_REQUEST,
    INFERENCE_RESULT,
    MODEL_LIFECYCLE_EVENT,
)

__all__ = ["NOW", "SAMPLES", "tensor"]


NOW = datetime(2026, 11, 30, 12, 0, 0, 123000, tzinfo=UTC)


def tensor(name: str = "x", values: tuple[float, ...] = (1.0, 2.0)) -> dict[str, Any]:
    return {
        "name": name,
        "datatype": "FP32",
        "shape": [1, len(values)],
        "data": struct.pack(f"<{len(values)}f", *values),
        "parameters": {},
    }


SAMPLES: dict[str, dict[str, Any]] = {
    INFERENCE_REQUEST: {
        "request_id": "r-1",
        "model": "fraud",
        "model_version": None,
        "tenant": "acme",
        "routing_key": "card-42",
        "inputs": [tensor()],
        "outputs": ["probabilities"],
        "parameters": {"priority": 3, "trace": True, "note": "x", "temp": 0.5, "none": None},
        "deadline": NOW,
        "created_at": NOW,
        "reply_to": {"topic": "replies", "partition": 7, "nonce": "n-1"},
        "entity_key": "card-42",
    },
    INFERENCE_RESULT: {
        "request_id": "r-1",
        "model": "fraud",
        "model_version": "1",
        "status": "ERROR",
        "outputs": [tensor("probabilities", (0.1, 0.9))],
        "error": {
            "code": "MODEL_ERROR",
            "message": "boom",
            "error_class": "ModelError",
            "retriable": False,
            "field": "x",
            "details": {"k": "v"},
        },
        "timings": {"queue_ms": 1.5, "batch_ms": 2.0, "compute_ms": 0.25, "total_ms": 4.0},
        "batch_size": 8,
        "worker_id": "w-1",
        "source": {"topic": "inference-requests", "partition": 3, "offset": 99},
        "routing_rule": "weights",
        "tenant": "acme",
        "routing_key": "card-42",
        "completed_at": NOW,
        "request_schema_id": 7,
        "request_digest": "00ff",
        "attempt": 2,
        "origin": {"topic": "inference-requests", "partition": 3, "offset": 12},
        "history": [
            {
                "kind": "retry",
                "at": NOW,
                "from": {"topic": "inference-retry-1", "partition": 0, "offset": 4},
                "id": None,
                "reason": "MODEL_UNAVAILABLE",
            }
        ],
        "cached": True,
        "features_at": NOW,
    },
    MODEL_LIFECYCLE_EVENT: {
        "event_id": "e-1",
        "model": "fraud",
        "sequence": 4,
        "occurred_at": NOW,
        "actor": "ops@example.com",
        "causation_id": None,
        "correlation_id": "c-1",
        "payload": (
            "dev.tidegate.lifecycle.RolledBack",
            {
                "version": "3",
                "reason": "error rate",
                "metrics": {"error_rate": 0.2},
                "to_version": "1",
            },
        ),
        "position": 41,
    },
    DEAD_LETTER_ENVELOPE: {
        "original_key": b"k",
        "original_value": b"\x07garbage",
        "original_headers": [{"key": "traceparent", "value": b"00-abc"}],
        "source": {"topic": "inference-requests", "partition": 0, "offset": 12},
        "original_timestamp": NOW,
        "error": {
            "code": "WIRE_FORMAT",
            "message": "unknown magic byte 7",
            "error_class": "WireFormatError",
            "retriable": False,
            "field": None,
            "details": {},
        },
        "attempt": 1,
        "first_failed_at": NOW,
        "failed_at": NOW,
        "request_id": None,
        "model": None,
        "worker_id": "w-2",
        "origin": None,
        "history": [],
        "retry_at": NOW,
    },
    AUDIT_EVENT: {
        "event_id": "0f9e8d7c6b5a49382716051413121110",
        "at": NOW,
        "actor": "key:k-3f2a",
        "action": "lifecycle.promote",
        "outcome": "denied",
        "source": "10.0.0.7:52114",
        "target": "fraud@2",
        "details": {"reason": "role infer lacks deploy", "method": "POST"},
        "service": "gateway",
        "request_id": "r-9",
        "trace_id": None,
    },
}
