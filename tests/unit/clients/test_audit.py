"""The audit trail's writer without servers: what an entry holds, what it never holds, and that
`record` never raises into the request it describes (the real Kafka is in
tests/integration/clients/test_audit_trail.py)."""

from __future__ import annotations

import io
import threading
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

import fastavro
import pytest
from confluent_kafka import KafkaError
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry._sync.mock_schema_registry_client import (
    MockSchemaRegistryClient,
)
from opentelemetry import trace
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags
from prometheus_client import REGISTRY

from tests.support import unique, wait_for
from tidegate.clients import audit
from tidegate.clients.audit import (
    KafkaAuditTrail,
    MemoryAuditTrail,
    build_event,
    clean_details,
)
from tidegate.core.errors import SchemaNotFoundError, SubjectNotFoundError
from tidegate.core.settings import TopicSettings
from tidegate.schemas.catalog import AUDIT_EVENT, load_schema
from tidegate.schemas.wire import unpack

SCHEMA = load_schema(AUDIT_EVENT)
AT = datetime(2026, 12, 1, 15, 0, 0, 250000, tzinfo=UTC)


def test_secret_like_details_are_dropped_and_named() -> None:
    cleaned = clean_details(
        {
            "Authorization": "Bearer eyJhbGciOi",
            "X-Api-Key": "tg_live_123",
            "key": "tg_live_456",
            "access_token": "abc",
            "db_password": "hunter2",
            "client_secret": "s3",
            "note": "basic dXNlcjpwYXNz",
            "key_id": "k-3f2a",
            "key_prefix": "tg_live_",
            "reason": "basic auth is off",
        }
    )
    assert cleaned == {
        "key_id": "k-3f2a",
        "key_prefix": "tg_live_",
        "reason": "basic auth is off",
        "redacted": "Authorization,X-Api-Key,access_token,client_secret,db_password,key,note",
    }
    assert not any(
        secret in repr(cleaned) for secret in ("eyJ", "tg_live_1", "tg_live_4", "hunter2", "dXNl")
    )


def test_long_values_are_capped() -> None:
    cleaned = clean_details({"path": "x" * 5000})
    assert len(cleaned["path"]) < 1100
    assert clean_details(None) == {}


def test_an_entry_says_who_what_when_where_and_the_outcome() -> None:
    event = build_event(
        "keys.revoke",
        actor="alice",
        outcome="success",
        service="cli",
        source="ops-laptop",
        target="k-3f2a",
        details={"request_id": "r-7", "reason": "left the team", "token": "t"},
        at=AT,
    )
    fastavro.validation.validate(event, SCHEMA.parsed, raise_errors=True)
    assert {k: event[k] for k in ("actor", "action", "outcome", "source", "target", "at")} == {
        "actor": "alice",
        "action": "keys.revoke",
        "outcome": "success",
        "source": "ops-laptop",
        "target": "k-3f2a",
        "at": AT,
    }
    assert event["service"] == "cli"
    assert event["request_id"] == "r-7", "a request id has its own field"
    assert event["details"] == {"reason": "left the team", "redacted": "token"}
    assert event["trace_id"] is None, "no span is current"
    assert len(event["event_id"]) == 32
    assert (
        build_event("a", actor="x", outcome="success", service="cli")["event_id"]
        != (event["event_id"])
    )


def test_an_entry_carries_the_current_trace_id() -> None:
    context = SpanContext(0xABC, 0xDEF, is_remote=False, trace_flags=TraceFlags(1))
    with trace.use_span(NonRecordingSpan(context)):
        event = build_event("auth.failed", actor="anonymous", outcome="denied", service="gateway")
    assert event["trace_id"] == f"{0xABC:032x}"


def test_the_memory_trail_keeps_what_was_recorded() -> None:
    trail = MemoryAuditTrail(service="controller")
    trail.record("models.retire", actor="bob", outcome="failure", target="fraud@1")
    (event,) = trail.events
    assert (event["action"], event["service"], event["target"]) == (
        "models.retire",
        "controller",
        "fraud@1",
    )


# -- KafkaAuditTrail with a fake producer -----------------------------------------------------


class FakeMessage:
    def __init__(self, topic: str) -> None:
        self._topic = topic

    def topic(self) -> str:
        return self._topic


class FakeProducer:
    """Takes messages; `poll` serves their delivery reports with `fail_with` as the error."""

    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []
        self.pending: list[tuple[Callable[..., None], str]] = []
        self.fail_with: KafkaError | None = None
        self.full = False
        self.flushed = False
        self.poll_threads: set[str] = set()
        self._lock = threading.Lock()

    def produce(self, topic: str, **kwargs: Any) -> None:
        if self.full:
            raise BufferError("queue full")
        with self._lock:
            self.sent.append({"topic": topic, **kwargs})
            self.pending.append((kwargs["on_delivery"], topic))

    def poll(self, timeout: float = 0.0) -> int:
        self.poll_threads.add(threading.current_thread().name)
        with self._lock:
            served, self.pending = self.pending, []
        for callback, topic in served:
            callback(self.fail_with, FakeMessage(topic))
        if not served:
            threading.Event().wait(min(timeout, 0.01))
        return len(served)

    def flush(self, timeout: float = 0.0) -> int:
        self.flushed = True
        self.poll(0)
        return 0


def failures(service: str, reason: str) -> float:
    value = REGISTRY.get_sample_value(
        "tidegate_audit_failures_total", {"service": service, "reason": reason}
    )
    return value or 0.0


def delivered(service: str) -> float:
    return REGISTRY.get_sample_value("tidegate_audit_records_total", {"service": service}) or 0.0


@pytest.fixture
def registry() -> SchemaRegistryClient:
    return MockSchemaRegistryClient({"url": f"mock://{unique('audit')}"})


@pytest.fixture
def producer(monkeypatch: pytest.MonkeyPatch) -> FakeProducer:
    fake = FakeProducer()
    monkeypatch.setattr(audit, "make_producer", lambda _settings, _extra: fake)
    return fake


@pytest.fixture
def trail(registry: SchemaRegistryClient, producer: FakeProducer) -> Iterator[KafkaAuditTrail]:
    topics = TopicSettings(audit="al")
    registry.register_schema(f"{topics.audit}-value", Schema(SCHEMA.text, "AVRO"))
    made = KafkaAuditTrail(
        topics=topics, registry=registry, service=unique("svc"), clock=lambda: AT
    )
    made.start()
    yield made
    made.close()


def decode(value: bytes) -> dict[str, Any]:
    _, body = unpack(value)
    record = fastavro.schemaless_reader(io.BytesIO(body), SCHEMA.parsed, None)
    assert isinstance(record, dict)
    return record


def test_record_enqueues_an_entry_keyed_by_actor_and_stamped_with_its_time(
    trail: KafkaAuditTrail, producer: FakeProducer
) -> None:
    service = trail.service
    trail.record(
        "lifecycle.promote", actor="alice", outcome="success", source="10.1.2.3:5555", target="m@2"
    )
    (sent,) = producer.sent
    assert sent["topic"] == "al"
    assert sent["key"] == b"alice"
    assert sent["timestamp"] == int(AT.timestamp() * 1000)
    event = decode(sent["value"])
    assert (event["actor"], event["action"], event["outcome"]) == (
        "alice",
        "lifecycle.promote",
        "success",
    )
    assert (event["source"], event["target"], event["at"]) == ("10.1.2.3:5555", "m@2", AT)
    # Delivery reports are served by the trail's own thread, not the caller's.
    wait_for(lambda: delivered(service) == 1, timeout=5, what="the delivery report")
    assert producer.poll_threads == {"audit-poll"}


def test_a_failed_delivery_is_counted_never_raised(
    trail: KafkaAuditTrail, producer: FakeProducer
) -> None:
    service = trail.service
    producer.fail_with = KafkaError(KafkaError._MSG_TIMED_OUT)
    trail.record("auth.failed", actor="anonymous", outcome="denied")
    wait_for(lambda: failures(service, "delivery") == 1, timeout=5, what="the failure count")
    assert delivered(service) == 0


def test_a_full_queue_or_a_bad_entry_is_counted_never_raised(
    trail: KafkaAuditTrail, producer: FakeProducer
) -> None:
    service = trail.service
    trail.record("auth.failed", actor=None, outcome="denied")  # type: ignore[arg-type]
    assert failures(service, "encode") == 1
    producer.full = True
    trail.record("auth.failed", actor="anonymous", outcome="denied")
    assert failures(service, "queue_full") == 1
    assert producer.sent == []


def test_close_flushes_and_a_closed_trail_only_counts(
    trail: KafkaAuditTrail, producer: FakeProducer
) -> None:
    service = trail.service
    # This trail's own poll thread: other trails in this process (other test files on the same
    # pytest-xdist worker) may have theirs.
    poller = trail._poller
    assert poller is not None
    assert poller.is_alive(), "the started trail polls on a thread"
    assert trail.close() == 0
    assert producer.flushed
    trail.record("keys.create", actor="alice", outcome="success")
    assert failures(service, "not_started") == 1
    assert producer.sent == []
    assert not poller.is_alive(), "closing the trail stops its poll thread"


def test_start_fails_when_the_audit_subject_is_not_registered(
    registry: SchemaRegistryClient, producer: FakeProducer
) -> None:
    trail = KafkaAuditTrail(topics=TopicSettings(audit=unique("none")), registry=registry)
    with pytest.raises((SubjectNotFoundError, SchemaNotFoundError)):
        trail.start()
    trail.close()
