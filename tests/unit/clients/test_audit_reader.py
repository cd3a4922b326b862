"""The audit reader's filters and its snapshot reads, on a fake consumer (the real Kafka is in
tests/integration/clients/test_audit_trail.py)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from confluent_kafka import KafkaError, TopicPartition
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry._sync.mock_schema_registry_client import (
    MockSchemaRegistryClient,
)
from confluent_kafka.serialization import MessageField, SerializationContext

from tests.support import unique
from tidegate.clients import audit_reader
from tidegate.clients.audit import build_event
from tidegate.clients.audit_reader import AuditFilter, AuditReader
from tidegate.core.errors import InvalidInputError
from tidegate.core.settings import TopicSettings
from tidegate.schemas.catalog import AUDIT_EVENT, load_schema
from tidegate.schemas.codec import AvroEncoder

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
TOPIC = "al"


def entry(
    minute: int,
    *,
    actor: str = "alice",
    action: str = "lifecycle.promote",
    outcome: str = "success",
    target: str | None = None,
) -> dict[str, Any]:
    at = T0 + timedelta(minutes=minute)
    return build_event(
        action, actor=actor, outcome=outcome, service="gateway", target=target, at=at
    )


def test_each_filter_field_narrows_the_entries() -> None:
    e = entry(5, actor="bob", action="keys.revoke", outcome="denied", target="k-1")
    assert AuditFilter().matches(e)
    assert AuditFilter(actor="bob", action="keys.", outcome="denied", target="k-1").matches(e)
    assert AuditFilter(action="keys.revoke").matches(e), "a whole action is its own prefix"
    assert not AuditFilter(actor="alice").matches(e)
    assert not AuditFilter(action="auth.").matches(e)
    assert not AuditFilter(outcome="success").matches(e)
    assert not AuditFilter(target="k-2").matches(e)


def test_since_is_inclusive_and_until_exclusive() -> None:
    at5 = entry(5)
    assert AuditFilter(since=T0 + timedelta(minutes=5)).matches(at5)
    assert not AuditFilter(until=T0 + timedelta(minutes=5)).matches(at5)
    assert AuditFilter(since=T0, until=T0 + timedelta(minutes=6)).matches(at5)
    with pytest.raises(InvalidInputError):
        AuditFilter(since=T0, until=T0)


class FakeMessage:
    def __init__(self, partition: int, offset: int, value: bytes | None, eof: bool = False) -> None:
        self._partition, self._offset, self._value, self._eof = partition, offset, value, eof

    def partition(self) -> int:
        return self._partition

    def offset(self) -> int:
        return self._offset

    def value(self) -> bytes | None:
        return self._value

    def error(self) -> KafkaError | None:
        return KafkaError(KafkaError._PARTITION_EOF) if self._eof else None


class FakeConsumer:
    """One partition of messages stamped with the given times; assign/poll like librdkafka."""

    def __init__(self, values: list[bytes], stamps: list[datetime]) -> None:
        self.values, self.stamps = values, stamps
        self.position = 0
        self.committed = False

    def list_topics(self, topic: str, timeout: float) -> Any:
        meta = type("T", (), {"error": None, "partitions": {0: None}})()
        return type("M", (), {"topics": {TOPIC: meta}})()

    def get_watermark_offsets(self, tp: TopicPartition, timeout: float) -> tuple[int, int]:
        return 0, len(self.values)

    def offsets_for_times(self, tps: list[TopicPartition], timeout: float) -> list[TopicPartition]:
        out = []
        for tp in tps:
            at = next(
                (i for i, s in enumerate(self.stamps) if s.timestamp() * 1000 >= tp.offset), -1
            )
            out.append(TopicPartition(tp.topic, tp.partition, at))
        return out

    def assign(self, tps: list[TopicPartition]) -> None:
        self.position = tps[0].offset

    def poll(self, timeout: float) -> FakeMessage:
        if self.position >= len(self.values):
            return FakeMessage(0, len(self.values), None, eof=True)
        self.position += 1
        return FakeMessage(0, self.position - 1, self.values[self.position - 1])

    def commit(self, *args: Any, **kwargs: Any) -> None:
        self.committed = True

    def close(self) -> None:
        pass


@pytest.fixture
def registry() -> SchemaRegistryClient:
    return MockSchemaRegistryClient({"url": f"mock://{unique('audit-read')}"})


def reader_of(
    monkeypatch: pytest.MonkeyPatch, registry: SchemaRegistryClient, events: list[dict[str, Any]]
) -> tuple[AuditReader, FakeConsumer]:
    encoder = AvroEncoder(registry, load_schema(AUDIT_EVENT), auto_register=True)
    ctx = SerializationContext(TOPIC, MessageField.VALUE)
    values = [encoder(e, ctx) for e in events]
    consumer = FakeConsumer(values, [e["at"] for e in events])
    monkeypatch.setattr(audit_reader, "make_reader", lambda *_args: consumer)
    return AuditReader(topics=TopicSettings(audit=TOPIC), registry=registry), consumer


def test_a_read_starts_at_since_and_keeps_write_order(
    monkeypatch: pytest.MonkeyPatch, registry: SchemaRegistryClient
) -> None:
    events = [entry(m, actor=f"a{m}") for m in range(10)]
    reader, consumer = reader_of(monkeypatch, registry, events)
    with reader:
        found = reader.read(AuditFilter(since=T0 + timedelta(minutes=4)))
    assert [e["actor"] for e in found] == [f"a{m}" for m in range(4, 10)]
    assert not consumer.committed


def test_until_reads_a_minute_on_for_late_clocks_then_cuts_exactly(
    monkeypatch: pytest.MonkeyPatch, registry: SchemaRegistryClient
) -> None:
    # The replica that wrote offset 3 runs 30 s behind: it lands after a later entry.
    events = [entry(0), entry(1), entry(2), entry(1, actor="late"), entry(3), entry(20)]
    events[3]["at"] += timedelta(seconds=30)
    reader, _ = reader_of(monkeypatch, registry, events)
    with reader:
        found = reader.read(AuditFilter(until=T0 + timedelta(minutes=2)))
    assert [(e["actor"], e["at"].minute) for e in found] == [
        ("alice", 0),
        ("alice", 1),
        ("late", 1),
    ]


def test_limit_keeps_the_newest_and_undecodable_messages_are_counted(
    monkeypatch: pytest.MonkeyPatch, registry: SchemaRegistryClient
) -> None:
    events = [entry(m, actor=f"a{m}", outcome="denied" if m % 2 else "success") for m in range(6)]
    reader, consumer = reader_of(monkeypatch, registry, events)
    consumer.values.insert(2, b"\x00\x00\x00\x00\x63garbage")
    consumer.stamps.insert(2, T0)
    with reader:
        found = reader.read(AuditFilter(outcome="denied"), limit=2)
        assert reader.skipped == 1
    assert [e["actor"] for e in found] == ["a3", "a5"]
