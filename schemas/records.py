"""The records that travel on Kafka, typed: one name per concept (docs/schemas.md).

Each `TypedDict` mirrors an `.avsc` file under `schemas/avro/`, field for field;
tests/unit/schemas/test_records.py fails when the two differ. A field with an Avro default is
`NotRequired`: the encoder fills it in, so a builder may leave it out, while a decoded record
always has it. Timestamps are written as a `datetime` or as epoch milliseconds and read back as a
UTC `datetime`.
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal, NotRequired, TypedDict

__all__ = [
    "Datatype",
    "ErrorRecord",
    "ParameterValue",
    "RedeliveryRecord",
    "ReplyToRecord",
    "RequestRecord",
    "ResultRecord",
    "ResultStatus",
    "SourcePositionRecord",
    "TensorRecord",
    "Timestamp",
    "TimingsRecord",
]

Timestamp = datetime | int
"""A `timestamp-millis` field: a `datetime`, or epoch milliseconds as written by the hot path."""

ParameterValue = bool | int | float | str | None
"""A value of a request's or tensor's `parameters` map."""

Datatype = Literal[
    "UNSPECIFIED",
    "BOOL",
    "UINT8",
    "UINT16",
    "UINT32",
    "UINT64",
    "INT8",
    "INT16",
    "INT32",
    "INT64",
    "FP16",
    "BF16",
    "FP32",
    "FP64",
    "BYTES",
]

ResultStatus = Literal[
    "UNKNOWN", "OK", "ERROR", "INVALID", "NOT_FOUND", "DEADLINE_EXCEEDED", "UNAVAILABLE"
]


class TensorRecord(TypedDict):
    """`dev.tidegate.common.Tensor`: one named array, its bytes little-endian, row-major."""

    name: str
    datatype: Datatype
    shape: list[int]
    data: bytes
    parameters: NotRequired[dict[str, ParameterValue]]


class ErrorRecord(TypedDict):
    """`dev.tidegate.common.ErrorInfo`: what went wrong, by code (core/errors.py)."""

    code: str
    message: str
    error_class: NotRequired[str]
    retriable: NotRequired[bool]
    field: NotRequired[str | None]
    details: NotRequired[dict[str, str]]


class SourcePositionRecord(TypedDict):
    """`dev.tidegate.common.SourcePosition`: where a record was read."""

    topic: str
    partition: int
    offset: int


RedeliveryRecord = TypedDict(
    "RedeliveryRecord",
    {
        "kind": str,
        "at": Timestamp,
        # `from` is a keyword: hence the functional form.
        "from": NotRequired[SourcePositionRecord | None],
        "id": NotRequired[str | None],
        "reason": NotRequired[str | None],
    },
)
"""`dev.tidegate.common.Redelivery`: one redrive, replay or retry a request went through."""


class ReplyToRecord(TypedDict):
    """`dev.tidegate.inference.ReplyTo`: where a result is also delivered (a gateway replica)."""

    topic: str
    partition: NotRequired[int | None]
    nonce: NotRequired[str | None]


class RequestRecord(TypedDict):
    """`dev.tidegate.inference.InferenceRequest`: what producers and the gateway publish."""

    request_id: str
    model: str
    model_version: NotRequired[str | None]
    tenant: NotRequired[str]
    routing_key: NotRequired[str | None]
    inputs: list[TensorRecord]
    outputs: NotRequired[list[str]]
    parameters: NotRequired[dict[str, ParameterValue]]
    deadline: NotRequired[Timestamp | None]
    created_at: Timestamp
    reply_to: NotRequired[ReplyToRecord | None]
    entity_key: NotRequired[str | None]


class TimingsRecord(TypedDict):
    """`dev.tidegate.inference.Timings`: milliseconds spent per stage."""

    queue_ms: NotRequired[float]
    batch_ms: NotRequired[float]
    compute_ms: NotRequired[float]
    total_ms: NotRequired[float]


class ResultRecord(TypedDict):
    """`dev.tidegate.inference.InferenceResult`: what workers publish, and a gateway's reply."""

    request_id: str
    model: str
    model_version: NotRequired[str | None]
    status: ResultStatus
    outputs: NotRequired[list[TensorRecord]]
    error: NotRequired[ErrorRecord | None]
    timings: NotRequired[TimingsRecord]
    batch_size: NotRequired[int]
    worker_id: NotRequired[str]
    source: NotRequired[SourcePositionRecord | None]
    routing_rule: NotRequired[str | None]
    tenant: NotRequired[str]
    routing_key: NotRequired[str | None]
    completed_at: Timestamp
    request_schema_id: NotRequired[int | None]
    request_digest: NotRequired[str | None]
    attempt: NotRequired[int]
    origin: NotRequired[SourcePositionRecord | None]
    history: NotRequired[list[RedeliveryRecord]]
    cached: NotRequired[bool]
    features_at: NotRequired[Timestamp | None]
