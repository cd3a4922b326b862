"""What each model needs of a worker, read from the event log and the indexed results
(`demands`): the measured memory of its wanted versions (their latest `VersionLoaded.rss_bytes`)
and its request rate over a recent window. The input of `tidegate pools plan`."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from psycopg_pool import AsyncConnectionPool

from tidegate.core.db import connection
from tidegate.lifecycle.domain import events as ev
from tidegate.lifecycle.domain.placement import ModelDemand
from tidegate.lifecycle.domain.state import fold
from tidegate.lifecycle.eventstore.event_store import EventStore

__all__ = ["demands"]

_RATES = """
SELECT model, count(*) AS requests
FROM served_requests
WHERE completed_at >= now() - %(window)s::interval
GROUP BY model
"""


async def demands(
    events: EventStore, pool: AsyncConnectionPool[Any], *, window: timedelta
) -> list[ModelDemand]:
    """Every model with a version to keep loaded. A version never measured is given the average
    size of the measured ones (and listed in `estimated`); with none measured at all, 0."""
    measured: dict[str, dict[str, int]] = {}
    wanted: dict[str, frozenset[str]] = {}
    for stream in sorted(await events.streams()):
        history = await events.read(stream)
        state = fold(stream, history)
        if not state.wanted():
            continue
        wanted[stream] = state.wanted()
        sizes = measured[stream] = {}
        for event in history:
            payload = event.payload
            if isinstance(payload, ev.VersionLoaded) and payload.rss_bytes is not None:
                sizes[payload.version] = payload.rss_bytes  # the latest measurement wins
    known = [size for sizes in measured.values() for size in sizes.values()]
    average = sum(known) // len(known) if known else 0
    async with connection(pool) as conn:
        cur = await conn.execute(_RATES, {"window": window})
        counted = {str(model): int(requests) for model, requests in await cur.fetchall()}
    seconds = max(window.total_seconds(), 1.0)
    out = []
    for model, versions in wanted.items():
        sizes = measured[model]
        out.append(
            ModelDemand(
                model,
                {v: sizes.get(v, average) for v in sorted(versions)},
                counted.get(model, 0) / seconds,
                frozenset(v for v in versions if v not in sizes),
            )
        )
    return out
