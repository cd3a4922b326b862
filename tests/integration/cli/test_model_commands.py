"""`tidegate models ...` and `tidegate served` against the real PostgreSQL, Kafka and registry.

Each test has its own schema (pg_settings), artifact store and lifecycle topic; packages of the
real example models (`tidegate models build`) are registered, validated by loading them, and
rolled out. The lineage rows a controller's indexer would write are inserted directly.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import uuid
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
import typer
from confluent_kafka import OFFSET_BEGINNING, TopicPartition
from confluent_kafka.schema_registry import SchemaRegistryClient
from typer.testing import CliRunner, Result

from tests.support import unique, wait_for
from tidegate.cli import model_commands as models
from tidegate.cli import served
from tidegate.core.db import make_pool
from tidegate.core.errors import ConcurrencyConflictError
from tidegate.core.kafka import make_consumer
from tidegate.core.settings import (
    KafkaSettings,
    PostgresSettings,
    SchemaRegistrySettings,
    TopicSettings,
)
from tidegate.lifecycle.domain import events as ev
from tidegate.lifecycle.domain.state import ModelState
from tidegate.lifecycle.eventstore.event_codec import LifecycleCodec
from tidegate.lifecycle.eventstore.event_store import EventStore
from tidegate.lifecycle.eventstore.outbox import OutboxRelay
from tidegate.lifecycle.lifecycle_settings import LifecycleSettings
from tidegate.lifecycle.operations.commands import LifecycleCommands
from tidegate.lifecycle.operations.register import import_package, read_package
from tidegate.models.model_settings import ModelSettings
from tidegate.models.store import LocalArtifactStore

REPO = Path(__file__).resolve().parents[3]

# The two command groups as `tidegate` mounts them (tidegate/cli/__init__.py).
app = typer.Typer()
app.add_typer(models.app, name="models")
app.command("served")(served.served)


@pytest.fixture
def env(pg_settings: PostgresSettings, tmp_path: Path, lifecycle_topic: str) -> dict[str, str]:
    return {
        "TIDEGATE_POSTGRES_DB_SCHEMA": pg_settings.db_schema,
        "TIDEGATE_MODELS_STORE_DIR": str(tmp_path / "store"),
        "TIDEGATE_TOPICS_LIFECYCLE": lifecycle_topic,
        "TIDEGATE_CLI_ACTOR": "alice",
    }


def cli(env: dict[str, str], *args: str) -> Result:
    return CliRunner().invoke(app, list(args), env=env)


def cli_json(env: dict[str, str], *args: str, code: int = 0) -> Any:
    result = cli(env, *args, "--json")
    assert result.exit_code == code, result.output
    return json.loads(result.stdout)


def register(env: dict[str, str], packages: Path, version: str, **kw: str) -> Any:
    extra = [a for k, v in kw.items() for a in (f"--{k}", v)]
    return cli_json(env, "models", "register", str(packages / "fraud" / version), *extra)


def sql(pg: PostgresSettings, query: str, rows: list[tuple[Any, ...]]) -> None:
    with psycopg.connect(pg.conninfo(), autocommit=True) as conn, conn.cursor() as cur:
        cur.executemany(query, rows)


def loaded(pg: PostgresSettings, version: str, expected: int) -> None:
    """A worker reports the version warm (what agents/inference/version_manager.py appends)."""

    async def go() -> None:
        pool = make_pool(pg, LifecycleSettings())
        await pool.open(wait=True)
        try:
            event = ev.NewEvent(ev.VersionLoaded(version, "w1", 12.0), actor="worker:w1")
            await EventStore(pool).append("fraud", [event], expected_version=expected)
        finally:
            await pool.close()

    asyncio.run(go())


def unpublished(pg: PostgresSettings) -> int:
    with psycopg.connect(pg.conninfo(), autocommit=True) as conn:  # the schema's search_path
        row = conn.execute("SELECT count(*) FROM outbox WHERE published_at IS NULL").fetchone()
    assert row is not None
    return int(row[0])


def relay_once(
    pg: PostgresSettings, kafka: KafkaSettings, registry: SchemaRegistrySettings, topic: str
) -> None:
    """What the controller's relay does on an append's NOTIFY: publish the outbox."""

    async def go() -> None:
        pool = make_pool(pg, LifecycleSettings())
        await pool.open(wait=True)
        codec = LifecycleCodec(
            SchemaRegistryClient(registry.client_config()), TopicSettings(lifecycle=topic)
        )
        try:
            async with OutboxRelay(pool, kafka, topic, codec.encode) as relay:
                await relay.flush()
        finally:
            await pool.close()

    asyncio.run(go())


def topic_sequences(kafka: KafkaSettings, registry: SchemaRegistrySettings, topic: str) -> Any:
    codec = LifecycleCodec(
        SchemaRegistryClient(registry.client_config()), TopicSettings(lifecycle=topic)
    )
    consumer = make_consumer(kafka, unique("h5-reader"))
    consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
    seen: list[int] = []
    try:

        def read() -> list[int] | None:
            msg = consumer.poll(0.5)
            if msg is not None and msg.error() is None:
                seen.append(codec.decode(msg.value()).sequence)
            return seen if len(seen) >= 5 else None

        return wait_for(read, timeout=30, interval=0, what="the lifecycle events on Kafka")
    finally:
        consumer.close()


def test_register_validate_inspect_and_promote(
    env: dict[str, str],
    packages: Path,
    lifecycle_topic: str,
    kafka_settings: KafkaSettings,
    registry_settings: SchemaRegistrySettings,
    pg_settings: PostgresSettings,
) -> None:
    first = register(env, packages, "1")
    assert (first["action"], first["status"], first["version"]) == ("registered", "validated", "1")
    assert [e["type"] for e in first["events"]] == ["ModelRegistered", "ArtifactValidated"]
    assert {e["actor"] for e in first["events"]} == {"local:alice"}
    assert first["events"][1]["payload"]["load_ms"] > 0
    assert first["events"][0]["correlation_id"] == first["events"][1]["correlation_id"]
    again = register(env, packages, "1")
    assert (again["action"], again["events"]) == ("unchanged", [])
    register(env, packages, "2")

    listed = cli_json(env, "models", "list")
    assert [(m["model"], m["versions"]) for m in listed] == [
        ("fraud", {"1": "validated", "2": "validated"})
    ]
    promoted = cli_json(env, "models", "promote", "fraud", "1")
    assert promoted["events"][0]["payload"] == {
        "version": "1",
        "forced": False,
        "previous": None,
        "agreement": None,
    }
    status = cli_json(env, "models", "status", "fraud")
    assert (status["primary"], status["weights"], status["sequence"]) == ("1", {"1": 100}, 5)
    history = cli_json(env, "models", "history", "fraud")
    assert [e["type"] for e in history] == [
        "ModelRegistered",
        "ArtifactValidated",
        "ModelRegistered",
        "ArtifactValidated",
        "Promoted",
    ]
    table = cli(env, "models", "status", "fraud")
    assert table.exit_code == 0
    assert "primary=1" in table.stdout
    assert "validated" in table.stdout
    # The CLI wrote the event store only: the controller's outbox relay publishes, in order.
    assert unpublished(pg_settings) == 5
    relay_once(pg_settings, kafka_settings, registry_settings, lifecycle_topic)
    assert unpublished(pg_settings) == 0
    assert topic_sequences(kafka_settings, registry_settings, lifecycle_topic) == [1, 2, 3, 4, 5]


def test_shadow_gate_force_rollback_canary_rules_and_retire(
    env: dict[str, str], packages: Path, pg_settings: PostgresSettings
) -> None:
    register(env, packages, "1")
    register(env, packages, "2")
    cli_json(env, "models", "promote", "fraud", "1")
    refused = cli_json(env, "models", "promote", "fraud", "2", code=1)
    assert refused["code"] == "PROMOTION_GATE"
    loaded(pg_settings, "2", expected=5)
    shadowed = cli_json(env, "models", "shadow", "fraud", "2", "--rate", "0.5")
    assert shadowed["state"]["shadows"] == {"2": 0.5}

    gate = cli_json(env, "models", "promote", "fraud", "2", code=1)
    assert gate["code"] == "PROMOTION_GATE"
    assert "0 shadow comparisons" in gate["error"]
    compared = cli_json(env, "models", "compare", "fraud", "--candidate", "2")
    assert (compared["stats"]["samples"], compared["gate"]["passed"]) == (0, False)

    forced = cli_json(env, "models", "promote", "fraud", "2", "--force")
    payload = forced["events"][0]["payload"]
    assert (payload["forced"], payload["previous"]) == (True, "1")
    back = cli_json(env, "models", "rollback", "fraud")
    assert back["events"][0]["payload"]["to_version"] == "1"
    assert back["events"][0]["payload"]["reason"] == "operator"
    assert back["state"]["primary"] == "1"

    # 120 comparisons, 115 agreeing on all 10 rows: agreement 1150/1200.
    now = datetime.now().astimezone()
    sql(
        pg_settings,
        "INSERT INTO shadow_comparisons (model, candidate_version, request_id, primary_version,"
        " kind, rows, agree_rows, abs_diff_sum, value_count, primary_ms, candidate_ms,"
        " compared_at) VALUES ('fraud', '2', %s, '1', 'classifier', 10, %s, 0.5, 20, 1, 2, %s)",
        [(f"r{i}", 10 if i < 115 else 0, now) for i in range(120)],
    )
    # Comparisons with another primary say nothing about replacing this one: not counted.
    sql(
        pg_settings,
        "INSERT INTO shadow_comparisons (model, candidate_version, request_id, primary_version,"
        " kind, rows, agree_rows, compared_at) VALUES ('fraud', '2', %s, '0', 'classifier', 10,"
        " 0, %s)",
        [(f"old{i}", now) for i in range(50)],
    )
    # Comparisons from before the latest shadow run judged an earlier run: not counted.
    sql(
        pg_settings,
        "INSERT INTO shadow_comparisons (model, candidate_version, request_id, primary_version,"
        " kind, rows, agree_rows, compared_at) VALUES ('fraud', '2', %s, '1', 'classifier', 10,"
        " 0, %s)",
        [(f"earlier{i}", now - timedelta(days=1)) for i in range(50)],
    )
    compared = cli_json(env, "models", "compare", "fraud", "--candidate", "2")
    assert compared["stats"]["samples"] == 120
    assert compared["stats"]["agreement"] == pytest.approx(1150 / 1200)
    assert compared["gate"]["passed"] is True
    passed = cli_json(env, "models", "promote", "fraud", "2")
    payload = passed["events"][0]["payload"]
    assert (payload["forced"], payload["agreement"]) == (False, pytest.approx(1150 / 1200))
    cli_json(env, "models", "rollback", "fraud", "--version", "2")

    canary = cli_json(
        env, "models", "canary", "fraud", "2", "--steps", "10,50,100", "--dwell", "5",
        "--max-error-rate", "0.1",
    )  # fmt: skip
    started = canary["events"][0]["payload"]
    assert (started["steps"], started["dwell_s"], started["baseline"]) == ([10, 50, 100], 5.0, "1")
    assert started["thresholds"]["max_error_rate"] == 0.1
    assert started["thresholds"]["min_requests"] == LifecycleSettings().canary_min_requests
    busy = cli_json(env, "models", "canary", "fraud", "2", code=1)
    assert "already has a canary" in busy["error"]
    # Results the indexer stored since the canary began: the rollback records them.
    since = datetime.fromisoformat(canary["events"][0]["occurred_at"])
    rows = [(f"c{i}", "2", "ERROR" if i < 3 else "OK", since, float(i)) for i in range(10)]
    rows += [(f"b{i}", "1", "OK", since, 1.0) for i in range(20)]
    rows.append(("old", "1", "OK", since - timedelta(hours=1), 50.0))  # before: not counted
    sql(
        pg_settings,
        "INSERT INTO served_requests (request_id, model, version, status, completed_at, total_ms)"
        " VALUES (%s, 'fraud', %s, %s, %s, %s)",
        rows,
    )
    aborted = cli_json(env, "models", "rollback", "fraud")
    assert aborted["state"]["canary"] is None
    metrics = aborted["events"][0]["payload"]["metrics"]
    assert metrics["candidate_requests"] == 10
    assert metrics["candidate_error_rate"] == pytest.approx(0.3)
    assert (metrics["baseline_requests"], metrics["baseline_errors"]) == (20, 0)
    assert metrics["baseline_p99_ms"] == pytest.approx(1.0)

    pinned = cli_json(env, "models", "pin", "fraud", "2", "--tenant", "acme")
    assert pinned["state"]["rules"][0]["rule_id"] == "pin-acme"
    assert cli_json(env, "models", "retire", "fraud", "2", code=1)["code"] == "INVALID_TRANSITION"
    cli_json(env, "models", "unpin", "fraud", "--tenant", "acme")
    split = cli_json(env, "models", "experiment", "fraud", "--weights", "1=60,2=40")
    assert split["state"]["rules"][0]["weights"] == {"1": 60, "2": 40}
    assert cli_json(env, "models", "experiment", "fraud", "--weights", "1=60,2=50", code=1)
    cli_json(env, "models", "unpin", "fraud", "--rule", "experiment-all")
    assert cli_json(env, "models", "retire", "fraud", "1", code=1)["code"] == "INVALID_TRANSITION"
    retired = cli_json(env, "models", "retire", "fraud", "2")
    assert retired["state"]["versions"][1]["status"] == "retired"


def test_two_concurrent_promotes_of_the_same_state_one_wins_one_conflicts(
    env: dict[str, str], packages: Path
) -> None:
    register(env, packages, "1")
    command = [sys.executable, "-m", "tidegate", "models", "promote", "fraud", "1"]
    command += ["--expected-sequence", "2", "--json"]
    procs = [
        subprocess.Popen(
            command,
            env={**os.environ, **env},
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    outcomes = sorted((p.wait(timeout=120), p.stdout.read() if p.stdout else "") for p in procs)
    assert [code for code, _ in outcomes] == [0, 3], outcomes
    conflict = json.loads(outcomes[1][1])
    assert conflict["code"] == "CONFLICT"
    history = cli_json(env, "models", "history", "fraud")
    assert [e["type"] for e in history].count("Promoted") == 1


async def test_a_race_between_two_promotes_is_a_conflict_not_a_silent_retry(
    pg_pool: Any, packages: Path, tmp_path: Path
) -> None:
    """Both commands read the same state before either appends (a barrier holds them)."""

    class Barrier(EventStore):
        def __init__(self, pool: Any) -> None:
            super().__init__(pool)
            self.barrier = asyncio.Barrier(2)

        async def load(self, stream: str, *, until: datetime | None = None) -> ModelState:
            state = await super().load(stream, until=until)
            await self.barrier.wait()
            return state

    store = LocalArtifactStore(ModelSettings(store_dir=tmp_path / "store"))
    plain = LifecycleCommands(EventStore(pg_pool), pg_pool, store, LifecycleSettings())
    await plain.register(packages / "fraud" / "1", actor="alice")
    racing = Barrier(pg_pool)
    commands = LifecycleCommands(racing, pg_pool, store, LifecycleSettings(), events=racing)
    outcomes = await asyncio.gather(
        commands.promote("fraud", "1", actor="alice"),
        commands.promote("fraud", "1", actor="bob"),
        return_exceptions=True,
    )
    conflicts = [o for o in outcomes if isinstance(o, ConcurrencyConflictError)]
    assert len(conflicts) == 1
    assert (conflicts[0].expected, conflicts[0].actual) == (2, 3)
    assert [e.type for e in await EventStore(pg_pool).read("fraud")].count("Promoted") == 1


async def test_an_interrupted_registration_is_validated_by_a_rerun(
    pg_pool: Any, packages: Path, tmp_path: Path
) -> None:
    """ModelRegistered was appended but the command died before validating: a re-run of the
    same registration validates it instead of calling it unchanged."""
    store = LocalArtifactStore(ModelSettings(store_dir=tmp_path / "store"))
    directory = packages / "fraud" / "1"
    imported = await import_package(store, directory, read_package(directory))
    event = ev.NewEvent(imported.registered(), actor="alice")
    await EventStore(pg_pool).append("fraud", [event], expected_version=0)
    commands = LifecycleCommands(EventStore(pg_pool), pg_pool, store, LifecycleSettings())
    result = await commands.register(directory, actor="alice")
    assert result.action == "validated"
    assert [e.type for e in result.events] == ["ArtifactValidated"]
    assert result.to_dict()["status"] == "validated"
    again = await commands.register(directory, actor="alice")
    assert (again.action, again.events) == ("unchanged", [])


def test_state_at_and_served_before_and_after_a_promotion(
    env: dict[str, str], packages: Path, pg_settings: PostgresSettings
) -> None:
    register(env, packages, "1")
    register(env, packages, "2")
    first = cli_json(env, "models", "promote", "fraud", "1")
    t1 = datetime.fromisoformat(first["events"][0]["occurred_at"])
    loaded(pg_settings, "2", expected=5)
    second = cli_json(env, "models", "promote", "fraud", "2", "--force")
    t2 = datetime.fromisoformat(second["events"][0]["occurred_at"])
    assert t2 > t1

    before = cli_json(
        env, "models", "state", "fraud", "--at", (t1 - timedelta(0, 0, 1000)).isoformat()
    )
    assert (before["state"]["primary"], before["table"]["weights"]) == (None, {})
    at_first = cli_json(env, "models", "state", "fraud", "--at", t1.isoformat())
    assert (at_first["state"]["primary"], at_first["table"]["weights"]) == ("1", {"1": 100})
    now = cli_json(env, "models", "state", "fraud")
    assert (now["state"]["primary"], now["state"]["previous_primary"]) == ("2", "1")
    ago = cli_json(env, "models", "state", "fraud", "--at", "-1h")
    assert ago["state"]["sequence"] == 0

    middle = t1 + (t2 - t1) / 2
    rows = [
        ("req-before", "1", "split@5", middle),
        ("req-after", "2", "split@7", t2 + timedelta(milliseconds=5)),
    ]
    sql(
        pg_settings,
        "INSERT INTO served_requests (request_id, model, version, status, worker_id,"
        " routing_rule, completed_at, total_ms) VALUES (%s, 'fraud', %s, 'OK', 'w1', %s, %s, 3)",
        rows,
    )
    for request_id, version, rule, _ in rows:
        served = cli_json(env, "served", request_id)
        assert served["request"]["version"] == version
        assert served["request"]["routing_rule"] == rule
        assert served["request"]["worker_id"] == "w1"
        assert served["state"]["primary"] == version
        assert served["lineage"]["version"] == version
        assert served["lineage"]["registered_by"] == "local:alice"
    assert cli_json(env, "served", "req-after")["lineage"]["forced"] is True
    table = cli(env, "served", "req-before")
    assert table.exit_code == 0
    assert "split@5" in table.stdout
    assert cli_json(env, "served", "nope", code=1)["code"] == "NOT_FOUND"


def test_a_corrupt_package_is_registered_failed_and_never_servable(
    env: dict[str, str], packages: Path, tmp_path: Path
) -> None:
    register(env, packages, "1")
    cli_json(env, "models", "promote", "fraud", "1")
    # Other content under a stored version is a naming mistake: refused, nothing recorded.
    renamed = str(packages / "fraud" / "2")
    clash = cli_json(env, "models", "register", renamed, "--version", "1", code=1)
    assert "immutable" in clash["error"]
    assert len(cli_json(env, "models", "history", "fraud")) == 3
    corrupt = tmp_path / "corrupt"
    shutil.copytree(packages / "fraud" / "2", corrupt)
    (corrupt / "model.onnx").chmod(0o644)
    with (corrupt / "model.onnx").open("r+b") as handle:
        handle.seek(1000)
        handle.write(b"\x00" * 64)
    tampered = cli_json(env, "models", "register", str(corrupt), "--version", "2-corrupt", code=1)
    assert (tampered["status"], tampered["version"]) == ("failed", "2-corrupt")
    assert "sha256" in tampered["reason"]
    assert [e["type"] for e in tampered["events"]] == ["ModelRegistered", "ValidationFailed"]

    # Hashes left for the store to compute, but bytes no runtime can load.
    garbage = tmp_path / "garbage"
    garbage.mkdir()
    manifest = json.loads((packages / "fraud" / "2" / "manifest.json").read_text())
    manifest["files"] = {"model.onnx": ""}
    (garbage / "manifest.json").write_text(json.dumps(manifest))
    (garbage / "model.onnx").write_bytes(uuid.uuid4().bytes * 100)
    unloadable = cli_json(env, "models", "register", str(garbage), "--version", "2-garbage", code=1)
    assert unloadable["status"] == "failed"
    assert unloadable["reason"]

    for version in ("2-corrupt", "2-garbage"):
        refused = cli_json(env, "models", "promote", "fraud", version, "--force", code=1)
        assert "failed" in refused["error"]
        assert cli_json(env, "models", "shadow", "fraud", version, code=1)
    status = cli_json(env, "models", "status", "fraud")
    assert status["effective_weights"] == {"1": 100}
    assert {v["version"]: v["status"] for v in status["versions"]} == {
        "1": "validated",
        "2-corrupt": "failed",
        "2-garbage": "failed",
    }


def test_usage_errors_exit_2_and_unknown_models_exit_1(env: dict[str, str]) -> None:
    assert cli(env, "models", "state", "fraud", "--at", "yesterday").exit_code == 2
    assert cli(env, "models", "experiment", "fraud", "--weights", "1:50").exit_code == 2
    assert cli(env, "models", "canary", "fraud", "2", "--steps", "10,x").exit_code == 2
    assert cli(env, "models", "unpin", "fraud").exit_code == 2
    assert cli(env, "models", "register", "/nonexistent/package").exit_code == 2
    missing = cli(env, "models", "status", "nope")
    assert missing.exit_code == 1
    assert "no model 'nope'" in missing.stderr
