"""Lifecycle events and shadow comparisons on Kafka: Avro in the Confluent wire format.

An event travels in the `ModelLifecycleEvent` envelope. Its payload is a union of one record per
event type, and the record's name is the event type: the encoder picks the union branch by name
with fastavro's `(full name, dict)` tuple notation, and the decoder asks fastavro for the same
tuple back. Picking by name matters: several payloads have compatible fields (`Retired` and
`ArtifactValidated` both fit `{"version": ...}`), so fastavro's own guess from the fields would
turn one event into another.

Ids travel as text and `occurred_at` as UTC milliseconds, so an event read back equals the one
written except for sub-millisecond precision of its time, which is truncated.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.serialization import MessageField, SerializationContext

from tidegate.core.errors import LifecycleError, SchemaMismatchError
from tidegate.core.settings import TopicSettings
from tidegate.lifecycle.domain.events import RecordedEvent, payload_from_dict, payload_to_dict
from tidegate.schemas.catalog import (
    LIFECYCLE_NAMESPACE,
    MODEL_LIFECYCLE_EVENT,
    SHADOW_COMPARISON,
    load_schema,
)
from tidegate.schemas.codec import AvroDecoder, AvroEncoder

__all__ = ["LifecycleCodec", "ShadowComparisonCodec", "event_to_record", "record_to_event"]

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MILLI = timedelta(milliseconds=1)


class _TopicCodec:
    """One topic's value schema: the encoder, the decoder and the serialization context."""

    def __init__(
        self,
        client: SchemaRegistryClient,
        topic: str,
        fullname: str,
        *,
        auto_register: bool,
        return_record_name: bool = False,
    ) -> None:
        schema = load_schema(fullname)
        self.topic = topic
        self._ctx = SerializationContext(topic, MessageField.VALUE)
        self._encoder = AvroEncoder(client, schema, auto_register=auto_register)
        self._decoder = AvroDecoder(client, schema, return_record_name=return_record_name)


class LifecycleCodec(_TopicCodec):
    """Encodes `RecordedEvent`s for the lifecycle topic and decodes them back.

    The envelope must be registered under `{topics.lifecycle}-value` (`tidegate schemas
    register`) unless `auto_register` is set, which tests with a mock registry use.
    """

    def __init__(
        self,
        client: SchemaRegistryClient,
        topics: TopicSettings,
        *,
        auto_register: bool = False,
    ) -> None:
        # The record name tells the payload's union branch apart (Retired and
        # ArtifactValidated have the same required fields).
        super().__init__(
            client,
            topics.lifecycle,
            MODEL_LIFECYCLE_EVENT,
            auto_register=auto_register,
            return_record_name=True,
        )

    def encode(self, event: RecordedEvent) -> bytes:
        return self._encoder(event_to_record(event), self._ctx)

    def decode(self, data: bytes | None) -> RecordedEvent:
        """The event in `data`; a `SerializationError` when it is not a readable event."""
        return record_to_event(self._decoder(data, self._ctx))


class ShadowComparisonCodec(_TopicCodec):
    """Encodes and decodes `ShadowComparison` records (dicts with the schema's fields; an aware
    datetime for `compared_at`) for the shadow topic, under `{topics.shadow}-value`."""

    def __init__(
        self,
        client: SchemaRegistryClient,
        topics: TopicSettings,
        *,
        auto_register: bool = False,
    ) -> None:
        super().__init__(client, topics.shadow, SHADOW_COMPARISON, auto_register=auto_register)

    def encode(self, comparison: Mapping[str, Any]) -> bytes:
        compared_at = comparison.get("compared_at")
        if isinstance(compared_at, datetime):
            comparison = {**comparison, "compared_at": _millis(compared_at, "compared_at")}
        return self._encoder(comparison, self._ctx)

    def decode(self, data: bytes | None) -> dict[str, Any]:
        return dict(self._decoder(data, self._ctx))


def event_to_record(event: RecordedEvent) -> dict[str, Any]:
    """The envelope record of an event, payload as a `(full name, dict)` union branch."""
    return {
        "event_id": str(event.event_id),
        "model": event.stream,
        "sequence": event.sequence,
        "position": event.position,
        "occurred_at": _millis(event.occurred_at, "occurred_at"),
        "actor": event.actor,
        "causation_id": _text(event.causation_id),
        "correlation_id": _text(event.correlation_id),
        "payload": (f"{LIFECYCLE_NAMESPACE}.{event.type}", payload_to_dict(event.payload)),
    }


def record_to_event(record: Mapping[str, Any]) -> RecordedEvent:
    """The event of an envelope record read with `return_record_name` (see `LifecycleCodec`)."""
    try:
        branch = record["payload"]
        if not isinstance(branch, tuple):
            raise SchemaMismatchError("lifecycle payload read without its record name")
        fullname, fields = branch
        payload = payload_from_dict(str(fullname).rsplit(".", 1)[-1], fields)
        return RecordedEvent(
            event_id=uuid.UUID(record["event_id"]),
            stream=record["model"],
            sequence=int(record["sequence"]),
            position=int(record.get("position", 0)),
            occurred_at=_aware(record["occurred_at"]),
            payload=payload,
            actor=record["actor"],
            causation_id=_uuid(record.get("causation_id")),
            correlation_id=_uuid(record.get("correlation_id")),
        )
    except (LifecycleError, KeyError, TypeError, ValueError) as exc:
        # A well-formed Avro record that is no valid event (a bad UUID, an unknown type) is as
        # unreadable to a consumer as garbled bytes.
        raise SchemaMismatchError(f"not a readable lifecycle event: {exc}") from exc


def _millis(at: datetime, name: str) -> int:
    """Exact UTC milliseconds (fastavro would read a naive datetime as local time)."""
    if at.tzinfo is None:
        raise SchemaMismatchError(f"{name} must be a timezone-aware datetime, got {at!r}")
    return (at - _EPOCH) // _MILLI


def _aware(at: datetime | int) -> datetime:
    if isinstance(at, int):
        return _EPOCH + at * _MILLI
    return at if at.tzinfo is not None else at.replace(tzinfo=UTC)


def _text(value: uuid.UUID | None) -> str | None:
    return str(value) if value is not None else None


def _uuid(value: str | None) -> uuid.UUID | None:
    return uuid.UUID(value) if value else None
