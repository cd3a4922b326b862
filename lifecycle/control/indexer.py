"""The lineage indexer: results and shadow comparisons from Kafka into PostgreSQL.

One consumer, in its own group, reads the results topic (one `served_requests` row per request:
which version served it, when, where and under which rule) and the shadow topic (one
`shadow_comparisons` row per candidate and request). Results are gathered for up to `gather_s`
from the first one (or until `batch_size`), then the batch is decoded, written in one
transaction, and only after that commit are the Kafka offsets committed. Lineage is not on any
caller's path, so its cost is paid per gathered batch rather than per result: the broker holds
each fetch until it has `_FETCH_MIN_BYTES` or `gather_s` has passed, and a busy pipeline costs
the controller a few fetches, transactions and commits a second, whatever its rate. A crash in
between redelivers the batch, which the primary keys absorb: at-least-once delivery plus idempotent
writes give exactly one row per request. A later delivery of the same request (a retry, redrive
or replay) may replace its row, and a request id reused for other content is recorded as a
conflict: the rules are in `served_rows`.

The live canary windows are fed from the rows the INSERT actually created (its RETURNING), so a
redelivered or redriven result is not counted twice there either.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from datetime import datetime
from typing import Any

from confluent_kafka import Consumer, KafkaException, Message, TopicPartition
from confluent_kafka.schema_registry import SchemaRegistryClient
from prometheus_client import Counter
from psycopg import Error as PsycopgError
from psycopg_pool import AsyncConnectionPool

from tidegate.core.aio import cancel_and_wait
from tidegate.core.db import connection
from tidegate.core.errors import LifecycleUnavailableError, SerializationError, TidegateError
from tidegate.core.kafka import make_consumer
from tidegate.core.settings import KafkaSettings, TopicSettings
from tidegate.lifecycle.control.served_rows import (
    ServedBatch,
    StoredServed,
    served_row,
    store_served,
    warn_conflicts,
)
from tidegate.lifecycle.domain.windows import LiveWindows, ResultSample
from tidegate.lifecycle.eventstore.event_codec import ShadowComparisonCodec
from tidegate.schemas.catalog import INFERENCE_RESULT, load_schema
from tidegate.schemas.codec import AvroDecoder

__all__ = ["DEFAULT_GROUP_ID", "Indexer", "seed_windows"]

_log = logging.getLogger(__name__)

DEFAULT_GROUP_ID = "tidegate-lineage-indexer"

_STOP_S = 10.0
# The broker answers a fetch once it has this much, or after `fetch.wait.max.ms`: at any rate the
# indexer sends a few fetches a second instead of one per result (a quarter of a core at 250/s).
_FETCH_MIN_BYTES = 1 << 20

_RECORDS = Counter(
    "tidegate_indexer_records_total",
    "Records the lineage indexer read, by topic kind and outcome.",
    ["kind", "outcome"],
)

_INSERT_SHADOW = """
INSERT INTO shadow_comparisons (model, candidate_version, request_id, primary_version, kind, rows,
                                agree_rows, abs_diff_sum, value_count, cosine_sum, primary_ms,
                                candidate_ms, candidate_error, worker_id, compared_at)
SELECT * FROM unnest(%s::text[], %s::text[], %s::text[], %s::text[], %s::text[], %s::int[],
                     %s::bigint[], %s::float8[], %s::bigint[], %s::float8[], %s::float8[],
                     %s::float8[], %s::text[], %s::text[], %s::timestamptz[])
ON CONFLICT (model, candidate_version, request_id) DO NOTHING
"""

_SHADOW_COLUMNS = (
    "model",
    "candidate_version",
    "request_id",
    "primary_version",
    "kind",
    "rows",
    "agree_rows",
    "abs_diff_sum",
    "values",
    "cosine_sum",
    "primary_ms",
    "candidate_ms",
    "candidate_error",
    "worker_id",
    "compared_at",
)


def _columns(rows: list[dict[str, Any]], names: tuple[str, ...]) -> list[list[Any]]:
    return [[row[name] for row in rows] for name in names]


class Indexer:
    """Start with `start()` (after `seed_windows`, if windows are fed), stop with `stop()`,
    which finishes the batch in hand, commits it and closes the consumer."""

    def __init__(
        self,
        pool: AsyncConnectionPool[Any],
        kafka: KafkaSettings,
        topics: TopicSettings,
        registry: SchemaRegistryClient,
        *,
        group_id: str = DEFAULT_GROUP_ID,
        windows: LiveWindows | None = None,
        batch_size: int = 2000,
        poll_s: float = 0.5,
        gather_s: float = 0.5,
        retry_s: float = 1.0,
        consumer_factory: Callable[[], Consumer] | None = None,
    ) -> None:
        self._pool = pool
        self._topics = topics
        self._windows = windows
        self._batch_size = batch_size
        self._poll_s = poll_s
        self._gather_s = gather_s
        self._retry_s = retry_s
        fetch = {
            "fetch.min.bytes": _FETCH_MIN_BYTES,
            "fetch.wait.max.ms": max(1, round(gather_s * 1000)),
        }
        self._make_consumer = consumer_factory or (lambda: make_consumer(kafka, group_id, fetch))
        self._results = AvroDecoder(registry, load_schema(INFERENCE_RESULT))
        self._shadows = ShadowComparisonCodec(registry, topics)
        self._stopping = asyncio.Event()
        self.indexed = 0
        """Records stored (or found already stored) and committed, since start."""
        self.retries = 0
        """Batches rewound to be read again because PostgreSQL or the registry failed."""
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        consumer = self._make_consumer()
        consumer.subscribe([self._topics.results, self._topics.shadow])
        self._stopping.clear()
        self._task = asyncio.get_running_loop().create_task(
            self._run(consumer), name="lineage-indexer"
        )

    async def stop(self) -> None:
        """Finish the batch in hand and close the consumer (leaving the group at once); a batch
        stuck on PostgreSQL for `_STOP_S` is cancelled, to be read again by the next instance."""
        self._stopping.set()
        if self._task is not None:
            done, _ = await asyncio.wait({self._task}, timeout=_STOP_S)
            if not done:
                _log.warning("the indexer did not stop within %.0f s; cancelling it", _STOP_S)
            await cancel_and_wait([self._task])
            self._task = None

    async def wait(self) -> None:
        """Until the indexer stops; re-raises what made it fail."""
        if self._task is not None:
            await self._task

    async def _run(self, consumer: Consumer) -> None:
        try:
            while not self._stopping.is_set():
                messages = await asyncio.to_thread(self._gather, consumer)
                if messages and not await self.index(consumer, messages):
                    await asyncio.sleep(self._retry_s)
        finally:
            await asyncio.to_thread(consumer.close)

    def _gather(self, consumer: Consumer) -> list[Message]:
        """The first result within `poll_s`, then whatever else comes within `gather_s`."""
        first = consumer.poll(self._poll_s)
        if first is None:
            return []
        if self._batch_size <= 1 or self._gather_s <= 0:
            return [first]
        rest = consumer.consume(num_messages=self._batch_size - 1, timeout=self._gather_s)
        return [first, *rest]

    async def index(self, consumer: Consumer, messages: list[Message]) -> bool:
        """Store one batch and commit its offsets; False (and the batch rewound) on failure."""
        served = ServedBatch()
        shadows: dict[tuple[str, str, str], dict[str, Any]] = {}
        ends: dict[tuple[str, int], int] = {}
        starts: dict[tuple[str, int], int] = {}
        valid: list[tuple[Message, str, int, int]] = []
        for msg in messages:
            topic, partition, offset = msg.topic(), msg.partition(), msg.offset()
            if msg.error() is not None or topic is None or partition is None or offset is None:
                _log.warning("indexer consumer: %s", msg.error())
                continue
            starts.setdefault((topic, partition), offset)
            ends[(topic, partition)] = offset + 1
            valid.append((msg, topic, partition, offset))
        # Offsets first, decoding second: a rewind must cover every partition in the batch.
        for msg, topic, partition, offset in valid:
            try:
                self._decode(msg, served, shadows)
            except SerializationError as exc:
                kind = "result" if topic == self._topics.results else "shadow"
                _RECORDS.labels(kind, "undecodable").inc()
                _log.warning(
                    "skipping undecodable %s at %s: %s", kind, (topic, partition, offset), exc
                )
            except TidegateError as exc:  # the registry is down: try the batch again later
                _log.warning("indexer cannot decode now, retrying: %s", exc)
                self.retries += 1
                self._rewind(consumer, starts)
                return False
        try:
            stored = await self._store(served, list(shadows.values()))
        except (PsycopgError, LifecycleUnavailableError) as exc:
            _log.warning("indexer cannot write to PostgreSQL, retrying: %s", exc)
            self.retries += 1
            self._rewind(consumer, starts)
            return False
        _RECORDS.labels("result", "inserted").inc(len(stored.inserted))
        _RECORDS.labels("result", "replaced").inc(stored.replaced)
        _RECORDS.labels("result", "conflict").inc(len(stored.conflicts))
        _RECORDS.labels("result", "duplicate").inc(stored.duplicates(served.results))
        _RECORDS.labels("shadow", "stored").inc(len(shadows))
        warn_conflicts(stored.conflicts)
        self.indexed += len(valid)
        if self._windows is not None:
            self._windows.add(_samples(stored.inserted))
        offsets = [TopicPartition(t, p, o) for (t, p), o in ends.items()]
        if offsets:
            try:
                await asyncio.to_thread(consumer.commit, offsets=offsets, asynchronous=False)
            except KafkaException as exc:
                # The rows are stored; a redelivery after this is absorbed by the primary keys.
                _log.warning("indexer offset commit failed: %s", exc)
        return True

    def _decode(
        self,
        msg: Message,
        served: ServedBatch,
        shadows: dict[tuple[str, str, str], dict[str, Any]],
    ) -> None:
        raw = msg.value()
        if raw is None:
            return
        if msg.topic() == self._topics.results:
            served.add(served_row(self._results(raw)))
        else:
            record = self._shadows.decode(raw)
            key = (record["model"], record["candidate_version"], record["request_id"])
            shadows.setdefault(key, record)

    async def _store(self, served: ServedBatch, shadows: list[dict[str, Any]]) -> StoredServed:
        stored = StoredServed()
        async with connection(self._pool) as conn, conn.transaction():
            if served:
                stored = await store_served(conn, served)
            if shadows:
                await conn.execute(_INSERT_SHADOW, _columns(shadows, _SHADOW_COLUMNS))
        return stored

    @staticmethod
    def _rewind(consumer: Consumer, starts: dict[tuple[str, int], int]) -> None:
        for (topic, partition), offset in starts.items():
            try:
                consumer.seek(TopicPartition(topic, partition, offset))
            except KafkaException as exc:  # revoked meanwhile: the next owner starts there anyway
                _log.warning("could not rewind %s[%s]: %s", topic, partition, exc)


def _samples(rows: Any) -> list[ResultSample]:
    return [
        ResultSample(r["model"], r["version"], r["status"], r["total_ms"], r["completed_at"])
        for r in rows
        if r["version"] is not None
    ]


async def seed_windows(
    pool: AsyncConnectionPool[Any], windows: LiveWindows, since: datetime
) -> int:
    """Fill the windows with the results already indexed since `since`, so a controller that
    took over mid-canary judges the whole step, not only what arrived after it started."""
    # Only the newest `max_samples` per version: the windows keep no more, and an hour of a
    # busy model's results would not fit in memory.
    async with connection(pool) as conn:
        cur = await conn.execute(
            "SELECT model, version, status, total_ms, completed_at FROM ("
            " SELECT model, version, status, total_ms, completed_at, row_number() OVER"
            " (PARTITION BY model, version ORDER BY completed_at DESC) AS newest"
            " FROM served_requests WHERE completed_at >= %s AND version IS NOT NULL) recent"
            " WHERE newest <= %s ORDER BY completed_at",
            (since, windows.max_samples),
        )
        rows = await cur.fetchall()
    windows.add(ResultSample(*row) for row in rows)
    return len(rows)
