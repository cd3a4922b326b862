"""What the gateway makes of the workers' breaker states: a version is open only while every
reporting worker has it open and not yet due to probe; tombstones forget a stopped worker."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from confluent_kafka.schema_registry import SchemaRegistryClient

from tidegate.core.settings import KafkaSettings, TopicSettings
from tidegate.gateway.modelstate.model_health import ModelHealth, version_state

NOW_MS = 1_000_000.0


def record(state: str, open_until_ms: float | None = None) -> dict[str, Any]:
    until = None
    if open_until_ms is not None:
        until = datetime.fromtimestamp(open_until_ms / 1000, UTC)  # decoded as a datetime
    return {"state": state, "open_until": until}


def test_a_version_is_open_only_while_every_worker_has_it_open_and_not_due() -> None:
    later = NOW_MS + 5000
    assert version_state([], NOW_MS) == "closed"
    assert version_state([record("open", later)], NOW_MS) == "open"
    assert version_state([record("open", later), record("open", later)], NOW_MS) == "open"
    assert version_state([record("open", later), record("closed")], NOW_MS) == "half_open"
    assert version_state([record("open", NOW_MS - 1)], NOW_MS) == "half_open"  # due to probe
    assert version_state([record("half_open")], NOW_MS) == "half_open"
    assert version_state([record("closed"), record("closed")], NOW_MS) == "closed"


class Decoded:
    """Stands for the Avro decoder: the bytes are a key into records."""

    def __init__(self) -> None:
        self.records: dict[bytes, dict[str, Any]] = {}

    def __call__(self, value: bytes) -> dict[str, Any]:
        return self.records[value]


def health() -> tuple[ModelHealth, Decoded]:
    reader = ModelHealth(
        KafkaSettings(),
        TopicSettings(),
        SchemaRegistryClient({"url": "http://127.0.0.1:1"}),
        clock=lambda: NOW_MS / 1000,
    )
    decoded = Decoded()
    reader._decode = decoded  # type: ignore[assignment]
    return reader, decoded


def test_records_per_worker_are_kept_and_tombstones_forget_them() -> None:
    reader, decoded = health()
    decoded.records[b"a"] = record("open", NOW_MS + 3000)
    decoded.records[b"b"] = record("closed")
    reader._apply(b"fraud/1/w1", b"a")
    reader._apply(b"fraud/2/w1", b"a")
    assert reader.open_versions("fraud") == {"1", "2"}
    assert reader.all_open("fraud", ["1", "2"])
    assert not reader.all_open("fraud", ["1", "2", "3"])  # 3 is not refused by anyone
    assert not reader.all_open("fraud", [])
    assert reader.retry_after_s("fraud", ["1", "2"]) == 3.0
    reader._apply(b"fraud/1/w2", b"b")  # another worker still calls 1
    assert reader.state("fraud", "1") == "half_open"
    assert reader.open_versions("fraud") == {"2"}
    reader._apply(b"fraud/1/w2", None)  # w2 stopped
    assert reader.state("fraud", "1") == "open"
    reader._apply(b"fraud/1/w1", None)
    assert reader.state("fraud", "1") == "closed"
    reader._apply(b"not-a-key", b"a")  # ignored
    assert reader.state("other", "1") == "closed"


def test_a_model_is_suspect_only_while_an_open_period_lasts() -> None:
    reader, decoded = health()
    assert not reader.suspect("fraud")
    decoded.records[b"open"] = record("open", NOW_MS + 3000)
    decoded.records[b"over"] = record("open", NOW_MS - 1)  # a killed worker's last record
    reader._apply(b"fraud/1/w1", b"over")
    assert not reader.suspect("fraud")  # probes are due: nothing the gateway may refuse
    assert reader.refusing("fraud", ["1"]) is None
    reader._apply(b"fraud/1/w2", b"open")
    assert reader.suspect("fraud")
    assert not reader.suspect("other")
    reader._apply(b"fraud/1/w1", None)  # only w2's open record is left
    assert reader.refusing("fraud", ["1"]) == 3.0
    reader._apply(b"fraud/1/w2", None)
    assert not reader.suspect("fraud")
