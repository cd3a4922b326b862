"""Result sinks: what a batch's results and dead letters become on Kafka, and when their offsets
count as done. A sink is `add` then `flush`: `AckedSink` (at-least-once) releases offsets once
Kafka acknowledged a flush, `TransactionalSink` (exactly-once) commits them with a transaction.
Each entry holds its offset's token from `add` until released: nothing after an undelivered
record is committed. How: docs/worker.md ("Results, offsets and commits").
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from confluent_kafka import KafkaError, KafkaException, Message, TopicPartition

from tidegate.agents import worker_metrics as metrics
from tidegate.agents.inference.result_builders import error_result
from tidegate.agents.kafka_io.delivery import ResultBatch, ResultPublisher
from tidegate.agents.kafka_io.offsets import OffsetTracker
from tidegate.agents.tasks import worker_tracing as tracing
from tidegate.agents.tasks.inference_task import InferenceTask
from tidegate.core.errors import ModelExecutionError, SerializationError
from tidegate.core.telemetry import get_logger
from tidegate.schemas.records import ResultRecord

__all__ = ["AckedSink", "ResultSink", "SinkEntry", "TransactionalSink"]

log = get_logger(__name__)


@dataclass(slots=True, eq=False)
class SinkEntry:
    """One record to produce for `offset`: a result (to the results topic and the request's
    `reply_to`), or a dead letter (`letter`: its topic and envelope)."""

    tracker: OffsetTracker
    offset: int
    key: bytes | None
    result: ResultRecord | None = None
    task: InferenceTask | None = None
    letter: tuple[str, Mapping[str, Any]] | None = None


class ResultSink(Protocol):
    def add(self, entry: SinkEntry) -> None:
        """Take an entry; its offset is not done until the sink says so."""

    def flush(self) -> None:
        """Produce what was added since the last flush."""


class _Produced:
    """The acknowledgements of one flush: counted on the producer's polling thread, released on
    the loop once all arrived. A failed one is fatal: its offset must never be committed."""

    __slots__ = ("_armed", "_entries", "_fatal", "_lock", "_loop", "_pending")

    def __init__(
        self,
        entries: list[SinkEntry],
        loop: asyncio.AbstractEventLoop,
        fatal: Callable[[BaseException], None],
    ) -> None:
        self._entries = entries
        self._loop = loop
        self._fatal = fatal
        self._pending = 0
        self._armed = False
        # Acknowledgements arrive on the polling thread, possibly before `arm`.
        self._lock = threading.Lock()

    def arm(self, produced: int) -> None:
        """All `produced` messages are out: release when the last acknowledgement is in."""
        with self._lock:
            self._pending += produced
            self._armed = True
            done = self._pending == 0
        if done:
            self.release()

    def ack(self, err: KafkaError | None, _msg: Message | None) -> None:
        if err is not None:
            self._loop.call_soon_threadsafe(self._fatal, KafkaException(err))
            return
        with self._lock:
            self._pending -= 1
            done = self._armed and self._pending == 0
        if done:
            self._loop.call_soon_threadsafe(self.release)

    def reply_ack(self, err: KafkaError | None, msg: Message | None) -> None:
        """A reply's acknowledgement. Its result went to the results topic with its own ack, so
        a reply Kafka refuses for good (an unknown partition, no authorization) is counted and
        logged, not fatal: one request must not kill the worker that serves everyone else. A
        transient failure (an outage) stays fatal, so the batch is redone and the reply sent."""
        if err is not None and not err.retriable() and err.code() != KafkaError._MSG_TIMED_OUT:
            metrics.REPLIES_UNDELIVERED.labels(err.name()).inc()
            log.warning(
                "a reply to %s was refused: %s", msg.topic() if msg is not None else "?", err
            )
            err = None
        self.ack(err, msg)

    def release(self) -> None:
        for entry in self._entries:
            entry.tracker.done(entry.offset)


def _produce(
    publisher: ResultPublisher,
    entry: SinkEntry,
    worker_id: str,
    ack: Any,
    traced: bool,
    reply_ack: Any = None,
    batch: ResultBatch | None = None,
) -> int:
    """Produce one entry; a result too large for Kafka (or not encodable) is answered with the
    error instead. Returns how many messages went out or wait in `batch`. `traced`: the result
    carries its request's trace context on, and the request's span ends. `reply_ack`: the
    reply's."""
    if entry.letter is not None:
        topic, envelope = entry.letter
        publisher.dead_letter(topic, envelope, entry.key, ack)
        return 1
    task = entry.task
    assert entry.result is not None  # noqa: S101 - a result entry, built so
    assert task is not None  # noqa: S101
    reply_to = task.request.get("reply_to")
    headers = tracing.result_headers(task) if traced else None
    keyed = bool(task.request.get("routing_key"))
    try:
        value = publisher.encode_result(entry.result)
        produced = publisher.result(
            value, entry.key, reply_to, ack, headers, keyed=keyed, reply_ack=reply_ack, batch=batch
        )
    except (SerializationError, KafkaException) as exc:
        failure = ModelExecutionError(f"the result could not be published: {exc}")
        entry.result = error_result(task, failure, worker_id=worker_id)
        value = publisher.encode_result(entry.result)
        produced = publisher.result(
            value, entry.key, reply_to, ack, headers, keyed=keyed, reply_ack=reply_ack, batch=batch
        )
    if traced:
        tracing.finished(task, entry.result)
    return produced


class AckedSink:
    """At-least-once: offsets are done once Kafka acknowledged their records."""

    def __init__(
        self,
        publisher: ResultPublisher,
        *,
        worker_id: str,
        on_fatal: Callable[[BaseException], None],
        traced: bool = False,
    ) -> None:
        self._publisher = publisher
        self._worker_id = worker_id
        self._fatal = on_fatal
        self._traced = traced
        self._loop = asyncio.get_running_loop()
        self._entries: list[SinkEntry] = []

    def add(self, entry: SinkEntry) -> None:
        entry.tracker.expect(entry.offset)
        self._entries.append(entry)

    def flush(self) -> None:
        if not self._entries:
            return
        entries = [e for e in self._entries if not e.tracker.closed]
        self._entries = []
        produced = _Produced(entries, self._loop, self._fatal)
        publisher, worker_id, traced = self._publisher, self._worker_id, self._traced
        batch = ResultBatch(publisher, produced.ack, self._fatal)
        count = sum(
            _produce(publisher, e, worker_id, produced.ack, traced, produced.reply_ack, batch)
            for e in entries
        )
        if batch.send():
            produced.arm(count)
        # else the worker fails: nothing of this flush is released, so none of it is committed


class TransactionalSink:
    """Exactly-once: records go out inside a transaction that also carries the consumed offsets.

    Nothing is produced while a commit runs (librdkafka refuses it); what is added meanwhile waits
    and opens the next transaction. A commit that fails but can be aborted (a rebalance changed
    the group's generation, a timeout) aborts the transaction and calls `on_aborted`: the worker
    rewinds every partition to its last committed position. A fatal error (fenced by a newer
    instance with the same transactional.id) fails the worker.
    """

    def __init__(
        self,
        publisher: ResultPublisher,
        *,
        worker_id: str,
        on_fatal: Callable[[BaseException], None],
        positions: Callable[[], list[TopicPartition]],
        group_metadata: Callable[[], Any],
        on_committed: Callable[[list[TopicPartition]], None],
        on_aborted: Callable[[], None],
        timeout_s: float = 5.0,
        traced: bool = False,
    ) -> None:
        self._publisher = publisher
        self._traced = traced
        self._producer = publisher.producer
        self._worker_id = worker_id
        self._fatal = on_fatal
        self._positions = positions
        self._group_metadata = group_metadata
        self._on_committed = on_committed
        self._on_aborted = on_aborted
        self._timeout_s = timeout_s
        self._entries: list[SinkEntry] = []
        self._open = False
        self._committing = False
        self._failed = False
        self._lock = asyncio.Lock()

    def add(self, entry: SinkEntry) -> None:
        entry.tracker.expect(entry.offset)
        self._entries.append(entry)

    def flush(self) -> None:
        if self._committing or self._failed or not self._entries:
            return
        entries = [e for e in self._entries if not e.tracker.closed]
        self._entries = []
        if not entries:
            return
        if not self._open:
            self._producer.begin_transaction()
            self._open = True
        batch = ResultBatch(self._publisher, None, self._fatal)
        for entry in entries:
            _produce(self._publisher, entry, self._worker_id, None, self._traced, batch=batch)
        if not batch.send():
            self._failed = True  # the worker fails: this transaction is aborted, never committed
            return
        for entry in entries:
            entry.tracker.done(entry.offset)

    async def commit(self) -> bool:
        """Commit the open transaction with the positions of everything produced in it; False
        when it had to be aborted instead (or nothing was open)."""
        async with self._lock:
            if not self._open or self._failed:
                return False
            self._committing = True
            try:
                offsets = self._positions()
                started = time.perf_counter()
                await asyncio.to_thread(self._commit, offsets)
                metrics.TRANSACTION_COMMIT.observe(time.perf_counter() - started)
            except KafkaException as exc:
                await self._failed_commit(exc)
                return False
            finally:
                self._committing = False
            self._open = False
            self._on_committed(offsets)
        self.flush()
        return True

    async def _failed_commit(self, exc: KafkaException) -> None:
        error = exc.args[0] if exc.args and isinstance(exc.args[0], KafkaError) else None
        if error is not None and error.fatal():
            self._fatal(exc)
            return
        log.warning("committing the transaction failed, aborting it: %s", exc)
        self._open = False
        self._entries.clear()
        try:
            await asyncio.to_thread(self._producer.abort_transaction, self._timeout_s)
        except KafkaException as again:
            self._fatal(again)
            return
        metrics.TRANSACTION_ABORTS.inc()
        self._on_aborted()

    def _commit(self, offsets: list[TopicPartition]) -> None:
        if offsets:
            self._producer.send_offsets_to_transaction(
                offsets, self._group_metadata(), self._timeout_s
            )
        self._producer.commit_transaction(self._timeout_s)

    async def abort(self) -> None:
        """Abort the open transaction (lost partitions, a failing worker): none of it ever
        becomes visible."""
        async with self._lock:
            self._entries.clear()
            if not self._open:
                return
            self._open = False
            try:
                await asyncio.to_thread(self._producer.abort_transaction, self._timeout_s)
            except KafkaException as exc:
                log.warning("aborting the transaction failed (it times out instead): %s", exc)
                return
            metrics.TRANSACTION_ABORTS.inc()
