"""What was served for a request: the version (for `replay` against the serving version) and the
result itself (for `backtest`, which compares the candidate with what callers got).

Versions come from PostgreSQL's `served_requests`, the index `tidegate served` reads (the
controller's indexer fills it from the results topic): one query per batch. Served outputs are
not indexed, so a backtest reads them from the results topic itself, over the requests' time
range widened by a margin, and matches them by request id; the first result of an id is the one
its caller got.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any, cast

from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool

from tidegate.core.db import connection
from tidegate.core.kafka import make_consumer
from tidegate.core.settings import KafkaSettings
from tidegate.dlq.ranges import resolve_times
from tidegate.dlq.replay_reader import Decoder, RangeReader
from tidegate.schemas.records import ResultRecord

__all__ = ["PostgresServed", "served_results"]

Pool = AsyncConnectionPool[Any]


class PostgresServed:
    """The version that served each request id, from the lineage index."""

    def __init__(self, pool: Pool) -> None:
        self._pool = pool

    async def versions(self, request_ids: Sequence[str]) -> dict[str, str]:
        """Request id to version, for the ids a version served (not NOT_FOUND ones, nor ids the
        indexer has not seen)."""
        if not request_ids:
            return {}
        async with connection(self._pool) as conn:
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(
                "SELECT request_id, version FROM served_requests"
                " WHERE request_id = ANY(%s) AND version IS NOT NULL",
                (list(request_ids),),
            )
            rows = await cur.fetchall()
        return {str(r["request_id"]): str(r["version"]) for r in rows}


def served_results(
    kafka: KafkaSettings,
    topic: str,
    decoder: Decoder,
    *,
    request_ids: Collection[str],
    model: str,
    from_ms: int | None,
    to_ms: int | None,
    group_id: str,
    stall_timeout_s: float = 15.0,
) -> dict[str, ResultRecord]:
    """The first result of each of `request_ids` (of `model`) in `topic` within the time range.
    Blocking: call it in a thread."""
    wanted = set(request_ids)
    if not wanted:
        return {}
    lookup = make_consumer(kafka, group_id)
    try:
        plan = resolve_times(lookup, topic, from_ms, to_ms)
    finally:
        lookup.close()

    def select(record: Any) -> bool:
        result = record.request
        return result is not None and result["model"] == model and result["request_id"] in wanted

    reader = RangeReader(
        kafka,
        plan,
        {},
        requests=decoder,
        group_id=group_id,
        batch_size=1000,
        select=select,
        stall_timeout_s=stall_timeout_s,
    )
    found: dict[str, ResultRecord] = {}
    firsts: dict[str, tuple[int, int]] = {}
    try:
        while not reader.done:
            for chunk in reader.poll():
                for record in chunk.records:
                    # This reader decodes the results topic: its records are results.
                    result = cast(ResultRecord | None, record.request)
                    if result is None:
                        continue
                    rid = str(result["request_id"])
                    at = (record.timestamp_ms or 0, record.position["offset"])
                    if rid not in firsts or at < firsts[rid]:
                        firsts[rid], found[rid] = at, result
    finally:
        reader.close()
    return found
