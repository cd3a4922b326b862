"""The retry relay: requests waiting on the retry topics go back through the pipeline when due.

Each retry topic holds one delay, so its envelopes come due in the order they were written: the
relay reads a partition until its head is not due yet, then pauses that partition and seeks back
to the head, and resumes it when the head's `retry_at` comes. Nothing sleeps: the consumer's
poll timeout is cut to the next due time, and a paused partition costs nothing while it waits.

A due request is published again to the partition it was first read from, with its original
key, value and headers and the lineage headers (`dlq.redelivery`): one more attempt, and a
`retry` step (`hold` for a request that only waited behind its key) in its history. Offsets are
committed only after Kafka acknowledged what they produced (at-least-once); with
`transactional_id` the publishing and the offsets commit in one Kafka transaction, so an
exactly-once worker's retries are not doubled by a relay that died halfway.

Every worker process runs one relay, all in one consumer group (`<worker group>-retry`), so the
retry partitions spread over the workers like the request partitions do.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from typing import Any

from confluent_kafka import (
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    Producer,
    TopicPartition,
)
from confluent_kafka.schema_registry import SchemaRegistryClient
from prometheus_client import Counter

from tidegate.core.errors import SerializationError, TidegateError
from tidegate.core.kafka import make_consumer, make_producer
from tidegate.core.settings import KafkaSettings, TopicSettings
from tidegate.core.telemetry import get_logger
from tidegate.dlq.envelopes import source_position
from tidegate.dlq.redelivery import read_back, redelivery_headers, step
from tidegate.schemas.catalog import DEAD_LETTER_ENVELOPE, load_schema
from tidegate.schemas.codec import AvroDecoder

__all__ = ["RELAYED", "RetryRelay", "republished"]

log = get_logger(__name__)

RELAYED = Counter(
    "tidegate_retry_relay_records",
    "Retry-topic records the relay handled, by topic and outcome (relayed, undecodable, "
    "dead-lettered: Kafka refused them back).",
    ["topic", "outcome"],
)
_HELD = "HELD_BEHIND_KEY"
_BATCH = 500
_FLUSH_S = 30.0


def republished(
    envelope: Mapping[str, Any], at_ms: int, taken_from: Mapping[str, Any]
) -> dict[str, Any]:
    """Topic, partition, key, value and headers of a waiting request sent through again."""
    code = str(envelope["error"]["code"])
    held = code == _HELD
    history = [read_back(s) for s in envelope.get("history") or ()]
    history.append(step("hold" if held else "retry", at_ms, source=taken_from, reason=code))
    failed_before = not held or any(s.get("kind") == "retry" for s in history)
    source = envelope["source"]
    headers = redelivery_headers(
        [(h["key"], h["value"]) for h in envelope.get("original_headers") or ()],
        attempt=int(envelope.get("attempt") or 1) + (0 if held else 1),
        origin=envelope.get("origin") or source,
        history=history,
        first_failed_at_ms=_ms(envelope["first_failed_at"]) if failed_before else None,
    )
    return {
        "topic": source["topic"],
        "partition": int(source["partition"]),
        "key": envelope.get("original_key"),
        "value": envelope.get("original_value"),
        "headers": headers,
    }


class RetryRelay:
    def __init__(
        self,
        kafka: KafkaSettings,
        topics: TopicSettings,
        registry: SchemaRegistryClient,
        *,
        group_id: str,
        client_id: str = "tidegate-retry",
        transactional_id: str | None = None,
        poll_s: float = 0.25,
    ) -> None:
        self._kafka = kafka
        self._topics = topics.retry_topics()
        self._dead_letters = topics.failed
        self._decode = AvroDecoder(registry, load_schema(DEAD_LETTER_ENVELOPE))
        self._group_id = group_id
        self._client_id = client_id
        self._txn_id = transactional_id
        self._poll_s = poll_s
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        # Paused partitions: (topic, partition) -> (due ms, the head's offset).
        self._paused: dict[tuple[str, int], tuple[int, int]] = {}
        self.relayed = 0

    def start(self) -> None:
        extra = {"client.id": self._client_id}
        self._consumer = make_consumer(self._kafka, self._group_id, extra)
        producer_extra: dict[str, Any] = dict(extra)
        if self._txn_id:
            producer_extra["transactional.id"] = self._txn_id
        self._producer: Producer = make_producer(self._kafka, producer_extra)
        if self._txn_id:
            self._producer.init_transactions(30.0)
        self._consumer.subscribe(self._topics, on_revoke=self._revoked, on_lost=self._revoked)
        self._thread = threading.Thread(target=self._run, name="retry-relay", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(_FLUSH_S + 10)
            self._thread = None

    @property
    def failed(self) -> BaseException | None:
        return self._error

    def _run(self) -> None:
        try:
            while not self._stopping.is_set():
                self._resume_due()
                batch = self._consumer.consume(_BATCH, self._timeout())
                if batch:
                    self._relay(batch)
        except BaseException as exc:  # the worker's watchdog reads it and fails the process
            log.error("retry relay failed: %s", exc)
            self._error = exc
        finally:
            self._consumer.close()
            self._producer.flush(_FLUSH_S)

    def _timeout(self) -> float:
        if not self._paused:
            return self._poll_s
        due = min(d for d, _ in self._paused.values())
        return max(0.0, min(self._poll_s, (due - time.time() * 1000) / 1000.0))

    def _resume_due(self) -> None:
        now = time.time() * 1000
        due = [tp for tp, (at, _) in self._paused.items() if at <= now]
        if not due:
            return
        parts = [TopicPartition(t, p, self._paused.pop((t, p))[1]) for t, p in due]
        for tp in parts:
            self._consumer.seek(tp)
        self._consumer.resume([TopicPartition(tp.topic, tp.partition) for tp in parts])

    def _relay(self, batch: list[Message]) -> None:
        now = int(time.time() * 1000)
        out: list[tuple[dict[str, Any], Message]] = []
        commits: dict[tuple[str, int], int] = {}
        for msg in batch:
            topic, partition, offset = str(msg.topic()), msg.partition(), msg.offset()
            if msg.error() is not None or partition is None or offset is None:
                if msg.error() is not None:
                    log.warning("retry relay consumer: %s", msg.error())
                continue
            tp = (topic, partition)
            if tp in self._paused:
                continue  # fetched before the pause: read again from the head on resume
            try:
                envelope = self._decode(msg.value())
            except SerializationError as exc:
                log.warning("skipping undecodable retry record %s@%d: %s", tp, offset, exc)
                RELAYED.labels(topic, "undecodable").inc()
                commits[tp] = offset + 1
                continue
            due = _due_ms(envelope)
            if due > now:
                self._consumer.pause([TopicPartition(topic, partition)])
                self._paused[tp] = (due, offset)
                continue
            record = republished(envelope, now, source_position(topic, partition, offset))
            out.append((record, msg))
            commits[tp] = offset + 1
            RELAYED.labels(topic, "relayed").inc()
        if commits:
            self._publish(out, [TopicPartition(t, p, o) for (t, p), o in commits.items()])

    def _publish(
        self, records: list[tuple[dict[str, Any], Message]], offsets: list[TopicPartition]
    ) -> None:
        producer = self._producer
        failed: list[tuple[Message, KafkaError]] = []
        if self._txn_id:
            producer.begin_transaction()
        for record, msg in records:
            try:
                self._produce(record, _collect(failed, msg))
            except KafkaException as exc:
                if self._txn_id:
                    raise  # the transaction is aborted and the relay fails, as below
                # Refused at once (a partition librdkafka already knows is not there, a record
                # too large): as a refusal on delivery, whichever librdkafka finds first.
                failed.append((msg, exc.args[0]))
        if self._txn_id:
            # A record Kafka refused fails the commit: the transaction is aborted and the relay
            # fails, and the worker's restart reads the retry records again.
            metadata = self._consumer.consumer_group_metadata()
            producer.send_offsets_to_transaction(offsets, metadata, _FLUSH_S)
            producer.commit_transaction(_FLUSH_S)
        else:
            if producer.flush(_FLUSH_S):
                raise TidegateError("retried requests not acknowledged by Kafka in time")
            if failed:
                self._dead_letter(failed)
            try:
                self._consumer.commit(offsets=offsets, asynchronous=False)
            except KafkaException as exc:  # republished again by the next owner: at-least-once
                log.warning("retry relay commit failed: %s", exc)
        self.relayed += len(records) - len(failed)

    def _produce(self, record: Mapping[str, Any], on_delivery: Any) -> None:
        while True:
            try:
                self._producer.produce(**record, on_delivery=on_delivery)
                return
            except BufferError:
                self._producer.poll(0.05)

    def _dead_letter(self, failed: list[tuple[Message, KafkaError]]) -> None:
        """Requests Kafka refused to take back (a deleted topic, a record grown past the size
        limit) go to the dead-letter topic as they waited, rather than vanish; only when that
        fails too does the relay fail, before committing."""
        lost: list[KafkaError] = []
        for msg, err in failed:
            log.error("retry relay: republishing %s@%s failed: %s", msg.topic(), msg.offset(), err)
            RELAYED.labels(str(msg.topic()), "dead-lettered").inc()
            record = {"topic": self._dead_letters, "key": msg.key(), "value": msg.value()}
            self._produce(record, _collect(lost, None))
        if self._producer.flush(_FLUSH_S) or lost:
            raise TidegateError(f"retried requests lost: republish and dead letter failed ({lost})")

    def _revoked(self, _consumer: Consumer, partitions: list[TopicPartition]) -> None:
        for tp in partitions:
            self._paused.pop((tp.topic, tp.partition), None)


def _collect(into: list[Any], msg: Message | None) -> Any:
    """A delivery callback that keeps what failed (runs on the relay's thread, in flush)."""

    def report(err: KafkaError | None, _delivered: Message) -> None:
        if err is not None:
            into.append((msg, err) if msg is not None else err)

    return report


def _due_ms(envelope: Mapping[str, Any]) -> int:
    due = envelope.get("retry_at")
    return _ms(envelope["failed_at"] if due is None else due)


def _ms(value: Any) -> int:
    """Epoch milliseconds of an Avro timestamp-millis (fastavro reads datetimes)."""
    if hasattr(value, "timestamp"):
        return int(value.timestamp() * 1000)
    return int(value)
