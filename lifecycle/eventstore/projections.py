"""Read models of the lifecycle, folded from the events alone.

Tables (core/migrations/0002_lifecycle.sql): `lifecycle_models` (one row per model: primary,
canary), `routing_versions` (weights, shadow rates, readiness), `routing_rules` (pins and
experiments), `version_history` (one row per event) and `version_lineage` (per version: where it
came from and what happened to it). The store rewrites a model's rows from `fold` inside every
append, so they are as current as the log; `rebuild` recomputes all of them from `events`.
Nothing here reads a clock: the rows depend on the events only, which is what lets a rebuild
reproduce them exactly.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

from psycopg import AsyncConnection, sql
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool

from tidegate.core.db import connection
from tidegate.lifecycle.domain import events as ev
from tidegate.lifecycle.domain.state import ModelState, fold
from tidegate.lifecycle.domain.views import (
    CanaryView,
    HistoryEntry,
    Lineage,
    ModelSummary,
    Routing,
    RuleRoute,
    VersionRoute,
    describe,
    lineage_rows,
)
from tidegate.lifecycle.eventstore.eventrows import SELECT_EVENTS, row_to_event

__all__ = [
    "TABLES",
    "Projections",
    "history",
    "lineage",
    "lineages",
    "models",
    "rebuild",
    "routing",
    "snapshot",
    "write",
]

TABLES: dict[str, tuple[str, ...]] = {
    "lifecycle_models": (
        "model",
        "sequence",
        "primary_version",
        "previous_primary",
        "canary_version",
        "canary_baseline",
        "canary_steps",
        "canary_step",
        "canary_dwell_s",
        "canary_thresholds",
        "canary_started_at",
        "canary_step_at",
        "updated_at",
    ),
    "routing_versions": (
        "model",
        "version",
        "status",
        "weight",
        "effective_weight",
        "shadow_rate",
        "ready",
        "loaded_on",
        "runtime",
        "updated_at",
    ),
    "routing_rules": ("model", "rule_id", "tenant", "version", "weights"),
    "version_history": (
        "model",
        "sequence",
        "position",
        "occurred_at",
        "type",
        "version",
        "actor",
        "summary",
        "payload",
        "correlation_id",
    ),
    "version_lineage": Lineage.COLUMNS,
}
"""Every projection table and its columns; the leading ones up to `_KEYS` form its key."""

_KEYS = {
    "lifecycle_models": 1,
    "routing_versions": 2,
    "routing_rules": 2,
    "version_history": 2,
    "version_lineage": 2,
}


def _model_row(s: ModelState) -> tuple[Any, ...]:
    c = s.canary
    return (
        s.model,
        s.sequence,
        s.primary,
        s.previous_primary,
        c.version if c else None,
        c.baseline if c else None,
        list(c.steps) if c else None,
        c.step if c else None,
        c.dwell_s if c else None,
        Jsonb(dict(c.thresholds)) if c else None,
        c.started_at if c else None,
        c.step_at if c else None,
        s.updated_at,
    )


def _version_rows(s: ModelState) -> list[tuple[Any, ...]]:
    effective = s.effective_weights()
    return [
        (
            s.model,
            v.version,
            v.status.value,
            v.weight,
            effective.get(v.version, 0),
            v.shadow_rate,
            v.ready,
            sorted(v.loaded_on),
            v.runtime,
            v.updated_at,
        )
        for v in s.versions
    ]


def _rule_rows(s: ModelState) -> list[tuple[Any, ...]]:
    return [(s.model, r.rule_id, r.tenant, r.version, Jsonb(dict(r.weights))) for r in s.rules]


def _history_row(e: ev.RecordedEvent) -> tuple[Any, ...]:
    return (
        e.stream,
        e.sequence,
        e.position,
        e.occurred_at,
        e.type,
        getattr(e.payload, "version", None),
        e.actor,
        describe(e.payload),
        Jsonb(ev.payload_to_dict(e.payload)),
        e.correlation_id,
    )


async def _insert(conn: AsyncConnection[Any], table: str, rows: list[tuple[Any, ...]]) -> None:
    if not rows:
        return
    columns = TABLES[table]
    query = sql.SQL("INSERT INTO {} ({}) VALUES ({})").format(
        sql.Identifier(table),
        sql.SQL(", ").join(map(sql.Identifier, columns)),
        sql.SQL(", ").join(sql.Placeholder() * len(columns)),
    )
    async with conn.cursor() as cur:
        await cur.executemany(query, rows)


async def write(
    conn: AsyncConnection[Any],
    model: str,
    events: Sequence[ev.RecordedEvent],
    new: Sequence[ev.RecordedEvent],
    *,
    state: ModelState | None = None,
) -> None:
    """Rewrite `model`'s rows from all its `events` (and their fold, `state`, if the caller has
    it); history rows are added for `new` only (a history row depends on its own event alone).
    Call inside the append's transaction."""
    if state is None:
        state = fold(model, events)
    for table in ("lifecycle_models", "routing_versions", "routing_rules", "version_lineage"):
        await conn.execute(
            sql.SQL("DELETE FROM {} WHERE model = %s").format(sql.Identifier(table)), (model,)
        )
    await _insert(conn, "lifecycle_models", [_model_row(state)])
    await _insert(conn, "routing_versions", _version_rows(state))
    await _insert(conn, "routing_rules", _rule_rows(state))
    sha256 = Lineage.COLUMNS.index("sha256")
    rows = [
        (*row[:sha256], Jsonb(row[sha256]), *row[sha256 + 1 :])
        for row in lineage_rows(model, events)
    ]
    await _insert(conn, "version_lineage", rows)
    await _insert(conn, "version_history", [_history_row(e) for e in new])


async def rebuild(conn: AsyncConnection[Any]) -> int:
    """Empty every projection and recompute it from `events` alone, in one transaction.

    Streams are locked first (in name order, as appends lock them one at a time), so no append
    can slip in between reading the log and writing its projections. Returns the model count.
    """
    async with conn.transaction():
        await conn.execute("SELECT stream FROM streams ORDER BY stream FOR UPDATE")
        await conn.execute(
            sql.SQL("TRUNCATE {}").format(sql.SQL(", ").join(map(sql.Identifier, TABLES)))
        )
        cur = await conn.execute(SELECT_EVENTS + " ORDER BY stream, sequence")
        log = [row_to_event(row) for row in await cur.fetchall()]
        count = 0
        for model, group in itertools.groupby(log, key=lambda e: e.stream):
            stream = list(group)
            await write(conn, model, stream, stream)
            count += 1
        return count


async def snapshot(conn: AsyncConnection[Any]) -> dict[str, list[tuple[Any, ...]]]:
    """Every projection row, table by table in key order: two equal snapshots mean equal
    projections."""
    out: dict[str, list[tuple[Any, ...]]] = {}
    for table, columns in TABLES.items():
        query = sql.SQL("SELECT {} FROM {} ORDER BY {}").format(
            sql.SQL(", ").join(map(sql.Identifier, columns)),
            sql.Identifier(table),
            sql.SQL(", ").join(map(sql.Identifier, columns[: _KEYS[table]])),
        )
        cur = await conn.execute(query)
        out[table] = [tuple(row) for row in await cur.fetchall()]
    return out


_MODEL_QUERY = "SELECT {} FROM lifecycle_models".format(  # noqa: S608 - constant columns
    ", ".join(TABLES["lifecycle_models"])
)
_VERSIONS_QUERY = "SELECT {} FROM routing_versions".format(  # noqa: S608 - constant columns
    ", ".join(TABLES["routing_versions"][1:])
)
_HISTORY_QUERY = "SELECT {} FROM version_history".format(  # noqa: S608 - constant columns
    ", ".join(TABLES["version_history"])
)


def _summary(row: Sequence[Any]) -> ModelSummary:
    model, sequence, primary, previous, c_version, c_base, c_steps, c_step = row[:8]
    c_dwell, c_thresholds, c_started, c_step_at, updated_at = row[8:]
    canary = None
    if c_version is not None:
        canary = CanaryView(
            c_version,
            c_base,
            tuple(c_steps),
            c_step,
            c_dwell,
            dict(c_thresholds),
            c_started,
            c_step_at,
        )
    return ModelSummary(model, int(sequence), primary, previous, canary, updated_at)


async def models(conn: AsyncConnection[Any]) -> list[ModelSummary]:
    cur = await conn.execute(_MODEL_QUERY + " ORDER BY model")
    return [_summary(row) for row in await cur.fetchall()]


async def routing(conn: AsyncConnection[Any], model: str) -> Routing | None:
    """The model's routing table as projected: versions with weights, shadow rates, readiness,
    and the rules (pins and experiments). None for an unknown model."""
    cur = await conn.execute(_MODEL_QUERY + " WHERE model = %s", (model,))
    row = await cur.fetchone()
    if row is None:
        return None
    cur = await conn.execute(_VERSIONS_QUERY + " WHERE model = %s ORDER BY version", (model,))
    versions = tuple(
        VersionRoute(v, st, w, ew, sr, rd, tuple(lo), rt, at)
        for v, st, w, ew, sr, rd, lo, rt, at in await cur.fetchall()
    )
    cur = await conn.execute(
        "SELECT rule_id, tenant, version, weights FROM routing_rules "
        "WHERE model = %s ORDER BY rule_id",
        (model,),
    )
    rules = tuple(
        RuleRoute(rid, tenant, version, {k: int(w) for k, w in weights.items()})
        for rid, tenant, version, weights in await cur.fetchall()
    )
    return Routing(_summary(row), versions, rules)


async def history(
    conn: AsyncConnection[Any], model: str, *, limit: int | None = None
) -> list[HistoryEntry]:
    """The model's events, oldest first (with `limit`, the latest `limit` of them)."""
    cur = await conn.execute(
        _HISTORY_QUERY + " WHERE model = %s ORDER BY sequence DESC LIMIT %s", (model, limit)
    )
    return [HistoryEntry(*row) for row in reversed(await cur.fetchall())]


async def lineages(conn: AsyncConnection[Any], model: str) -> list[Lineage]:
    cur = await conn.execute(
        Lineage.QUERY + " WHERE model = %s ORDER BY registered_at, version", (model,)
    )
    return [Lineage.from_row(row) for row in await cur.fetchall()]


async def lineage(conn: AsyncConnection[Any], model: str, version: str) -> Lineage | None:
    cur = await conn.execute(Lineage.QUERY + " WHERE model = %s AND version = %s", (model, version))
    row = await cur.fetchone()
    return Lineage.from_row(row) if row else None


class Projections:
    """The query functions over a pool, each on a connection of its own."""

    def __init__(self, pool: AsyncConnectionPool[Any]) -> None:
        self.pool = pool

    async def models(self) -> list[ModelSummary]:
        async with connection(self.pool) as conn:
            return await models(conn)

    async def routing(self, model: str) -> Routing | None:
        async with connection(self.pool) as conn:
            return await routing(conn, model)

    async def history(self, model: str, *, limit: int | None = None) -> list[HistoryEntry]:
        async with connection(self.pool) as conn:
            return await history(conn, model, limit=limit)

    async def lineage(self, model: str, version: str) -> Lineage | None:
        async with connection(self.pool) as conn:
            return await lineage(conn, model, version)

    async def lineages(self, model: str) -> list[Lineage]:
        async with connection(self.pool) as conn:
            return await lineages(conn, model)

    async def rebuild(self) -> int:
        async with connection(self.pool) as conn:
            return await rebuild(conn)

    async def snapshot(self) -> dict[str, list[tuple[Any, ...]]]:
        async with connection(self.pool) as conn:
            return await snapshot(conn)
