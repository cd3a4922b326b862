"""The completed lineage on real Kafka and PostgreSQL: a result's source, schema id and redelivery
history reach `tidegate served`; a request id reused for other content is a recorded conflict,
once however often it is redelivered; a later delivery of the same request (a redrive) replaces
an ERROR row while the live windows count the request once; migration 0005 rolls back."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
import typer
from confluent_kafka.schema_registry import SchemaRegistryClient
from prometheus_client import REGISTRY
from psycopg_pool import AsyncConnectionPool
from typer.testing import CliRunner
from yoyo import get_backend, read_migrations

from tests.integration.lifecycle.lineage_support import (
    ResultPublisher,
    make_result,
    register_lineage_subjects,
)
from tests.support import eventually, unique
from tidegate.cli import served as served_command
from tidegate.core.db import MIGRATIONS_DIR, migrate
from tidegate.core.settings import (
    KafkaSettings,
    PostgresSettings,
    SchemaRegistrySettings,
    TopicSettings,
)
from tidegate.lifecycle.control.indexer import Indexer
from tidegate.lifecycle.control.served_rows import ServedBatch, served_row, store_served
from tidegate.lifecycle.domain.windows import LiveWindows
from tidegate.lifecycle.readmodels.lineage import Position, served

Pool = AsyncConnectionPool[Any]

REQUESTS = {"topic": "inference-requests", "partition": 3, "offset": 41}
FAILED = {"topic": "inference-failed-requests", "partition": 0, "offset": 9}
REPLAYED = {"topic": "inference-requests", "partition": 5, "offset": 1200}
SINCE = datetime(2000, 1, 1, tzinfo=UTC)


def lineage_result(
    request_id: str,
    *,
    digest: str | None = "d1",
    history: list[dict[str, Any]] | None = None,
    source: dict[str, Any] | None = None,
    origin: dict[str, Any] | None = None,
    attempt: int = 1,
    **kw: Any,
) -> dict[str, Any]:
    """An InferenceResult with the lineage fields a worker fills."""
    return {
        **make_result(request_id, **kw),
        "source": source if source is not None else REQUESTS,
        "request_schema_id": 17,
        "request_digest": digest,
        "attempt": attempt,
        "origin": origin,
        "history": history or [],
    }


def step(
    kind: str, minutes: int, source: dict[str, Any], run: str | None, reason: str | None
) -> dict[str, Any]:
    at = datetime(2026, 5, 1, 11, 0, tzinfo=UTC) + timedelta(minutes=minutes)
    return {"kind": kind, "at": at, "from": source, "id": run, "reason": reason}


@pytest.fixture
def topics(
    new_topic: Callable[..., str], registry_settings: SchemaRegistrySettings
) -> TopicSettings:
    settings = TopicSettings(
        results=new_topic("lin-results", partitions=2), shadow=new_topic("lin-shadow")
    )
    register_lineage_subjects(registry_settings, settings)
    return settings


@pytest.fixture
def publisher(
    kafka_settings: KafkaSettings, registry_settings: SchemaRegistrySettings, topics: TopicSettings
) -> ResultPublisher:
    return ResultPublisher(kafka_settings, registry_settings, topics)


@pytest.fixture
def start_indexer(
    pg_pool: Pool,
    kafka_settings: KafkaSettings,
    registry_settings: SchemaRegistrySettings,
    topics: TopicSettings,
) -> Callable[[LiveWindows], Indexer]:
    def make(windows: LiveWindows) -> Indexer:
        client = SchemaRegistryClient(registry_settings.client_config())
        return Indexer(
            pg_pool,
            kafka_settings,
            topics,
            client,
            group_id=unique("lineage"),
            windows=windows,
            poll_s=0.2,
        )

    return make


async def consumed(idx: Indexer, n: int, what: str) -> None:
    async def probe() -> bool:
        return idx.indexed >= n

    await eventually(probe, timeout=60, what=what)


async def index(
    start_indexer: Callable[[LiveWindows], Indexer], n: int = 1, what: str = "the result"
) -> None:
    """Run a new indexer until it has stored `n` results."""
    idx = start_indexer(LiveWindows())
    await idx.start()
    try:
        await consumed(idx, n, what)
    finally:
        await idx.stop()


def records(outcome: str) -> float:
    labels = {"kind": "result", "outcome": outcome}
    return REGISTRY.get_sample_value("tidegate_indexer_records_total", labels) or 0.0


async def conflict_rows(pool: Pool) -> list[tuple[Any, ...]]:
    async with pool.connection() as conn:
        cur = await conn.execute(
            "SELECT request_id, digest, first_digest, worker_id FROM request_id_conflicts"
            " ORDER BY request_id, digest"
        )
        return list(await cur.fetchall())


async def test_served_shows_the_source_schema_id_attempt_origin_and_history(
    pg_pool: Pool,
    pg_settings: PostgresSettings,
    topics: TopicSettings,
    publisher: ResultPublisher,
    start_indexer: Callable[[LiveWindows], Indexer],
) -> None:
    history = [
        step("replay", 0, REQUESTS, "replay-7", None),
        step("redrive", 30, FAILED, "redrive-2", "MODEL_ERROR"),
    ]
    publisher.results(
        [
            lineage_result(
                "req-1", source=REPLAYED, origin=REQUESTS, attempt=3, history=history,
                digest="ab" * 16, version="2", rule="split@7", worker_id="worker-a",
            ),
        ]
    )  # fmt: skip
    await index(start_indexer)

    record = await served(pg_pool, "req-1")
    assert record is not None
    assert (record.version, record.routing_rule, record.worker_id) == ("2", "split@7", "worker-a")
    assert record.source == Position("inference-requests", 5, 1200)
    assert record.origin == Position("inference-requests", 3, 41)
    assert (record.request_schema_id, record.request_digest, record.attempt) == (17, "ab" * 16, 3)
    assert record.history == [
        {"kind": "replay", "at": "2026-05-01T11:00:00+00:00", "from": REQUESTS,
         "id": "replay-7", "reason": None},
        {"kind": "redrive", "at": "2026-05-01T11:30:00+00:00", "from": FAILED,
         "id": "redrive-2", "reason": "MODEL_ERROR"},
    ]  # fmt: skip
    assert record.conflicts == []

    # The command itself, as an operator runs it: JSON and the table.
    app = typer.Typer()
    app.command("served")(served_command.served)
    app.command("unused")(lambda: None)  # two commands: `served` stays a subcommand
    env = {"TIDEGATE_POSTGRES_DB_SCHEMA": pg_settings.db_schema, "COLUMNS": "240"}
    as_json = await asyncio.to_thread(
        CliRunner().invoke, app, ["served", "req-1", "--json"], env=env
    )
    assert as_json.exit_code == 0, as_json.output
    request = json.loads(as_json.stdout)["request"]
    assert request["source"] == {"topic": "inference-requests", "partition": 5, "offset": 1200}
    assert request["origin"] == REQUESTS
    assert (request["request_schema_id"], request["attempt"]) == (17, 3)
    assert [s["id"] for s in request["history"]] == ["replay-7", "redrive-2"]
    assert request["conflicts"] == []
    table = await asyncio.to_thread(CliRunner().invoke, app, ["served", "req-1"], env=env)
    assert table.exit_code == 0, table.output
    for expected in (
        "split@7", "worker-a", "request schema id", "inference-requests:5:1200",
        "inference-requests:3:41", "replay-7", "redrive-2", "inference-failed-requests:0:9",
    ):  # fmt: skip
        assert expected in table.stdout, expected
    assert "CONFLICT" not in table.stdout


async def test_text_that_copy_escapes_is_stored_as_it_was_sent(
    pg_pool: Pool,
    topics: TopicSettings,
    publisher: ResultPublisher,
    start_indexer: Callable[[LiveWindows], Indexer],
) -> None:
    """Rows reach PostgreSQL through COPY's text format, where a tab, a newline, a backslash or
    a literal \\N would split or nullify a field if psycopg did not escape it."""
    key = 'tab\there\nnewline \\N backslash "quoted" \u00e9'
    reason = "line one\n\tline two \\ end"
    result = lineage_result(
        "req-escapes\t1", worker_id="worker\\b", rule=None,
        history=[step("redrive", 0, FAILED, "run\t\\N", reason)],
    )  # fmt: skip
    result["routing_key"] = key
    publisher.results([result])
    await index(start_indexer)

    record = await served(pg_pool, "req-escapes\t1")
    assert record is not None
    assert (record.routing_key, record.worker_id, record.routing_rule) == (key, "worker\\b", None)
    assert [(s["id"], s["reason"]) for s in record.history] == [("run\t\\N", reason)]


async def test_storing_outside_a_transaction_is_refused(pg_pool: Pool) -> None:
    """Staged rows are emptied at each commit, so an autocommit statement would stage rows the
    upsert never sees: the store refuses rather than drop the batch."""
    batch = ServedBatch()
    batch.add(served_row(lineage_result("req-no-transaction")))
    async with pg_pool.connection() as conn:
        with pytest.raises(RuntimeError, match="open transaction"):
            await store_served(conn, batch)
    assert await served(pg_pool, "req-no-transaction") is None


async def test_a_reused_request_id_is_a_conflict_recorded_once(
    pg_pool: Pool,
    topics: TopicSettings,
    publisher: ResultPublisher,
    start_indexer: Callable[[LiveWindows], Indexer],
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="tidegate.lifecycle.control.served_rows")
    conflicts_before, duplicates_before = records("conflict"), records("duplicate")
    publisher.results([lineage_result("r1", digest="d1", worker_id="first")])
    idx = start_indexer(LiveWindows())
    await idx.start()
    try:
        await consumed(idx, 1, "the first result")
        other = lineage_result("r1", digest="d2", worker_id="other", source=REPLAYED)
        publisher.results(
            [
                other,
                other,  # redelivered: still one conflict
                lineage_result("r1", digest="d1", worker_id="again"),  # a plain duplicate
                # Both contents in one batch: the first one read is served.
                lineage_result("r2", digest="d1", worker_id="first"),
                lineage_result("r2", digest="d3", worker_id="other"),
            ]
        )
        await consumed(idx, 6, "the later results")
    finally:
        await idx.stop()

    one = await served(pg_pool, "r1")
    assert one is not None
    assert (one.worker_id, one.request_digest) == ("first", "d1")
    (conflict,) = one.conflicts
    assert (conflict.digest, conflict.first_digest, conflict.worker_id) == ("d2", "d1", "other")
    assert conflict.source == Position("inference-requests", 5, 1200)
    two = await served(pg_pool, "r2")
    assert two is not None
    assert (two.worker_id, [c.digest for c in two.conflicts]) == ("first", ["d3"])
    assert await conflict_rows(pg_pool) == [
        ("r1", "d2", "d1", "other"),
        ("r2", "d3", "d1", "other"),
    ]
    assert records("conflict") - conflicts_before == 2
    assert records("duplicate") - duplicates_before == 2  # the redelivered d2 and the d1 again
    warnings = [r for r in caplog.records if "reused with other content" in r.getMessage()]
    assert len(warnings) == 2

    # A new group reads everything again: nothing new is recorded, nothing warned.
    caplog.clear()
    await index(start_indexer, 6, "the redelivery")
    assert len(await conflict_rows(pg_pool)) == 2
    assert records("conflict") - conflicts_before == 2
    assert not [r for r in caplog.records if "reused with other content" in r.getMessage()]


async def test_a_redrive_replaces_an_error_and_the_windows_count_the_request_once(
    pg_pool: Pool,
    topics: TopicSettings,
    publisher: ResultPublisher,
    start_indexer: Callable[[LiveWindows], Indexer],
) -> None:
    replaced_before = records("replaced")
    redrive = [step("redrive", 0, FAILED, "redrive-2", "MODEL_ERROR")]
    replay = [step("replay", 5, REQUESTS, "replay-1", None)]
    publisher.results(
        [
            lineage_result("e1", status="ERROR", worker_id="w1"),
            lineage_result("e2", status="ERROR", worker_id="w1"),
            lineage_result("ok", worker_id="w1"),
        ]
    )
    windows = LiveWindows()
    idx = start_indexer(windows)
    await idx.start()
    try:
        await consumed(idx, 3, "the first results")
        publisher.results(
            [
                # Redriven and now OK: replaces the ERROR.
                lineage_result(
                    "e1", worker_id="w2", source=FAILED, origin=REQUESTS, attempt=2, history=redrive
                ),
                # Redriven and failed again: the later attempt is shown.
                lineage_result("e2", status="ERROR", worker_id="w2", attempt=2, history=redrive),
                # A replay that failed never replaces an OK result.
                lineage_result("ok", status="ERROR", worker_id="w2", history=replay),
                # The original ERROR arriving late changes nothing.
                lineage_result("e1", status="ERROR", worker_id="w1"),
                # A request id reused for other content is not a later delivery.
                lineage_result("e2", digest="d9", worker_id="w3", history=redrive * 2),
            ]
        )
        await consumed(idx, 8, "the redelivered results")
    finally:
        await idx.stop()

    e1 = await served(pg_pool, "e1")
    assert e1 is not None
    assert (e1.status, e1.error_code, e1.worker_id, e1.attempt) == ("OK", None, "w2", 2)
    assert e1.source == Position("inference-failed-requests", 0, 9)
    assert e1.origin == Position("inference-requests", 3, 41)
    assert [(s["kind"], s["id"]) for s in e1.history] == [("redrive", "redrive-2")]
    e2 = await served(pg_pool, "e2")
    assert e2 is not None
    assert (e2.status, e2.worker_id, e2.attempt, len(e2.history)) == ("ERROR", "w2", 2, 1)
    assert [c.digest for c in e2.conflicts] == ["d9"]
    ok = await served(pg_pool, "ok")
    assert ok is not None
    assert (ok.status, ok.worker_id, ok.history) == ("OK", "w1", [])
    assert records("replaced") - replaced_before == 2

    # Each request once, as its first result: two errors and one OK, none added by the redrive.
    stats = windows.stats("fraud", "v1", SINCE)
    assert (stats.count, stats.errors) == (3, 2)


def test_migration_0005_rolls_back_and_applies_again(pg_settings: PostgresSettings) -> None:
    def columns() -> set[str]:
        with psycopg.connect(pg_settings.conninfo()) as conn:
            rows = conn.execute(
                "SELECT column_name FROM information_schema.columns"
                " WHERE table_schema = %s AND table_name = 'served_requests'",
                (pg_settings.db_schema,),
            ).fetchall()
        return {row[0] for row in rows}

    def version() -> str:
        with psycopg.connect(pg_settings.conninfo()) as conn:
            row = conn.execute(
                "SELECT value FROM tidegate_meta WHERE key = 'schema_version'"
            ).fetchone()
        assert row is not None
        return str(row[0])

    added = {"source_topic", "source_offset", "request_schema_id", "request_digest", "attempt"}
    assert added | {"origin_topic", "history"} <= columns()
    migrations = read_migrations(str(MIGRATIONS_DIR))
    later = migrations.filter(lambda m: m.id >= "0005_lineage_sources")
    url = f"{pg_settings.url()}?schema={pg_settings.db_schema}"
    with get_backend(url) as backend, backend.lock():
        backend.rollback_migrations(backend.to_rollback(later))
    assert not added & columns()
    assert version() == "4"
    assert "0005_lineage_sources" in migrate(pg_settings)
    assert added <= columns()
