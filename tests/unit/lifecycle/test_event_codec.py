"""The lifecycle's Avro schemas against its payload dataclasses, and the codecs (no servers)."""

from __future__ import annotations

import dataclasses
import io
import json
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

import fastavro
import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry._sync.mock_schema_registry_client import (
    MockSchemaRegistryClient,
)

from tests.support import unique
from tests.unit.lifecycle_events import T0, recorded
from tidegate.core.errors import SchemaMismatchError
from tidegate.core.settings import TopicSettings
from tidegate.lifecycle.domain import events as ev
from tidegate.lifecycle.eventstore.event_codec import (
    LifecycleCodec,
    ShadowComparisonCodec,
    event_to_record,
    record_to_event,
)
from tidegate.schemas.catalog import (
    LIFECYCLE_NAMESPACE,
    MODEL_LIFECYCLE_EVENT,
    SCHEMA_DIR,
    SHADOW_COMPARISON,
    event_schemas,
    event_subjects,
    load_schema,
    topic_subjects,
)
from tidegate.schemas.registration import RegistryHttp, register_all
from tidegate.schemas.registry.compat import check_compatibility

# The envelope as first registered (commit 1cdf2bf), with its payload records inline: every later
# envelope must read what it wrote.
ENVELOPE_V1 = Path(__file__).with_name("lifecycle_envelope_v1.avsc")

# Python annotation (as a string, under `from __future__ import annotations`) to Avro type.
AVRO_TYPES: dict[str, Any] = {
    "str": "string",
    "float": "double",
    "int": "int",
    "bool": "boolean",
    "str | None": ["null", "string"],
    "float | None": ["null", "double"],
    # The one optional int is a size in bytes, which outgrows Avro's 32-bit int.
    "int | None": ["null", "long"],
    "list[int]": {"type": "array", "items": "int"},
    "dict[str, str]": {"type": "map", "values": "string"},
    "dict[str, int]": {"type": "map", "values": "int"},
    "dict[str, float]": {"type": "map", "values": "double"},
}

# One payload of every type, every optional field set (defaults are covered by the v1 test).
PAYLOADS: list[ev.Payload] = [
    ev.ModelRegistered("2", "onnx", "store://fraud/2", {"model.onnx": "ab" * 32}, '{"a":1}', "d"),
    ev.ArtifactValidated("2", load_ms=12.5, device="cpu"),
    ev.ValidationFailed("3", "checksum mismatch"),
    ev.ShadowStarted("2", sample_rate=0.25),
    ev.ShadowStopped("2", reason="promoted"),
    ev.CanaryStarted("2", [10, 50, 100], 30.0, {"max_error_rate": 0.05}, baseline="1"),
    ev.TrafficShifted({"1": 90, "2": 10}, reason="canary step 1"),
    ev.Promoted("2", forced=True, previous="1", agreement=0.97),
    ev.RolledBack("2", "error rate", {"error_rate": 0.2, "p99_ms": 41.0}, to_version="1"),
    ev.Retired("1"),
    ev.RoutingRuleSet("pin-acme", tenant="acme", version="1", weights={}),
    ev.VersionLoaded("2", "worker-a", load_ms=800.0, rss_bytes=5 * 2**30, pool="nlp"),
    ev.VersionUnloaded("1", "worker-a", reason="retired"),
    ev.FallbackSet("fraud-lite", reason="lite serves while fraud's breaker is open"),
    ev.PoolAssigned("nlp", reason="placed by plan"),
]


def avsc(name: str) -> dict[str, Any]:
    return dict(json.loads((SCHEMA_DIR / f"{LIFECYCLE_NAMESPACE}.{name}.avsc").read_text()))


def test_payload_samples_cover_every_event_type() -> None:
    assert [type(p).__name__ for p in PAYLOADS] == list(ev.EVENT_TYPES)


@pytest.mark.parametrize("name", list(ev.EVENT_TYPES))
def test_avsc_fields_are_exactly_the_dataclass_fields(name: str) -> None:
    cls = ev.EVENT_TYPES[name]
    doc = avsc(name)
    assert doc["name"] == name
    assert doc["namespace"] == LIFECYCLE_NAMESPACE
    assert doc["doc"]
    fields = dataclasses.fields(cls)
    assert [f["name"] for f in doc["fields"]] == [f.name for f in fields]
    for field, spec in zip(fields, doc["fields"], strict=True):
        assert spec["type"] == AVRO_TYPES[str(field.type)], field.name
        assert spec.get("doc"), f"{name}.{field.name} has no doc"
        if field.default is not dataclasses.MISSING:
            assert spec.get("default", dataclasses.MISSING) == field.default, field.name
        elif field.default_factory is not dataclasses.MISSING:
            assert spec.get("default", dataclasses.MISSING) == field.default_factory(), field.name
        else:
            assert "default" not in spec, f"{name}.{field.name} has a default in Avro only"


def test_envelope_payload_union_is_every_event_type_by_reference() -> None:
    payload = next(f for f in avsc("ModelLifecycleEvent")["fields"] if f["name"] == "payload")
    assert payload["type"] == [f"{LIFECYCLE_NAMESPACE}.{n}" for n in ev.EVENT_TYPES]
    assert event_schemas() == payload["type"]
    assert event_subjects() == {n: n for n in payload["type"]}
    # the catalog inlines the referenced records: the registered text is self-contained
    inlined = json.loads(load_schema(MODEL_LIFECYCLE_EVENT).text)
    branches = next(f for f in inlined["fields"] if f["name"] == "payload")["type"]
    assert [b["name"] for b in branches] == payload["type"]


def test_shadow_topic_has_its_subject() -> None:
    topics = TopicSettings(shadow="sc", lifecycle="lc")
    subjects = topic_subjects(topics)
    assert subjects["sc-value"] == SHADOW_COMPARISON
    assert subjects["lc-value"] == MODEL_LIFECYCLE_EVENT


def test_envelope_stays_backward_compatible_with_the_first_registered() -> None:
    old = ENVELOPE_V1.read_text()
    new = load_schema(MODEL_LIFECYCLE_EVENT).text
    assert check_compatibility(new, [old], "BACKWARD") == []
    # and each event type's own schema reads what the first envelope wrote for that type
    old_branches = {
        b["name"]: b for f in json.loads(old)["fields"] if f["name"] == "payload" for b in f["type"]
    }
    for name in ev.EVENT_TYPES:
        if name not in old_branches:
            continue  # a type added since: the first envelope wrote none of it
        before = json.dumps({**old_branches[name], "namespace": LIFECYCLE_NAMESPACE})
        now = load_schema(f"{LIFECYCLE_NAMESPACE}.{name}").text
        assert check_compatibility(now, [before], "BACKWARD") == [], name


def test_events_written_by_the_first_envelope_read_with_defaults() -> None:
    old = fastavro.parse_schema(json.loads(ENVELOPE_V1.read_text()))
    buf = io.BytesIO()
    record = {
        "event_id": str(uuid.UUID(int=7)),
        "model": "fraud",
        "sequence": 3,
        "occurred_at": T0,
        "actor": "ops",
        "causation_id": None,
        "correlation_id": None,
        "payload": ("dev.tidegate.lifecycle.Promoted", {"version": "2", "forced": True}),
    }
    fastavro.schemaless_writer(buf, old, record)
    buf.seek(0)
    new = load_schema(MODEL_LIFECYCLE_EVENT).parsed
    read = fastavro.schemaless_reader(buf, old, new, return_record_name=True)
    assert isinstance(read, dict)
    event = record_to_event(read)
    assert event.payload == ev.Promoted("2", forced=True, previous=None, agreement=None)
    assert event.position == 0
    assert event.occurred_at == T0


def test_every_event_type_round_trips_through_fastavro() -> None:
    schema = load_schema(MODEL_LIFECYCLE_EVENT).parsed
    events = recorded("fraud", PAYLOADS)
    events[0] = dataclasses.replace(
        events[0], causation_id=uuid.uuid4(), correlation_id=uuid.uuid4(), actor="ops@x"
    )
    for event in events:
        buf = io.BytesIO()
        fastavro.schemaless_writer(buf, schema, event_to_record(event))
        buf.seek(0)
        read = fastavro.schemaless_reader(buf, schema, None, return_record_name=True)
        assert isinstance(read, dict)
        assert record_to_event(read) == event


@pytest.fixture
def client() -> SchemaRegistryClient:
    return MockSchemaRegistryClient({"url": f"mock://{unique('lc')}"})


def test_lifecycle_codec_round_trip_in_wire_format(client: SchemaRegistryClient) -> None:
    topics = TopicSettings(lifecycle=unique("lc"))
    codec = LifecycleCodec(client, topics, auto_register=True)
    # Retired and ArtifactValidated have the same required fields: the branch is chosen by name.
    for event in recorded("m", [ev.ArtifactValidated("1"), ev.Retired("1")]):
        data = codec.encode(event)
        assert data[0] == 0
        assert codec.decode(data) == event
    assert client.get_latest_version(f"{topics.lifecycle}-value").schema_id is not None


def test_occurred_at_is_truncated_to_utc_milliseconds(client: SchemaRegistryClient) -> None:
    codec = LifecycleCodec(client, TopicSettings(), auto_register=True)
    (event,) = recorded("m", [ev.Retired("1")])
    precise = dataclasses.replace(event, occurred_at=datetime(2026, 5, 1, 1, 2, 3, 456789, UTC))
    assert codec.decode(codec.encode(precise)).occurred_at == datetime(
        2026, 5, 1, 1, 2, 3, 456000, UTC
    )
    naive = dataclasses.replace(event, occurred_at=datetime(2026, 5, 1))
    with pytest.raises(SchemaMismatchError, match="timezone-aware"):
        codec.encode(naive)


def test_an_envelope_that_is_no_event_is_a_schema_mismatch() -> None:
    record = event_to_record(recorded("m", [ev.Retired("1")])[0])
    with pytest.raises(SchemaMismatchError, match="record name"):
        record_to_event({**record, "payload": {"version": "1"}})
    with pytest.raises(SchemaMismatchError, match="unknown lifecycle event type"):
        record_to_event({**record, "payload": ("dev.tidegate.lifecycle.Exploded", {})})
    with pytest.raises(SchemaMismatchError):
        record_to_event({**record, "event_id": "not-a-uuid"})


def test_shadow_comparison_codec_round_trip(client: SchemaRegistryClient) -> None:
    codec = ShadowComparisonCodec(client, TopicSettings(shadow=unique("sc")), auto_register=True)
    comparison = {
        "model": "fraud",
        "primary_version": "1",
        "candidate_version": "2",
        "request_id": "r-1",
        "kind": "classifier",
        "rows": 4,
        "agree_rows": 3,
        "abs_diff_sum": 0.5,
        "values": 8,
        "cosine_sum": None,
        "primary_ms": 1.25,
        "candidate_ms": 2.5,
        "candidate_error": None,
        "worker_id": "w-1",
        "compared_at": datetime(2026, 5, 1, 1, 2, 3, 456000, UTC),
    }
    assert codec.decode(codec.encode(comparison)) == comparison


class FakeRegistry:
    """The calls `register_all` makes, over dicts."""

    def __init__(self) -> None:
        self.schemas: dict[str, str] = {}
        self.levels: dict[str, str] = {}
        self.level_writes = 0

    def compatibility(self, subject: str) -> str | None:
        return self.levels.get(subject)

    def set_compatibility(self, subject: str, level: str) -> None:
        self.level_writes += 1
        self.levels[subject] = level

    def lookup(self, subject: str, text: str) -> tuple[int, int] | None:
        return (1, 1) if self.schemas.get(subject) == text else None

    def incompatibilities(self, subject: str, text: str) -> list[str]:
        return []

    def register(self, subject: str, text: str) -> int:
        self.schemas[subject] = text
        return 1


def test_register_all_adds_every_event_type_at_backward() -> None:
    fake = FakeRegistry()
    registry = cast(RegistryHttp, fake)
    topics = topic_subjects(TopicSettings())
    outcomes = list(register_all(registry, topics))
    assert [o.subject for o in outcomes] == [*topics, *event_subjects()]
    assert all(o.action == "registered" for o in outcomes)
    assert {o.subject: o.compatibility for o in outcomes if o.compatibility} == {
        s: "BACKWARD" for s in event_subjects()
    }
    assert fake.levels == {s: "BACKWARD" for s in event_subjects()}
    again = list(register_all(registry, topics))
    assert all(o.action == "unchanged" for o in again)
    assert fake.level_writes == len(event_subjects())  # a level already pinned is not rewritten
    assert [o.subject for o in register_all(registry, topics, events=False)] == list(topics)


def test_register_all_dry_run_pins_no_level() -> None:
    fake = FakeRegistry()
    outcomes = list(register_all(cast(RegistryHttp, fake), {}, dry_run=True))
    assert len(outcomes) == len(ev.EVENT_TYPES)
    assert fake.levels == {}
    assert fake.schemas == {}
