"""The audit trail against the real Kafka and registry: what `KafkaAuditTrail` writes,
`AuditReader` and `tidegate audit` read back, in order and with their filters, and a trail that
cannot deliver counts its losses instead of failing its caller."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from prometheus_client import REGISTRY
from typer.testing import CliRunner

from tests.support import unique, wait_for
from tidegate.cli import app
from tidegate.clients.audit import KafkaAuditTrail
from tidegate.clients.audit_reader import AuditFilter, AuditReader
from tidegate.core.settings import KafkaSettings, SchemaRegistrySettings, TopicSettings
from tidegate.schemas.catalog import AUDIT_EVENT, topic_subjects
from tidegate.schemas.registration import RegistryHttp, register_all

# Each entry is stamped an hour apart, ending a little before now, so a time filter has to pick
# by the entries' own times, not by when the test happened to write them.
START = datetime.now(UTC).replace(microsecond=0) - timedelta(hours=5)
ENTRIES: list[dict[str, Any]] = [
    {"action": "auth.failed", "actor": "anonymous", "outcome": "denied", "target": "/admin/models"},
    {"action": "keys.create", "actor": "alice", "outcome": "success", "target": "k-1"},
    {"action": "lifecycle.promote", "actor": "k-1", "outcome": "denied", "target": "fraud@2"},
    {"action": "keys.revoke", "actor": "alice", "outcome": "success", "target": "k-1"},
    {"action": "lifecycle.retire", "actor": "bob", "outcome": "failure", "target": "fraud@1"},
]


@pytest.fixture
def topics(
    new_topic: Callable[..., str], registry_settings: SchemaRegistrySettings
) -> TopicSettings:
    settings = TopicSettings(audit=new_topic("it-audit"))
    subject = f"{settings.audit}-value"
    assert topic_subjects(settings)[subject] == AUDIT_EVENT
    with RegistryHttp(registry_settings) as http:
        list(register_all(http, {subject: AUDIT_EVENT}, events=False))
    return settings


def stamps() -> Callable[[], datetime]:
    """A clock for the trail: START, START + 1h, ..."""
    ticks = iter(range(100))
    return lambda: START + timedelta(hours=next(ticks))


@pytest.fixture
def written(
    kafka_settings: KafkaSettings, topics: TopicSettings, registry_settings: SchemaRegistrySettings
) -> list[dict[str, Any]]:
    trail = KafkaAuditTrail(
        kafka_settings, topics, registry_settings, service="gateway", clock=stamps()
    )
    trail.start()
    for i, fields in enumerate(ENTRIES):
        trail.record(
            fields["action"],
            actor=fields["actor"],
            outcome=fields["outcome"],
            source=f"10.0.0.{i}:5{i}000",
            target=fields["target"],
            details={"n": str(i), "authorization": "Bearer must-not-be-stored"},
        )
    assert trail.close() == 0, "every entry delivered on close"
    return ENTRIES


def read(
    kafka: KafkaSettings,
    topics: TopicSettings,
    registry: SchemaRegistrySettings,
    where: AuditFilter | None = None,
    limit: int | None = None,
) -> list[dict[str, Any]]:
    with AuditReader(kafka, topics, registry) as reader:
        return reader.read(where, limit=limit)


def test_every_entry_reads_back_in_order_with_who_what_when_where_and_outcome(
    kafka_settings: KafkaSettings,
    topics: TopicSettings,
    registry_settings: SchemaRegistrySettings,
    written: list[dict[str, Any]],
) -> None:
    found = read(kafka_settings, topics, registry_settings)
    assert [e["action"] for e in found] == [w["action"] for w in written]
    for i, (event, wrote) in enumerate(zip(found, written, strict=True)):
        assert {k: event[k] for k in wrote} == wrote
        assert event["at"] == START + timedelta(hours=i)
        assert event["source"] == f"10.0.0.{i}:5{i}000"
        assert event["service"] == "gateway"
        assert event["details"] == {"n": str(i), "redacted": "authorization"}
    assert "must-not-be-stored" not in repr(found)


def test_filters_pick_by_actor_action_outcome_target_and_time(
    kafka_settings: KafkaSettings,
    topics: TopicSettings,
    registry_settings: SchemaRegistrySettings,
    written: list[dict[str, Any]],
) -> None:
    def actions(**where: Any) -> list[str]:
        found = read(kafka_settings, topics, registry_settings, AuditFilter(**where))
        return [e["action"] for e in found]

    assert actions(actor="alice") == ["keys.create", "keys.revoke"]
    assert actions(action="lifecycle.") == ["lifecycle.promote", "lifecycle.retire"]
    assert actions(outcome="denied") == ["auth.failed", "lifecycle.promote"]
    assert actions(target="k-1", outcome="success") == ["keys.create", "keys.revoke"]
    # [START+1h, START+3h): the second and third entries, found by offsets_for_times.
    assert actions(since=START + timedelta(hours=1), until=START + timedelta(hours=3)) == [
        "keys.create",
        "lifecycle.promote",
    ]
    assert actions(since=START + timedelta(hours=10)) == []
    limited = read(kafka_settings, topics, registry_settings, limit=2)
    assert [e["action"] for e in limited] == ["keys.revoke", "lifecycle.retire"]


def test_the_cli_reads_the_trail_with_filters(
    topics: TopicSettings, written: list[dict[str, Any]]
) -> None:
    env = {"TIDEGATE_TOPICS_AUDIT": topics.audit, "COLUMNS": "200"}
    since = (START + timedelta(hours=1)).isoformat()
    result = CliRunner().invoke(
        app, ["audit", "--json", "--since", since, "--outcome", "denied"], env=env
    )
    assert result.exit_code == 0, result.output
    (line,) = result.output.splitlines()
    entry = json.loads(line)
    assert (entry["actor"], entry["action"], entry["target"]) == (
        "k-1",
        "lifecycle.promote",
        "fraud@2",
    )
    assert entry["at"] == (START + timedelta(hours=2)).isoformat(timespec="milliseconds")
    table = CliRunner().invoke(app, ["audit", "--actor", "bob"], env=env)
    assert table.exit_code == 0, table.output
    for text in ("bob", "lifecycle.retire", "fraud@1", "failure", "10.0.0.4:54000"):
        assert text in table.output
    assert "alice" not in table.output


def test_follow_yields_entries_written_after_it_began(
    kafka_settings: KafkaSettings,
    topics: TopicSettings,
    registry_settings: SchemaRegistrySettings,
    written: list[dict[str, Any]],
) -> None:
    seen: list[dict[str, Any]] = []
    stop = threading.Event()

    def follow() -> None:
        with AuditReader(kafka_settings, topics, registry_settings) as reader:
            seen.extend(reader.follow(AuditFilter(actor="carol"), stop=stop))

    thread = threading.Thread(target=follow, daemon=True)
    thread.start()
    trail = KafkaAuditTrail(kafka_settings, topics, registry_settings, service="cli")
    trail.start()
    try:
        trail.record("keys.create", actor="carol", outcome="success", target="k-9")
        wait_for(lambda: seen, timeout=20, what="the followed entry")
    finally:
        trail.close()
        stop.set()
        thread.join(timeout=10)
    assert [(e["actor"], e["service"], e["target"]) for e in seen] == [("carol", "cli", "k-9")]


def test_a_trail_that_cannot_deliver_counts_the_loss_and_never_raises(
    topics: TopicSettings, registry_settings: SchemaRegistrySettings
) -> None:
    service = unique("svc")
    nowhere = KafkaSettings(bootstrap_servers="127.0.0.1:1")
    trail = KafkaAuditTrail(
        nowhere,
        topics,
        registry_settings,
        service=service,
        producer_extra={"message.timeout.ms": 500},
    )
    trail.start()
    try:
        trail.record("auth.failed", actor="anonymous", outcome="denied")
        wait_for(
            lambda: REGISTRY.get_sample_value(
                "tidegate_audit_failures_total", {"service": service, "reason": "delivery"}
            ),
            timeout=15,
            what="the delivery failure to be counted",
        )
    finally:
        assert trail.close(timeout=1) == 0
