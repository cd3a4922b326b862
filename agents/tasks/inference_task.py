"""One decoded request on its way through a worker, independent of where it came from."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import numpy.typing as npt
from opentelemetry.trace import Span

from tidegate.core.errors import TidegateError
from tidegate.dlq.redelivery import Lineage
from tidegate.schemas.records import RequestRecord, SourcePositionRecord

__all__ = ["InferenceTask", "epoch_ms"]


def epoch_ms(value: datetime | int | float | None) -> float | None:
    """Milliseconds since the epoch of an Avro timestamp-millis (fastavro reads datetimes)."""
    if value is None:
        return None
    if isinstance(value, datetime):
        return value.timestamp() * 1000.0
    return float(value)


@dataclass(slots=True, eq=False)
class InferenceTask:
    """A decoded `InferenceRequest` plus what the worker learnt while reading it.

    `arrays` holds the inputs already converted to numpy (None when they could not be), and
    `rejection` an error that answers the request without any compute (a malformed tensor).
    `attempts` counts the model runs this request took part in, for dead-letter envelopes.
    `span` is the request's span while the worker holds it, when tracing is on. `lineage` is
    the delivery history a retried, redriven or replayed request carries (None: first delivery);
    `schema_id` and `digest` identify what the request was written as, for the lineage index.
    `features_at` is when the online features filled into its inputs were written (epoch ms;
    None: none were).
    """

    request: RequestRecord
    arrays: dict[str, npt.NDArray[Any]] | None = None
    source: SourcePositionRecord | None = None
    received_ms: float = field(default_factory=lambda: time.time() * 1000.0)
    queue_ms: float = 0.0
    rejection: TidegateError | None = None
    attempts: int = 0
    span: Span | None = None
    lineage: Lineage | None = None
    schema_id: int | None = None
    digest: str | None = None
    features_at: float | None = None

    @property
    def request_id(self) -> str:
        return str(self.request["request_id"])

    @property
    def model(self) -> str:
        return str(self.request["model"])

    @property
    def deadline_ms(self) -> float | None:
        return epoch_ms(self.request.get("deadline"))

    @property
    def created_ms(self) -> float | None:
        return epoch_ms(self.request.get("created_at"))
