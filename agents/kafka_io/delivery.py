"""Producing results and dead letters, with a callback per message once Kafka acknowledged it.

Results are encoded once and the same bytes go to `inference-results` (keyed like the request) and,
when the request asks, to its `reply_to` topic and partition. A result whose request has a
routing key goes to that key's partition; one without goes to a sticky partition
(`tidegate.core.sticky`), so a batch's results make one ProduceRequest, not one each. The
producer is the idempotent, acks=all one of `tidegate.core.kafka`, so messages of one partition
land in produce order. Side records (shadow comparisons) share the producer, or go through
`side` when the main one is transactional; nothing waits for them or commits by them.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Mapping
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Message, Producer
from confluent_kafka.schema_registry import SchemaRegistryClient

from tidegate.agents import worker_metrics as metrics
from tidegate.core.errors import ConfigurationError, TidegateError
from tidegate.core.settings import TopicSettings
from tidegate.core.sticky import StickyPartitions
from tidegate.core.telemetry import get_logger
from tidegate.core.tracing import KafkaHeaders
from tidegate.schemas.catalog import (
    DEAD_LETTER_ENVELOPE,
    INFERENCE_RESULT,
    SHADOW_COMPARISON,
    load_schema,
)
from tidegate.schemas.codec import AvroEncoder
from tidegate.schemas.records import ReplyToRecord, ResultRecord
from tidegate.schemas.requests import SUBMISSION_HEADER

__all__ = ["Ack", "ResultBatch", "ResultPublisher"]

log = get_logger(__name__)

Ack = Callable[[KafkaError | None, Message], None]

# Longer than a flush takes to produce: one flush's results share a partition.
_STICKY_WINDOW_S = 0.01
_METADATA_TIMEOUT_S = 10.0
_METADATA_REREAD_S = 30.0
# A result at least this large goes out on its own, where a too-large one is told at once and the
# sink answers the request with the error instead (the broker's default limit is 1 MB).
_BATCH_MAX_BYTES = 256 * 1024

_RECORD_UNIONS = (
    ("source", "dev.tidegate.common.SourcePosition"),
    ("error", "dev.tidegate.common.ErrorInfo"),
    ("origin", "dev.tidegate.common.SourcePosition"),
)


class ResultPublisher:
    def __init__(
        self, producer: Producer, registry: SchemaRegistryClient, topics: TopicSettings
    ) -> None:
        self.producer = producer
        self.topics = topics
        self._results = AvroEncoder(registry, load_schema(INFERENCE_RESULT))
        self._letters = AvroEncoder(registry, load_schema(DEAD_LETTER_ENVELOPE))
        self._shadow = AvroEncoder(registry, load_schema(SHADOW_COMPARISON))
        self._ids: dict[str, int] = {}
        self._sticky = StickyPartitions(_STICKY_WINDOW_S)
        self._result_partitions = 0
        self._reply_partitions = 0
        self._replies_read_at = 0.0
        # Exactly-once: the main producer is transactional and side records stay out of it.
        self.side: Producer | None = None

    def start(self) -> None:
        """Resolve the schema ids once (blocking registry calls), so producing never waits."""
        wanted = {
            self.topics.results: self._results,
            self.topics.failed: self._letters,
            self.topics.poison: self._letters,
            self.topics.shadow: self._shadow,
            **{topic: self._letters for topic in self.topics.retry_topics()},
        }
        for topic, encoder in wanted.items():
            subject = f"{topic}-value"
            try:
                self._ids[topic] = encoder.schema_id(subject)
            except TidegateError as exc:
                raise ConfigurationError(
                    f"no schema under {subject} ({exc}); run `tidegate schemas register`"
                ) from exc
        self._result_partitions = self._partitions(self.topics.results)
        self._reply_partitions = self._partitions(self.topics.replies)
        self._replies_read_at = time.monotonic()

    def _partitions(self, topic: str) -> int:
        """How many partitions `topic` has; 0 when its metadata could not be read (results then
        hash by key, as keyed ones always do)."""
        try:
            found = self.producer.list_topics(topic, timeout=_METADATA_TIMEOUT_S).topics
        except KafkaException as exc:
            log.warning("no metadata of %s: %s", topic, exc)
            return 0
        meta = found.get(topic)
        return len(meta.partitions) if meta is not None and meta.error is None else 0

    def reply_refusal(self, reply_to: ReplyToRecord | None) -> str | None:
        """Why a request's `reply_to` is not honoured, or None. A reply goes only to a partition
        of the configured replies topic: a request may not steer the worker's producer to any
        other topic (`_schemas`, the lifecycle log) or to a partition that does not exist."""
        if not reply_to:
            return None
        topic, partition = reply_to.get("topic"), reply_to.get("partition")
        if topic != self.topics.replies:
            return f"reply_to names topic {topic!r}; replies go only to {self.topics.replies!r}"
        if not isinstance(partition, int) or partition < 0:
            return f"reply_to must name a partition of {topic!r}, not {partition!r}"
        if partition >= self._reply_partitions and self._may_reread_replies():
            # Partitions may have been added since: read again, at most every half minute.
            self._reply_partitions = self._partitions(self.topics.replies) or self._reply_partitions
        if self._reply_partitions and partition >= self._reply_partitions:
            return f"{topic!r} has {self._reply_partitions} partitions, not a partition {partition}"
        return None

    def _may_reread_replies(self) -> bool:
        now = time.monotonic()
        if now - self._replies_read_at < _METADATA_REREAD_S:
            return False
        self._replies_read_at = now
        return True

    def encode_result(self, result: ResultRecord) -> bytes:
        # Naming the branch of record-typed unions spares fastavro from trying each candidate
        # (a quarter of the encoding time of a result).
        record = dict(result)
        for name, fullname in _RECORD_UNIONS:
            if record.get(name) is not None:
                record[name] = (fullname, record[name])
        return self._results.encode(record, self._ids[self.topics.results])

    def result(
        self,
        value: bytes,
        key: bytes | None,
        reply_to: ReplyToRecord | None,
        ack: Ack | None,
        headers: KafkaHeaders | None = None,
        *,
        keyed: bool = True,
        reply_ack: Ack | None = None,
        batch: ResultBatch | None = None,
    ) -> int:
        """Produce an encoded result; returns how many messages were produced (1 or 2).
        With `batch`, its copy for the results topic may wait in it for the batch's `send`.
        `headers` (the request's trace context) go with the result and the reply, and the reply
        carries its submission's nonce too (`SUBMISSION_HEADER`). `keyed`: the request had a
        routing key, whose partition the result must go to; else any does. `reply_ack`: the
        reply's acknowledgement, when it is told apart from the result's (else `ack`)."""
        reply_ack = reply_ack or ack
        if batch is not None and batch.failed:
            return 0  # nothing after a failed batch goes out: the worker fails and redoes it
        partition = None
        if not keyed and self._result_partitions:
            partition = self._sticky.pick(self.topics.results, self._result_partitions)
        if batch is not None and not headers and len(value) < _BATCH_MAX_BYTES:
            batch.add(value, key, partition)
        else:
            # What was added before this result goes out before it.
            if batch is not None and not batch.send():
                return 0
            self.produce_one(self.topics.results, value, key, partition, ack, headers)
        if not reply_to:
            return 1
        nonce = reply_to.get("nonce")
        if nonce:
            headers = [*(headers or ()), (SUBMISSION_HEADER, str(nonce).encode())]
        topic = str(reply_to["topic"])
        try:
            self.produce_one(topic, value, key, reply_to.get("partition"), reply_ack, headers)
        except KafkaException as exc:
            # Refused at once (too large with its headers, a partition librdkafka knows is not
            # there): as a refusal on delivery, counted and logged. The result is already out,
            # so answering the request again with an error would give it two results.
            error = exc.args[0] if exc.args else None
            reason = error.name() if isinstance(error, KafkaError) else "refused"
            metrics.REPLIES_UNDELIVERED.labels(reason).inc()
            log.warning("a reply to %s was refused: %s", topic, exc)
            return 1
        return 2

    def dead_letter(
        self, topic: str, envelope: Mapping[str, Any], key: bytes | None, ack: Ack | None
    ) -> None:
        self.produce_one(topic, self._letters.encode(envelope, self._ids[topic]), key, None, ack)

    def shadow(self, comparison: Mapping[str, Any]) -> bool:
        """Produce a ShadowComparison record, keyed by model; False when it was dropped. No
        offset waits for it, so a failed delivery is only logged, and a full local queue drops
        it at once: waiting for room would hold up the primary results behind it."""
        topic = self.topics.shadow
        value = self._shadow.encode(comparison, self._ids[topic])
        key = str(comparison["model"]).encode()
        producer = self.side or self.producer
        try:
            producer.produce(topic, key=key, value=value, on_delivery=_log_failure)
        except BufferError:
            metrics.SHADOW_SKIPPED.labels(
                comparison["model"], comparison["candidate_version"], "queue-full"
            ).inc()
            return False
        return True

    def poll(self, timeout: float = 0.0) -> int:
        """Serve delivery callbacks that are due (on the calling thread), waiting up to
        `timeout` for the first."""
        served = int(self.producer.poll(timeout))
        if self.side is not None:
            served += int(self.side.poll(0))
        return served

    def outstanding(self) -> int:
        """Messages produced whose delivery report has not been served yet."""
        left = len(self.producer)
        if self.side is not None:
            left += len(self.side)
        return left

    def flush(self, timeout: float) -> int:
        """Wait for outstanding messages; returns how many are still undelivered."""
        left = int(self.producer.flush(timeout))
        if self.side is not None:
            left += int(self.side.flush(timeout))
        return left

    def produce_one(
        self,
        topic: str,
        value: bytes,
        key: bytes | None,
        partition: int | None,
        ack: Ack | None,
        headers: KafkaHeaders | None = None,
    ) -> None:
        """One message, waiting for room in the local queue."""
        kwargs: dict[str, Any] = {"key": key, "value": value}
        if ack is not None:
            kwargs["on_delivery"] = ack
        if headers:
            kwargs["headers"] = headers
        if partition is not None and partition >= 0:
            kwargs["partition"] = partition
        while True:
            try:
                self.producer.produce(topic, **kwargs)
                return
            except BufferError:
                # The local queue is full until delivery reports are served, and the worker
                # serves them on this thread (its loop): serve them while waiting for room.
                self.poll(0.005)


class ResultBatch:
    """A flush's results for the results topic, handed to librdkafka in one `produce_batch` call
    rather than one `produce` each: each call takes the producer's locks and wakes its threads,
    and per message that was the worker's largest cost after the model (docs/worker.md).

    `produce_batch` carries no headers, so a traced result goes out alone, after what the batch
    holds (`ResultPublisher.result` sends it first): the order of the results topic is the order
    of `add`. librdkafka queues the messages in order; one the full local queue refused is produced
    again, waiting for room, if nothing after it was queued. Otherwise, or for any other refusal,
    `fail` is told, since a later message of its partition would overtake it: the worker fails and
    its requests are redone from their committed offsets."""

    __slots__ = ("_ack", "_fail", "_messages", "_publisher", "failed")

    def __init__(
        self, publisher: ResultPublisher, ack: Ack | None, fail: Callable[[BaseException], None]
    ) -> None:
        self._publisher = publisher
        self._ack = ack
        self._fail = fail
        self._messages: list[dict[str, Any]] = []
        self.failed = False
        """Set for good once a message could not be queued in order; nothing more is queued."""

    def add(self, value: bytes, key: bytes | None, partition: int | None) -> None:
        message: dict[str, Any] = {"key": key, "value": value}
        if partition is not None and partition >= 0:
            message["partition"] = partition
        self._messages.append(message)

    def send(self) -> bool:
        """Queue what was added since the last `send`; False when the batch failed."""
        if self.failed:
            return False
        messages, self._messages = self._messages, []
        # confluent-kafka's produce_batch ignores a message's own `partition` (librdkafka takes
        # it only with a flag the binding does not pass): a run of messages for one named
        # partition goes in one call naming it, the rest to the partitioner by key.
        for partition, run in itertools.groupby(messages, key=lambda m: m.get("partition")):
            try:
                self._queue(list(run), partition)
            except KafkaException as exc:
                self.failed = True
                self._fail(exc)
                return False
        return True

    def _queue(self, run: list[dict[str, Any]], partition: int | None) -> None:
        """One run of messages of one partition (or none named); raises `KafkaException` when
        one could not be queued in order."""
        publisher = self._publisher
        topic = publisher.topics.results
        kwargs: dict[str, Any] = {}
        if self._ack is not None:
            kwargs["on_delivery"] = self._ack
        if partition is not None:
            kwargs["partition"] = partition
        publisher.producer.produce_batch(topic, run, **kwargs)
        refused = [k for k, m in enumerate(run) if "_error" in m]
        if not refused:
            return
        first = refused[0]
        errors: list[KafkaError] = [m["_error"] for m in run[first:] if "_error" in m]
        if len(errors) != len(run) - first or any(
            e.code() != KafkaError._QUEUE_FULL for e in errors
        ):
            raise KafkaException(errors[0])
        for m in run[first:]:
            publisher.produce_one(topic, m["value"], m["key"], partition, self._ack)


def _log_failure(err: KafkaError | None, msg: Message) -> None:
    if err is not None:
        log.warning("a record for %s was not delivered: %s", msg.topic(), err)
