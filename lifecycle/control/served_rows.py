"""The `served_requests` rows of one indexer batch, and the SQL that stores them.

A request id is indexed once, but more than one result may arrive for it:

* a redelivery of the same record (a crash before the offsets were committed): a duplicate;
* a later delivery of the same request, a retry, redrive or replay (the same `request_digest`,
  a longer `history`): it replaces the row when it ranks higher, so `tidegate served` shows the
  request's latest outcome and how it got there;
* a request id reused for other content (both digests known, and different): a conflict. The
  row keeps the first result; the other is recorded in `request_id_conflicts`, once per
  (request id, digest), and reported once (a WARNING, and `outcome="conflict"`).

The rank of a result is `(status = 'OK', len(history))`, compared as a tuple: an OK result beats
a failed one, and among equals the later delivery (longer history) wins; a tie keeps the row.
So a redrive that succeeds after an ERROR replaces it, a redrive that fails again replaces the
older failure (showing the attempt), an OK result is never replaced by a failure, and the final
row does not depend on the order the results arrive in. A NULL digest (a result from a worker
that did not compute one) is compatible with any.

PostgreSQL refuses to touch one row twice in one INSERT ... ON CONFLICT DO UPDATE, so the batch
keeps the best result per (request id, digest) and writes them in rounds: round k holds each
request id's k-th digest. A batch without reused ids is one round, one statement. The live
canary windows are fed only from rows the INSERT created (`xmax = 0`), never from replacements:
each request counts once there, as its first result.
"""

from __future__ import annotations

import json
import logging
import operator
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import psycopg

__all__ = [
    "ServedBatch",
    "StoredServed",
    "rank",
    "served_row",
    "store_served",
    "warn_conflicts",
]

_log = logging.getLogger(__name__)

Row = dict[str, Any]

_COLUMNS = (
    ("request_id", "text"),
    ("model", "text"),
    ("version", "text"),
    ("status", "text"),
    ("worker_id", "text"),
    ("routing_rule", "text"),
    ("tenant", "text"),
    ("routing_key", "text"),
    ("completed_at", "timestamptz"),
    ("total_ms", "float8"),
    ("error_code", "text"),
    ("source_topic", "text"),
    ("source_partition", "int"),
    ("source_offset", "bigint"),
    ("request_schema_id", "int"),
    ("request_digest", "text"),
    ("attempt", "int"),
    ("origin_topic", "text"),
    ("origin_partition", "int"),
    ("origin_offset", "bigint"),
    ("history", "jsonb"),  # last: `_plain` takes the others
)
_NAMES = [name for name, _ in _COLUMNS]
_KEPT = {"request_id", "request_digest"}
# Every column but `history` (JSON text in the COPY), as they are: one C call per row.
_plain = operator.itemgetter(*_NAMES[:-1])

# Each batch's rows reach PostgreSQL through COPY into a temporary table, then one upsert per
# round: COPY formats rows in psycopg's C code, where binding one array per column ran every
# value through psycopg's Python array dumper (docs/benchmarks.md, "The lineage indexer's
# COPY"). The table lives as long as the connection and is emptied at each commit.
_STAGE = f"""
CREATE TEMP TABLE IF NOT EXISTS served_stage (
    batch_round int,
    {", ".join(f"{n} {kind}" for n, kind in _COLUMNS)}
) ON COMMIT DELETE ROWS
"""

_COPY = f"COPY served_stage (batch_round, {', '.join(_NAMES)}) FROM STDIN"

_UPSERT = f"""
INSERT INTO served_requests AS s ({", ".join(_NAMES)})
SELECT {", ".join(f"u.{n}" for n in _NAMES)}
FROM served_stage AS u
WHERE u.batch_round = %s
ON CONFLICT (request_id) DO UPDATE SET
    {", ".join(f"{n} = EXCLUDED.{n}" for n in _NAMES if n not in _KEPT)},
    request_digest = coalesce(EXCLUDED.request_digest, s.request_digest)
WHERE (s.request_digest IS NULL OR EXCLUDED.request_digest IS NULL
       OR s.request_digest = EXCLUDED.request_digest)
  AND (EXCLUDED.status = 'OK', jsonb_array_length(EXCLUDED.history))
      > (s.status = 'OK', jsonb_array_length(s.history))
RETURNING request_id, (xmax = 0) AS inserted
"""  # noqa: S608 - built from the constant column list above

_CONFLICT_COLUMNS = (
    ("request_id", "text"),
    ("request_digest", "text"),
    ("model", "text"),
    ("version", "text"),
    ("status", "text"),
    ("worker_id", "text"),
    ("source_topic", "text"),
    ("source_partition", "int"),
    ("source_offset", "bigint"),
    ("completed_at", "timestamptz"),
)

_RECORD_CONFLICTS = f"""
INSERT INTO request_id_conflicts (request_id, digest, first_digest, model, version, status,
                                  worker_id, source_topic, source_partition, source_offset,
                                  completed_at)
SELECT n.request_id, n.request_digest, s.request_digest, n.model, n.version, n.status,
       n.worker_id, n.source_topic, n.source_partition, n.source_offset, n.completed_at
FROM unnest({", ".join(f"%s::{kind}[]" for _, kind in _CONFLICT_COLUMNS)})
     AS n({", ".join(name for name, _ in _CONFLICT_COLUMNS)})
JOIN served_requests s ON s.request_id = n.request_id
WHERE s.request_digest IS NOT NULL AND s.request_digest <> n.request_digest
ON CONFLICT (request_id, digest) DO NOTHING
RETURNING request_id, digest, first_digest, model, version, source_topic, source_partition,
          source_offset
"""  # noqa: S608 - built from the constant column list above


def served_row(result: Mapping[str, Any]) -> Row:
    """The served_requests columns of a decoded InferenceResult (`history` as a list)."""
    error = result.get("error")
    source = result.get("source") or {}
    origin = result.get("origin") or {}
    return {
        "request_id": result["request_id"],
        "model": result["model"],
        "version": result.get("model_version"),
        "status": result["status"],
        "worker_id": result.get("worker_id") or "",
        "routing_rule": result.get("routing_rule"),
        "tenant": result.get("tenant") or "default",
        "routing_key": result.get("routing_key"),
        "completed_at": result["completed_at"],
        "total_ms": float((result.get("timings") or {}).get("total_ms") or 0.0),
        "error_code": error.get("code") if error else None,
        "source_topic": source.get("topic"),
        "source_partition": source.get("partition"),
        "source_offset": source.get("offset"),
        "request_schema_id": result.get("request_schema_id"),
        "request_digest": result.get("request_digest"),
        "attempt": int(result.get("attempt") or 1),
        "origin_topic": origin.get("topic"),
        "origin_partition": origin.get("partition"),
        "origin_offset": origin.get("offset"),
        "history": [_step(item) for item in result.get("history") or ()],
    }


def _step(item: Mapping[str, Any]) -> dict[str, Any]:
    """A Redelivery record as JSON: `at` in ISO 8601, `from` as a position object or null."""
    at = item["at"]
    source = item.get("from")
    return {
        "kind": item["kind"],
        "at": at.isoformat() if isinstance(at, datetime) else at,
        "from": dict(source) if source else None,
        "id": item.get("id"),
        "reason": item.get("reason"),
    }


def rank(row: Mapping[str, Any]) -> tuple[bool, int]:
    """Which of two results of one request the row shows: the higher; on a tie, the first."""
    return (row["status"] == "OK", len(row["history"]))


class ServedBatch:
    """One batch's results, the best per (request id, digest), in order of first appearance."""

    def __init__(self) -> None:
        self._by_id: dict[str, dict[str | None, Row]] = {}
        self.results = 0
        """Results added, duplicates included: what the outcome counters add up to."""

    def add(self, row: Row) -> None:
        self.results += 1
        digests = self._by_id.setdefault(row["request_id"], {})
        best = digests.get(row["request_digest"])
        if best is None or rank(row) > rank(best):
            digests[row["request_digest"]] = row

    def __bool__(self) -> bool:
        return bool(self._by_id)

    def rounds(self) -> list[list[Row]]:
        """Round k: each request id's k-th digest; no request id twice in a round."""
        out: list[list[Row]] = []
        for digests in self._by_id.values():
            for k, row in enumerate(digests.values()):
                if k == len(out):
                    out.append([])
                out[k].append(row)
        return out


@dataclass(slots=True)
class StoredServed:
    """What storing a batch did."""

    inserted: list[Row] = field(default_factory=list)
    """The rows created: the only ones the live windows count."""
    replaced: int = 0
    conflicts: list[dict[str, Any]] = field(default_factory=list)
    """The conflicts recorded for the first time."""

    def duplicates(self, results: int) -> int:
        return max(0, results - len(self.inserted) - self.replaced - len(self.conflicts))


async def store_served(conn: psycopg.AsyncConnection[Any], batch: ServedBatch) -> StoredServed:
    """Upsert the batch's rows and record new conflicts, inside the caller's transaction."""
    if conn.info.transaction_status != psycopg.pq.TransactionStatus.INTRANS:
        # The staged rows are emptied at each commit: outside a transaction, every statement
        # would commit alone, and the upsert would find nothing staged.
        raise RuntimeError("store_served needs an open transaction")
    stored = StoredServed()
    # Only a result that neither created nor replaced its row can conflict with it: in a batch
    # of new requests (the usual one) there is nothing to check.
    candidates: list[Row] = []
    rounds = batch.rounds()
    await conn.execute(_STAGE)
    async with conn.cursor().copy(_COPY) as copy:
        for k, rows in enumerate(rounds):
            for row in rows:
                await copy.write_row((k, *_plain(row), json.dumps(row["history"])))
    for k, rows in enumerate(rounds):
        by_id = {row["request_id"]: row for row in rows}
        cur = await conn.execute(_UPSERT, (k,))
        for request_id, inserted in await cur.fetchall():
            row = by_id.pop(request_id)
            if inserted:
                stored.inserted.append(row)
            else:
                stored.replaced += 1
        candidates.extend(row for row in by_id.values() if row["request_digest"] is not None)
    if candidates:
        names = [name for name, _ in _CONFLICT_COLUMNS]
        cur = await conn.execute(_RECORD_CONFLICTS, _arrays(candidates, names))
        returned = [c.name for c in cur.description or ()]
        stored.conflicts = [dict(zip(returned, row, strict=True)) for row in await cur.fetchall()]
    return stored


def warn_conflicts(conflicts: Iterable[Mapping[str, Any]]) -> None:
    """One WARNING per conflict recorded (after the commit, so a retried batch warns once)."""
    for c in conflicts:
        _log.warning(
            "request id %r reused with other content: served digest %s, new digest %s "
            "(%s %s, read from %s[%s]@%s); the served row is kept and the conflict recorded",
            c["request_id"], c["first_digest"], c["digest"], c["model"], c["version"],
            c["source_topic"], c["source_partition"], c["source_offset"],
        )  # fmt: skip


def _arrays(rows: Iterable[Row], names: Iterable[str]) -> list[list[Any]]:
    rows = list(rows)
    return [[r[n] for r in rows] for n in names]
