"""The backtest promotion gate against the real PostgreSQL: `promote` is refused without a
recorded backtest, and allowed once a passing one is recorded (lifecycle.readmodels.backtests,
core/migrations/0006_backtests.sql).

The model's history is appended straight to the event store and the shadow comparisons a
controller's indexer would write are inserted directly, so the shadow gate passes and only the
backtest gate decides.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from psycopg_pool import AsyncConnectionPool

from tests.unit.lifecycle_events import registered_and_validated
from tidegate.core.db import connection
from tidegate.core.errors import PromotionGateError
from tidegate.dlq.backtest_report import BacktestRow, build_report
from tidegate.lifecycle.domain import events as ev
from tidegate.lifecycle.eventstore.event_store import EventStore
from tidegate.lifecycle.lifecycle_settings import LifecycleSettings
from tidegate.lifecycle.operations.commands import LifecycleCommands
from tidegate.lifecycle.readmodels.backtests import latest_backtest, record_backtest
from tidegate.models.model_settings import ModelSettings
from tidegate.models.store import LocalArtifactStore

Pool = AsyncConnectionPool[Any]


async def _live_model(pool: Pool) -> None:
    """fraud 1 primary, 2 warm and shadowed, with ten agreeing shadow comparisons."""
    payloads: list[ev.Payload] = [
        *registered_and_validated("1", "2"),
        ev.Promoted("1"),
        ev.VersionLoaded("1", "w1"),
        ev.VersionLoaded("2", "w1"),
        ev.ShadowStarted("2"),
    ]
    new = [ev.NewEvent(p, actor="test") for p in payloads]
    await EventStore(pool).append("fraud", new, expected_version=0)
    async with connection(pool) as conn:
        for i in range(10):
            await conn.execute(
                "INSERT INTO shadow_comparisons (model, candidate_version, request_id,"
                " primary_version, kind, rows, agree_rows, compared_at)"
                " VALUES ('fraud', '2', %s, '1', 'classifier', 1, 1, now())",
                (f"s{i}",),
            )


def _rows(flipped: int) -> list[BacktestRow]:
    """Twenty two-row requests served by 1; the candidate flips the class of `flipped` rows."""
    served = np.tile(np.array([[0.9, 0.1], [0.2, 0.8]], dtype=np.float32), (20, 1))
    cand = served.copy()
    cand[:flipped] = cand[:flipped, ::-1]
    return [
        BacktestRow(
            f"r{i}",
            "1",
            {"p": served[2 * i : 2 * i + 2]},
            3.0,
            {"p": cand[2 * i : 2 * i + 2]},
            2.0,
            None,
        )
        for i in range(20)
    ]


async def test_promotion_is_refused_without_a_backtest_and_allowed_after_a_passing_one(
    pg_pool: Pool, tmp_path: Path
) -> None:
    await _live_model(pg_pool)
    settings = LifecycleSettings(
        require_backtest=True, promote_min_samples=10, backtest_min_rows=20
    )
    store = LocalArtifactStore(ModelSettings(store_dir=tmp_path / "store"))
    commands = LifecycleCommands(EventStore(pg_pool), pg_pool, store, settings)
    window = (datetime.now().astimezone() - timedelta(hours=1), datetime.now().astimezone())

    with pytest.raises(PromotionGateError, match="no backtest of the candidate is recorded"):
        await commands.promote("fraud", "2", actor="alice")

    failing = build_report("fraud", "2", _rows(flipped=10), task="classifier")
    assert failing.agreement == pytest.approx(0.75)
    await record_backtest(pg_pool, failing, actor="alice", window=window)
    with pytest.raises(PromotionGateError, match=r"backtest agreement 0\.7500 is below"):
        await commands.promote("fraud", "2", actor="alice")

    passing = build_report("fraud", "2", _rows(flipped=0), task="classifier")
    recorded = await record_backtest(pg_pool, passing, actor="bob", window=window)
    latest = await latest_backtest(pg_pool, "fraud", "2")
    assert latest == recorded
    assert (latest.baseline_versions, latest.rows_compared, latest.agreement) == (["1"], 40, 1.0)
    async with connection(pg_pool) as conn:
        cur = await conn.execute("SELECT report FROM backtests WHERE id = %s", (recorded.id,))
        stored = await cur.fetchone()
    assert stored is not None
    assert stored[0] == passing.to_json(), "the whole report is kept beside the gate's numbers"

    result = await commands.promote("fraud", "2", actor="alice")
    assert result.backtest is not None
    assert result.backtest.passed
    assert result.to_dict()["backtest"]["metric"] == "agreement"
    promoted = result.events[0].payload
    assert promoted == ev.Promoted("2", forced=False, previous="1", agreement=1.0)


async def test_a_stale_backtest_fails_the_gate_and_force_promotes_past_it(
    pg_pool: Pool, tmp_path: Path
) -> None:
    await _live_model(pg_pool)
    settings = LifecycleSettings(
        require_backtest=True, promote_min_samples=10, backtest_min_rows=20, backtest_max_age_h=1
    )
    store = LocalArtifactStore(ModelSettings(store_dir=tmp_path / "store"))
    commands = LifecycleCommands(EventStore(pg_pool), pg_pool, store, settings)
    now = datetime.now().astimezone()
    report = build_report("fraud", "2", _rows(flipped=0), task="classifier")
    recorded = await record_backtest(pg_pool, report, actor="bob", window=(now, now))
    async with connection(pg_pool) as conn:
        await conn.execute(
            "UPDATE backtests SET created_at = now() - interval '2 hours' WHERE id = %s",
            (recorded.id,),
        )
    with pytest.raises(PromotionGateError, match="h old, older than 1 h"):
        await commands.promote("fraud", "2", actor="alice")
    forced = await commands.promote("fraud", "2", actor="alice", force=True)
    assert forced.events[0].payload == ev.Promoted("2", forced=True, previous="1", agreement=1.0)
