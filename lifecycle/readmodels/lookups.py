"""Read-side lookups of the operator commands that join the event log with the indexed results:
`served` (a request's version, rule, worker, the routing table then and the version's lineage)
and the live metrics an operator's rollback records."""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any

from psycopg_pool import AsyncConnectionPool

from tidegate.core.db import connection
from tidegate.core.errors import ModelNotFoundError
from tidegate.lifecycle.domain.render import iso, state_view, table_view, version_lineage
from tidegate.lifecycle.domain.routing import RoutingTable
from tidegate.lifecycle.domain.state import fold
from tidegate.lifecycle.domain.windows import NOT_ERRORS
from tidegate.lifecycle.eventstore.event_store import EventStore
from tidegate.lifecycle.readmodels import lineage

__all__ = ["live_metrics", "served_view"]

_STATS = """
SELECT version,
       count(*) AS requests,
       count(*) FILTER (WHERE NOT (status = ANY(%(ok)s))) AS errors,
       percentile_cont(0.99) WITHIN GROUP (ORDER BY total_ms) AS p99_ms
FROM served_requests
WHERE model = %(model)s AND version = ANY(%(versions)s)
  AND (%(since)s::timestamptz IS NULL OR completed_at >= %(since)s::timestamptz)
GROUP BY version
"""


async def live_metrics(
    pool: AsyncConnectionPool[Any],
    model: str,
    candidate: str,
    baseline: str,
    since: datetime | None,
) -> dict[str, float]:
    """The two versions' requests, errors, error rate and p99 since `since`, named like the
    controller's automatic rollbacks name them, so both kinds of `RolledBack` read alike. Empty
    when the indexer has seen no results of either."""
    params = {
        "model": model,
        "versions": [candidate, baseline],
        "since": since,
        "ok": sorted(NOT_ERRORS),
    }
    async with connection(pool) as conn:
        cur = await conn.execute(_STATS, params)
        rows = await cur.fetchall()
    metrics: dict[str, float] = {}
    for version, requests, errors, p99 in rows:
        side = "candidate" if version == candidate else "baseline"
        metrics[f"{side}_requests"] = float(requests)
        metrics[f"{side}_errors"] = float(errors)
        metrics[f"{side}_error_rate"] = errors / requests if requests else 0.0
        if p99 is not None:
            metrics[f"{side}_p99_ms"] = float(p99)
    return metrics


_TABLE_SEQUENCE = re.compile(r"@(\d+)$")


async def served_view(
    pool: AsyncConnectionPool[Any], events: EventStore, request_id: str
) -> dict[str, Any]:
    """Which version served the request, when, on which worker and under which rule; the
    model's routing table as it stood when the request completed; the version's lineage."""
    record = await lineage.served(pool, request_id)
    if record is None:
        raise ModelNotFoundError(
            f"no served request {request_id!r} is indexed "
            "(unknown, not indexed yet, or older than the lineage retention)"
        )
    history = await events.read(record.model)
    # A split names the table that decided (`split@41`): fold exactly up to it, as the worker
    # had. Other rules fall back to the completion time, which worker clock skew can blur.
    decided = _TABLE_SEQUENCE.search(record.routing_rule or "")
    if decided is not None:
        upto = int(decided.group(1))
        then = fold(record.model, [e for e in history if e.sequence <= upto])
    else:
        then = fold(record.model, [e for e in history if e.occurred_at <= record.completed_at])
    out: dict[str, Any] = {
        "request": record.to_dict(),
        "state_at": iso(record.completed_at),
        "state": state_view(then),
        "table": table_view(RoutingTable.from_state(then)),
        "lineage": version_lineage(history, record.version) if record.version else None,
    }
    return out
