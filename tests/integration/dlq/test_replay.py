"""`tidegate replay` against the real Kafka, registry and PostgreSQL, on traffic a real worker
served with fraud 1 (`replay_fixtures.recorded`)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient
from psycopg_pool import AsyncConnectionPool
from typer.testing import CliRunner

from tests.integration.dlq.replay_fixtures import (
    PARTITIONS,
    REQUESTS,
    Recorded,
    create_topics,
    iso,
    onnx_probabilities,
)
from tests.support import unique
from tidegate.agents.inference.offline import OfflineScorer
from tidegate.cli import app
from tidegate.core.db import make_pool
from tidegate.core.errors import ModelExecutionError
from tidegate.core.kafka import make_consumer, make_producer
from tidegate.dlq.envelopes import dead_letter, error_info, source_position
from tidegate.dlq.ranges import resolve_times
from tidegate.dlq.redelivery import redelivery_headers, step
from tidegate.dlq.replay_run import ReplayRunner, Scorer, ServedVersions
from tidegate.dlq.replay_served import PostgresServed
from tidegate.dlq.replay_settings import ReplaySettings
from tidegate.dlq.replay_state import ReplayCheckpoint, checkpoint_path, new_run_id
from tidegate.lifecycle.lifecycle_settings import LifecycleSettings
from tidegate.schemas.catalog import DEAD_LETTER_ENVELOPE, load_schema
from tidegate.schemas.codec import AvroEncoder
from tidegate.schemas.tensors import to_numpy


@pytest.fixture
def targets(admin: AdminClient, recorded: Recorded) -> Iterator[Callable[[], str]]:
    """Result topics of the test's own, deleted afterwards (the CLI may create one itself)."""
    names: list[str] = []

    def make(create: bool = True) -> str:
        name = unique("rp-target")
        if create:
            create_topics(admin, recorded.registry, name)
        names.append(name)
        return name

    yield make
    present = admin.list_topics(timeout=15).topics
    gone = [n for n in names if n in present]
    if gone:
        for future in admin.delete_topics(gone).values():
            future.result(timeout=30)


def runner(
    recorded: Recorded,
    state: Path,
    target: str,
    scorer: Scorer,
    *,
    version: str | None = "1",
    served: ServedVersions | None = None,
    ids: tuple[str, ...] = (),
    stop_after: int | None = None,
    rate: float | None = None,
) -> ReplayRunner:
    """A run over the recorded time range, batches of 4."""
    consumer = make_consumer(recorded.kafka, unique("plan"))
    plan = resolve_times(consumer, recorded.topics.requests, recorded.from_ms, recorded.to_ms)
    consumer.close()
    checkpoint = ReplayCheckpoint(
        new_run_id(), plan, target, model="fraud", version=version, request_ids=ids, batch_size=4
    )
    return resumed(
        recorded, state, checkpoint, scorer, served=served, stop_after=stop_after, rate=rate
    )


def resumed(
    recorded: Recorded,
    state: Path,
    checkpoint: ReplayCheckpoint,
    scorer: Scorer,
    *,
    served: ServedVersions | None = None,
    stop_after: int | None = None,
    envelopes: bool = False,
    rate: float | None = None,
) -> ReplayRunner:
    def progress(done: int, total: int) -> None:
        if stop_after is not None and done >= stop_after:
            run.stop()  # what Ctrl-C does

    run = ReplayRunner(
        checkpoint,
        checkpoint_path(state, checkpoint.run_id),
        kafka=recorded.kafka,
        registry=recorded.client,
        requests=recorded.requests_decoder(),
        envelopes=recorded.envelopes() if envelopes else None,
        scorer=scorer,
        settings=ReplaySettings(state_dir=state, batch_size=4, stall_timeout_s=5),
        served=served,
        rate=rate,
        progress=progress,
    )
    return run


def test_a_time_range_replayed_on_another_version_writes_only_its_own_topic(
    recorded: Recorded,
    targets: Callable[..., str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    topics = recorded.topics
    target = targets(create=False)  # the command creates it and registers its schema
    committed = recorded.committed()
    assert all(offset >= 0 for _, offset in committed), "the live group committed its work"
    untouched = {t: recorded.high_watermarks(t) for t in (topics.results, topics.replies)}
    untouched[topics.failed] = recorded.high_watermarks(topics.failed)
    for key, value in recorded.env(tmp_path).items():
        monkeypatch.setenv(key, value)
    args = ["replay", "--from", iso(recorded.from_ms), "--to", iso(recorded.to_ms)]
    args += ["--model", "fraud", "--version", "2", "--to-topic", target, "--no-progress", "--json"]
    outcome = CliRunner().invoke(app, args)
    assert outcome.exit_code == 0, outcome.output
    summary = json.loads(outcome.stdout)
    assert (summary["status"], summary["read"], summary["replayed"]) == ("done", REQUESTS, REQUESTS)
    assert (summary["ok"], summary["errors"], summary["skipped"]) == (REQUESTS, {}, {})
    assert summary["results_topic"] == target
    assert sum(p["end"] - p["start"] for p in summary["partitions"]) == REQUESTS

    results = recorded.read(target, REQUESTS)
    assert sum(recorded.high_watermarks(target)) == REQUESTS
    assert sorted(r["request_id"] for r in results) == sorted(recorded.features)
    for result in results:
        rid = str(result["request_id"])
        sent = recorded.values[rid]
        assert (result["status"], result["model_version"]) == ("OK", "2")
        assert result["routing_rule"] == "replay:version"
        assert result["source"]["topic"] == topics.requests
        assert result["origin"] == result["source"]
        assert result["attempt"] == 1
        *earlier, last = result["history"]
        assert earlier == []
        assert (last["kind"], last["id"], last["from"]) == (
            "replay",
            summary["run_id"],
            result["source"],
        )
        assert result["request_digest"] == hashlib.blake2b(sent[5:], digest_size=16).hexdigest()
        assert result["request_schema_id"] == int.from_bytes(sent[1:5], "big")
        direct = onnx_probabilities(recorded.models, "2", recorded.features[rid])
        np.testing.assert_allclose(to_numpy(result["outputs"][0]), direct, atol=1e-6)

    # Nothing live moved: no result, reply or dead letter more, the same committed offsets.
    assert {t: recorded.high_watermarks(t) for t in untouched} == untouched
    assert recorded.committed() == committed
    # The replay's own reader group committed nothing either.
    reader = make_consumer(recorded.kafka, f"tidegate-replay-{summary['run_id']}")
    asked = [TopicPartition(topics.requests, p) for p in range(PARTITIONS)]
    assert all(tp.offset < 0 for tp in reader.committed(asked, timeout=15))
    reader.close()


async def test_a_resumed_replay_finishes_without_redoing_acknowledged_work(
    recorded: Recorded, targets: Callable[..., str], tmp_path: Path
) -> None:
    target = targets()
    scorer = OfflineScorer.from_settings(recorded.models, worker_id="replay:it")
    first = runner(recorded, tmp_path, target, scorer, stop_after=12)
    await first.run()
    saved = ReplayCheckpoint.load(first.path)
    assert saved.status == "interrupted"
    done = saved.summary.replayed
    assert 0 < done < REQUESTS
    produced = sum(recorded.high_watermarks(target))
    assert produced == done, "every result produced before the stop was acknowledged and counted"

    second = resumed(recorded, tmp_path, saved, scorer)
    await second.run()
    final = ReplayCheckpoint.load(first.path)
    assert final.status == "done"
    assert (final.summary.read, final.summary.replayed, final.summary.ok) == (REQUESTS,) * 3
    assert sum(recorded.high_watermarks(target)) == REQUESTS, "no request was replayed twice"
    results = recorded.read(target, REQUESTS)
    assert sorted(r["request_id"] for r in results) == sorted(recorded.features)
    assert {r["history"][-1]["id"] for r in results} == {saved.run_id}
    await scorer.close()


async def test_the_same_range_on_the_same_version_gives_identical_outputs(
    recorded: Recorded, targets: Callable[..., str], tmp_path: Path
) -> None:
    scorer = OfflineScorer.from_settings(recorded.models, worker_id="replay:it")
    outputs = []
    for _ in range(2):
        target = targets()
        await runner(recorded, tmp_path, target, scorer, version="2").run()
        outputs.append({r["request_id"]: r["outputs"] for r in recorded.read(target, REQUESTS)})
    await scorer.close()
    assert outputs[0].keys() == set(recorded.features)
    assert outputs[0] == outputs[1], "a rerun must give byte-identical tensors"


async def test_without_a_version_each_request_runs_on_the_version_that_served_it(
    recorded: Recorded, targets: Callable[..., str], tmp_path: Path
) -> None:
    ids = sorted(recorded.features)[:8]
    served_by = {rid: "2" if i % 2 else "1" for i, rid in enumerate(ids[:6])}
    pool: AsyncConnectionPool[Any] = make_pool(recorded.pg, LifecycleSettings(pool_min_size=1))
    await pool.open(wait=True, timeout=30)
    async with pool.connection() as conn:
        for rid, version in served_by.items():
            await conn.execute(
                "INSERT INTO served_requests (request_id, model, version, status, completed_at)"
                " VALUES (%s, 'fraud', %s, 'OK', %s)",
                (rid, version, datetime.now(UTC)),
            )
    target = targets()
    scorer = OfflineScorer.from_settings(recorded.models, worker_id="replay:it")
    run = runner(
        recorded,
        tmp_path,
        target,
        scorer,
        version=None,
        served=PostgresServed(pool),
        ids=tuple(ids),
    )
    summary = await run.run()
    await scorer.close()
    await pool.close()
    assert (summary.replayed, summary.filtered) == (6, REQUESTS - 8)
    assert summary.skipped == {"no served version": 2}
    results = recorded.read(target, 6)
    assert {r["request_id"]: r["model_version"] for r in results} == served_by
    assert {r["routing_rule"] for r in results} == {"replay:served"}


async def test_dead_letters_replay_with_their_history(
    recorded: Recorded, admin: AdminClient, targets: Callable[..., str], tmp_path: Path
) -> None:
    dlq = targets(create=False)
    create_topics(admin, recorded.registry, dlq, schema=DEAD_LETTER_ENVELOPE)
    encoder = AvroEncoder(recorded.client, load_schema(DEAD_LETTER_ENVELOPE))
    schema_id = encoder.schema_id(f"{dlq}-value")
    origin = source_position(recorded.topics.requests, 0, 3)
    retry = source_position("inference-retry-1", 1, 9)
    history = [step("retry", 1_700_000_000_000, source=retry, reason="UNAVAILABLE")]
    producer = make_producer(recorded.kafka)
    ids = sorted(recorded.features)[:3]
    for rid in ids:
        headers = redelivery_headers(
            None, attempt=2, origin=origin, history=history, first_failed_at_ms=1_700_000_000_000
        )
        envelope = dead_letter(
            source=retry,
            error=error_info(ModelExecutionError("boom")),
            key=rid.encode(),
            value=recorded.values[rid],
            headers=headers,
            timestamp_ms=None,
            failed_at_ms=1_700_000_000_500,
            attempt=2,
            request_id=rid,
            model="fraud",
            origin=origin,
            history=history,
        )
        producer.produce(dlq, key=rid.encode(), value=encoder.encode(envelope, schema_id))
    assert producer.flush(30) == 0
    consumer = make_consumer(recorded.kafka, unique("plan"))
    plan = resolve_times(consumer, dlq, None, None)
    consumer.close()
    target = targets()
    checkpoint = ReplayCheckpoint(
        new_run_id(), plan, target, source="dlq", model="fraud", version="1"
    )
    scorer = OfflineScorer.from_settings(recorded.models, worker_id="replay:it")
    summary = await resumed(recorded, tmp_path, checkpoint, scorer, envelopes=True).run()
    await scorer.close()
    assert (summary.read, summary.replayed, summary.ok) == (3, 3, 3)
    for result in recorded.read(target, 3):
        assert result["source"]["topic"] == dlq, "read from the DLQ"
        assert result["origin"] == origin
        assert result["attempt"] == 2
        assert [s["kind"] for s in result["history"]] == ["retry", "replay"]
        assert result["history"][0]["from"] == retry
        assert result["history"][1]["from"] == result["source"]
        value = recorded.values[result["request_id"]]
        assert result["request_digest"] == hashlib.blake2b(value[5:], digest_size=16).hexdigest()


def test_a_missing_source_topic_is_refused_without_a_traceback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TIDEGATE_TOPICS_REQUESTS", "no-such-topic-for-replay")
    monkeypatch.setenv("TIDEGATE_REPLAY_STATE_DIR", str(tmp_path))
    result = CliRunner().invoke(app, ["replay", "--offsets", "0-10", "--no-progress"])
    assert result.exit_code == 1
    assert "does not exist" in result.output
    assert list(tmp_path.iterdir()) == [], "no checkpoint for a run that never started"


async def test_a_rate_limit_paces_the_run(
    recorded: Recorded, targets: Callable[..., str], tmp_path: Path
) -> None:
    """16/s: the limiter's first second of capacity goes at once, the other 32 take 2 s."""
    scorer = OfflineScorer.from_settings(recorded.models, worker_id="replay:it")
    started = time.monotonic()
    summary = await runner(recorded, tmp_path, targets(), scorer, rate=16).run()
    elapsed = time.monotonic() - started
    await scorer.close()
    assert summary.replayed == REQUESTS
    assert elapsed >= 1.8, f"48 requests at 16/s took only {elapsed:.2f} s"


async def test_a_rate_below_one_a_second_ends(
    recorded: Recorded, targets: Callable[..., str], tmp_path: Path
) -> None:
    """0.5/s on the first 4 requests (one batch): the pace takes fractions of a request, so the
    run ends in about 8 s rather than never."""
    scorer = OfflineScorer.from_settings(recorded.models, worker_id="replay:it")
    started = time.monotonic()
    run = runner(recorded, tmp_path, targets(), scorer, rate=0.5, stop_after=4)
    summary = await asyncio.wait_for(run.run(), timeout=60)
    elapsed = time.monotonic() - started
    await scorer.close()
    assert summary.replayed == 4
    assert elapsed >= 5, f"4 requests at 0.5/s took only {elapsed:.2f} s"
