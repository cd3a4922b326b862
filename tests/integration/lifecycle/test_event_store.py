"""The event store against the real PostgreSQL, in a schema of each test's own (`pg_settings`)."""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool

from tests.support import free_port
from tidegate.core.errors import ConcurrencyConflictError, LifecycleError, LifecycleUnavailableError
from tidegate.core.settings import PostgresSettings
from tidegate.lifecycle.domain import events as ev
from tidegate.lifecycle.domain.state import VersionStatus
from tidegate.lifecycle.eventstore import projections
from tidegate.lifecycle.eventstore.event_store import EventStore

Pool = AsyncConnectionPool[Any]


def registered(version: str) -> ev.ModelRegistered:
    return ev.ModelRegistered(version, "onnx", f"file:///m/{version}", {"model.onnx": version})


async def scalar(pool: Pool, query: str, *params: object) -> Any:
    async with pool.connection() as conn:
        cur = await conn.execute(query, params)
        row = await cur.fetchone()
        assert row is not None
        return row[0]


async def two_validated(store: EventStore, model: str) -> int:
    await store.append(
        model,
        [
            ev.NewEvent(registered("v1"), actor="alice"),
            ev.NewEvent(ev.ArtifactValidated("v1")),
            ev.NewEvent(registered("v2"), actor="alice"),
            ev.NewEvent(ev.ArtifactValidated("v2")),
            ev.NewEvent(registered("v3"), actor="alice"),
            ev.NewEvent(ev.ArtifactValidated("v3")),
        ],
        expected_version=0,
    )
    return 6


async def test_append_read_and_load(pg_pool: Pool) -> None:
    store = EventStore(pg_pool)
    before = await scalar(pg_pool, "SELECT now()")
    corr = uuid.uuid4()
    recorded = await store.append(
        "fraud",
        [
            ev.NewEvent(registered("v1"), actor="alice", correlation_id=corr),
            ev.NewEvent(ev.ArtifactValidated("v1", load_ms=12.5), causation_id=corr),
        ],
        expected_version=0,
    )
    after = await scalar(pg_pool, "SELECT now()")

    assert [e.sequence for e in recorded] == [1, 2]
    assert recorded[0].position < recorded[1].position
    # One time for the whole append, from the database clock.
    assert recorded[0].occurred_at == recorded[1].occurred_at
    assert before - timedelta(milliseconds=1) <= recorded[0].occurred_at <= after
    assert recorded[0].actor == "alice"
    assert recorded[0].correlation_id == corr
    assert recorded[1].causation_id == corr

    assert await store.read("fraud") == recorded
    state = await store.load("fraud")
    assert state.sequence == 2
    v1 = state.version("v1")
    assert v1 is not None
    assert v1.status is VersionStatus.VALIDATED
    assert v1.registered_by == "alice"

    more = await store.append("minilm", [ev.NewEvent(registered("1"))], expected_version=None)
    assert await store.streams() == ["fraud", "minilm"]
    assert await store.version("fraud") == 2
    assert await store.version("unknown") == 0
    assert await store.read("unknown") == []
    assert await store.read_all() == [*recorded, *more]
    assert await store.read_all(after_position=recorded[1].position) == more
    assert await store.read_all(limit=1) == recorded[:1]
    # Every event is queued for publication in the same transaction.
    assert await scalar(pg_pool, "SELECT count(*) FROM outbox WHERE published_at IS NULL") == 3


async def test_expected_version_conflict_stores_nothing(pg_pool: Pool) -> None:
    store = EventStore(pg_pool)
    await store.append("fraud", [ev.NewEvent(registered("v1"))], expected_version=0)

    with pytest.raises(ConcurrencyConflictError) as caught:
        await store.append("fraud", [ev.NewEvent(registered("v2"))], expected_version=0)
    assert (caught.value.expected, caught.value.actual) == (0, 1)
    with pytest.raises(ConcurrencyConflictError):
        await store.append("fraud", [ev.NewEvent(registered("v2"))], expected_version=5)
    with pytest.raises(ConcurrencyConflictError):
        await store.append("new-model", [ev.NewEvent(registered("v2"))], expected_version=3)

    assert [e.sequence for e in await store.read("fraud")] == [1]
    assert await store.streams() == ["fraud"]
    assert await scalar(pg_pool, "SELECT count(*) FROM outbox") == 1
    assert await scalar(pg_pool, "SELECT count(*) FROM routing_versions") == 1

    appended = await store.append("fraud", [ev.NewEvent(registered("v2"))], expected_version=1)
    assert appended[0].sequence == 2
    with pytest.raises(LifecycleError):
        await store.append("fraud", [], expected_version=2)


async def wait_blocked_by(pg: PostgresSettings, holder_pid: int, count: int) -> None:
    """Until `count` backends wait, directly or behind another waiter, for `holder_pid`."""
    query = "SELECT pid, pg_blocking_pids(pid) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
    async with await psycopg.AsyncConnection.connect(pg.conninfo(), autocommit=True) as conn:
        for _ in range(300):
            cur = await conn.execute(query)
            blockers: dict[int, list[int]] = dict(await cur.fetchall())
            behind = {holder_pid}
            while grown := {p for p, by in blockers.items() if behind & set(by)} - behind:
                behind |= grown
            if len(behind) - 1 >= count:
                return
            await asyncio.sleep(0.02)
    raise AssertionError(f"{count} appends never queued behind the held stream lock")


async def test_two_simultaneous_promotes_one_wins(pg_settings: PostgresSettings) -> None:
    # Separate pools: the two promotes and the lock holder each have connections of their own.
    pools: list[Pool] = [
        AsyncConnectionPool(pg_settings.conninfo(), min_size=1, max_size=2, open=False)
        for _ in "ab"
    ]
    for pool in pools:
        await pool.open(wait=True, timeout=30)
    try:
        stores = [EventStore(pool) for pool in pools]
        version = await two_validated(stores[0], "fraud")
        promote_v2 = [ev.NewEvent(ev.Promoted("v2"), actor="alice")]
        promote_v3 = [ev.NewEvent(ev.Promoted("v3"), actor="bob")]

        # Hold the stream's row lock so that both promotes are provably in flight at once,
        # both having decided on the same version; then let them race.
        async with await psycopg.AsyncConnection.connect(pg_settings.conninfo()) as holder:
            await holder.execute("SELECT 1 FROM streams WHERE stream = 'fraud' FOR UPDATE")
            race = asyncio.gather(
                stores[0].append("fraud", promote_v2, expected_version=version),
                stores[1].append("fraud", promote_v3, expected_version=version),
                return_exceptions=True,
            )
            await wait_blocked_by(pg_settings, holder.info.backend_pid, 2)
            await holder.commit()
            outcomes = await race

        conflicts = [o for o in outcomes if isinstance(o, ConcurrencyConflictError)]
        winners = [o for o in outcomes if isinstance(o, list)]
        assert len(conflicts) == 1, outcomes
        assert len(winners) == 1, outcomes
        assert (conflicts[0].expected, conflicts[0].actual) == (version, version + 1)
        won = winners[0][0]
        assert isinstance(won.payload, ev.Promoted)

        stored = await stores[1].read("fraud")
        assert [e.sequence for e in stored] == list(range(1, version + 2))
        assert stored[-1] == won  # the loser left nothing behind
        assert await scalar(pools[0], "SELECT count(*) FROM outbox") == version + 1
        state = await stores[1].load("fraud")
        assert state.primary == won.payload.version
        assert await scalar(pools[0], "SELECT primary_version FROM lifecycle_models") == (
            won.payload.version
        )
    finally:
        for pool in pools:
            await pool.close()


async def test_a_writer_bypassing_the_lock_still_conflicts(pg_pool: Pool) -> None:
    """The UNIQUE (stream, sequence) backstop: a row written behind the stream lock's back."""
    store = EventStore(pg_pool)
    await store.append("fraud", [ev.NewEvent(registered("v1"))], expected_version=0)
    async with pg_pool.connection() as conn:
        await conn.execute(
            "INSERT INTO events (event_id, stream, sequence, type, payload, actor, occurred_at) "
            "VALUES (gen_random_uuid(), 'fraud', 2, 'Retired', '{\"version\": \"v1\"}', 'x', now())"
        )
    with pytest.raises(ConcurrencyConflictError):
        await store.append("fraud", [ev.NewEvent(registered("v2"))], expected_version=None)
    assert await scalar(pg_pool, "SELECT count(*) FROM outbox") == 1


async def test_events_are_append_only(pg_pool: Pool) -> None:
    store = EventStore(pg_pool)
    await store.append("fraud", [ev.NewEvent(registered("v1"))], expected_version=0)
    for statement in ("UPDATE events SET actor = 'mallory'", "DELETE FROM events"):
        async with pg_pool.connection() as conn:
            with pytest.raises(psycopg.errors.RaiseException, match="append-only"):
                await conn.execute(statement)
    assert (await store.read("fraud"))[0].actor == "system"


async def test_time_travel_reads_the_stream_as_it_was(pg_pool: Pool) -> None:
    store = EventStore(pg_pool)
    first = await store.append("fraud", [ev.NewEvent(registered("v1"))], expected_version=0)
    second = await store.append(
        "fraud",
        [ev.NewEvent(ev.ArtifactValidated("v1")), ev.NewEvent(ev.Promoted("v1"))],
        expected_version=1,
    )
    third = await store.append("fraud", [ev.NewEvent(ev.Retired("v1"))], expected_version=3)
    t1, t2, t3 = first[0].occurred_at, second[0].occurred_at, third[0].occurred_at
    # Appends of one stream are strictly ordered in time, even within one millisecond.
    assert t1 < t2 < t3

    assert await store.read("fraud", until=t1 - timedelta(microseconds=1)) == []
    assert await store.read("fraud", until=t1) == first
    assert await store.read("fraud", until=t2 - timedelta(microseconds=1)) == first
    assert await store.read("fraud", until=t2) == [*first, *second]
    assert await store.read("fraud", until=t3 + timedelta(days=1)) == [*first, *second, *third]

    then = await store.load("fraud", until=t2)
    assert then.primary == "v1"
    assert then.sequence == 3
    now = await store.load("fraud")
    assert now.primary is None
    v1 = now.version("v1")
    assert v1 is not None
    assert v1.status is VersionStatus.RETIRED


async def test_an_unreachable_store_is_unavailable() -> None:
    dead = PostgresSettings(port=free_port())
    pool: Pool = AsyncConnectionPool(
        dead.conninfo(), min_size=0, max_size=1, timeout=1.0, open=False
    )
    await pool.open(wait=False)
    try:
        store = EventStore(pool)
        with pytest.raises(LifecycleUnavailableError):
            await store.read("fraud")
        with pytest.raises(LifecycleUnavailableError):
            await store.append("fraud", [ev.NewEvent(registered("v1"))], expected_version=0)
    finally:
        await pool.close()


async def test_a_store_folds_only_the_events_it_has_not_read(pg_pool: Pool) -> None:
    mine, theirs = EventStore(pg_pool), EventStore(pg_pool)
    version = await two_validated(mine, "fraud")
    assert mine.events_read == version  # the append read back its own events once

    # Another writer moves the stream on; this store's next append reads just those events
    # and its own, and its fold still equals one from scratch.
    reports = [ev.NewEvent(ev.VersionLoaded("v1", f"w{i}", 5.0)) for i in range(3)]
    await theirs.append("fraud", reports, expected_version=version)
    await mine.append("fraud", [ev.NewEvent(ev.Retired("v3"))], expected_version=version + 3)
    assert mine.events_read == version + 3 + 1

    fresh = EventStore(pg_pool)
    assert await mine.load("fraud") == await fresh.load("fraud")
    assert mine.events_read == version + 4  # nothing new to read
    assert fresh.events_read == version + 4
    async with pg_pool.connection() as conn:
        live = await projections.snapshot(conn)
        await projections.rebuild(conn)
        assert await projections.snapshot(conn) == live


async def test_an_append_that_fails_after_folding_leaves_the_cache_as_it_was(
    pg_pool: Pool, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = EventStore(pg_pool)
    version = await two_validated(store, "fraud")

    async def broken(*_args: object, **_kwargs: object) -> None:
        raise RuntimeError("projections could not be written")

    # The append has read back and folded its own event when this fails; it rolls back.
    monkeypatch.setattr(projections, "write", broken)
    with pytest.raises(RuntimeError, match="projections"):
        await store.append("fraud", [ev.NewEvent(ev.Retired("v3"))], expected_version=version)
    monkeypatch.undo()

    state = await store.load("fraud")
    assert state.sequence == version
    assert state == await EventStore(pg_pool).load("fraud")
    await store.append("fraud", [ev.NewEvent(ev.Retired("v3"))], expected_version=version)
    retired = (await store.load("fraud")).version("v3")
    assert retired is not None
    assert retired.status is VersionStatus.RETIRED


async def test_a_store_ahead_of_a_restored_database_reads_the_log_afresh(pg_pool: Pool) -> None:
    store = EventStore(pg_pool)
    version = await two_validated(store, "fraud")
    await store.append("fraud", [ev.NewEvent(ev.Retired("v3"))], expected_version=version)
    # What a restore from a backup taken before that last append looks like to the store.
    async with pg_pool.connection() as conn:
        await conn.execute("ALTER TABLE events DISABLE TRIGGER USER")
        lost = "SELECT position FROM events WHERE stream = 'fraud' AND sequence > %s"
        await conn.execute(f"DELETE FROM outbox WHERE position IN ({lost})", (version,))  # noqa: S608
        await conn.execute("DELETE FROM events WHERE sequence > %s", (version,))
        await conn.execute("DELETE FROM version_history WHERE sequence > %s", (version,))
        await conn.execute("UPDATE streams SET version = %s", (version,))
        await conn.execute("ALTER TABLE events ENABLE TRIGGER USER")

    # The store believed the stream was one event further: one conflict, then it reads afresh.
    with pytest.raises(ConcurrencyConflictError):
        await store.append("fraud", [ev.NewEvent(ev.Retired("v2"))], expected_version=version + 1)
    state = await store.load("fraud")
    assert state == await EventStore(pg_pool).load("fraud")
    assert state.sequence == version
    await store.append("fraud", [ev.NewEvent(ev.Retired("v2"))], expected_version=version)
    assert await store.load("fraud") == await EventStore(pg_pool).load("fraud")
