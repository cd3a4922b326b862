"""Reading a `ReadPlan`: the requests of a topic's offset ranges, or the ones inside DLQ envelopes,
as `SourceRecord`s in per-partition chunks.

The consumer `assign()`s the planned partitions at explicit offsets and never commits (nor
subscribes), so no consumer group's offsets move, the live workers' least of all. Its group id is
the run's own (`<prefix>-<run id>`) only because librdkafka wants one.

A chunk is up to `batch_size` selected records that follow each other in one partition, and the
offset after them. Chunks depend only on the plan, the selection and the batch size, never on
timing, so the same range always makes the same batches: a rerun computes the same outputs, and
a resumed run (which starts at a chunk's end) the same as an uninterrupted one.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from confluent_kafka import KafkaError, Message, TopicPartition

from tidegate.core.errors import SerializationError, StackError, TidegateError
from tidegate.core.kafka import make_consumer
from tidegate.core.settings import KafkaSettings
from tidegate.core.telemetry import get_logger
from tidegate.dlq.envelopes import source_position
from tidegate.dlq.ranges import ReadPlan
from tidegate.dlq.redelivery import read_lineage
from tidegate.schemas.records import RedeliveryRecord, RequestRecord, SourcePositionRecord

__all__ = ["Chunk", "Decoder", "RangeReader", "SourceRecord"]

log = get_logger(__name__)

Headers = list[tuple[str, bytes | None]]
_FETCH = 500
_MAX_SPAN = 10_000
"""A chunk ends after this many records read even when few were selected, so a narrow filter
still advances the checkpoint."""


class Decoder(Protocol):
    def __call__(self, data: bytes | None, ctx: Any = None) -> Any: ...


@dataclass(slots=True)
class SourceRecord:
    """One request to run again, with where it was read and its delivery history so far."""

    position: SourcePositionRecord
    """Where this run read it: the request's own position, or its DLQ envelope's."""
    key: bytes | None
    value: bytes | None
    """The request exactly as it was produced (wire header included)."""
    headers: Headers
    timestamp_ms: int | None
    request: RequestRecord | None
    error: TidegateError | None
    """Why `request` is None: the bytes do not decode."""
    origin: SourcePositionRecord
    """Where the request was first read."""
    history: list[RedeliveryRecord] = field(default_factory=list)
    attempt: int = 1

    @property
    def request_id(self) -> str | None:
        return str(self.request["request_id"]) if self.request is not None else None

    @property
    def model(self) -> str | None:
        return str(self.request["model"]) if self.request is not None else None

    @property
    def schema_id(self) -> int | None:
        """The registry id after the magic byte."""
        value = self.value
        return int.from_bytes(value[1:5], "big") if value and len(value) >= 5 else None

    @property
    def digest(self) -> str | None:
        """BLAKE2b-128 of the body after the 5-byte wire header, as the worker computes it."""
        if not self.value or len(self.value) < 5:
            return None
        return hashlib.blake2b(memoryview(self.value)[5:], digest_size=16).hexdigest()


@dataclass(slots=True)
class Chunk:
    partition: int
    end: int
    """The next offset to read once this chunk is done: what the checkpoint may advance to."""
    read: int
    records: list[SourceRecord]
    gave_up: int = 0
    """Offsets of the plan left unread because the partition stalled before its end."""


@dataclass(slots=True)
class _Partition:
    next: int
    end: int
    buffer: list[SourceRecord] = field(default_factory=list)
    read: int = 0
    done: bool = False
    progressed_at: float = field(default_factory=time.monotonic)


class RangeReader:
    """Blocking reads; one caller at a time (the runner hands `poll` to a thread)."""

    def __init__(
        self,
        kafka: KafkaSettings,
        plan: ReadPlan,
        positions: Mapping[int, int],
        *,
        requests: Decoder,
        envelopes: Decoder | None = None,
        group_id: str,
        batch_size: int,
        select: Callable[[SourceRecord], bool] = lambda _: True,
        stall_timeout_s: float = 15.0,
    ) -> None:
        self.plan = plan
        self._requests = requests
        self._envelopes = envelopes
        self._batch = batch_size
        self._select = select
        self._stall = stall_timeout_s
        self._parts = {
            r.partition: _Partition(max(positions.get(r.partition, r.start), r.start), r.end)
            for r in plan.ranges
        }
        for part in self._parts.values():
            part.done = part.next >= part.end
        self._consumer = make_consumer(kafka, group_id, {"enable.partition.eof": True})
        live = [TopicPartition(plan.topic, p, s.next) for p, s in self._parts.items() if not s.done]
        if live:
            self._consumer.assign(live)

    @property
    def done(self) -> bool:
        return all(part.done for part in self._parts.values())

    def poll(self, timeout: float = 0.5) -> list[Chunk]:
        """The chunks completed by one fetch (often none)."""
        if self.done:
            return []
        chunks: list[Chunk] = []
        for msg in self._consumer.consume(num_messages=_FETCH, timeout=timeout):
            error = msg.error()
            partition = msg.partition() or 0
            part = self._parts.get(partition)
            if part is None or part.done:
                continue
            if error is not None:
                if error.code() != KafkaError._PARTITION_EOF:
                    if error.fatal():
                        raise StackError(f"reading {self.plan.topic}: {error}")
                    log.warning("reading %s: %s", self.plan.topic, error)
                elif (msg.offset() or 0) >= part.end:
                    chunks.append(self._finish(partition, part, part.end))
                continue
            offset = msg.offset() or 0
            if offset >= part.end:
                chunks.append(self._finish(partition, part, part.end))
                continue
            part.next, part.progressed_at = offset + 1, time.monotonic()
            part.read += 1
            record = self._record(msg, partition, offset)
            if self._select(record):
                part.buffer.append(record)
            if part.next >= part.end:
                chunks.append(self._finish(partition, part, part.end))
            elif len(part.buffer) >= self._batch or part.read >= _MAX_SPAN:
                chunks.append(self._cut(partition, part))
        now = time.monotonic()
        for partition, part in self._parts.items():
            if not part.done and now - part.progressed_at > self._stall:
                log.warning(
                    "%s[%d] gave nothing for %.0f s at offset %d before its planned end %d: "
                    "giving the rest up",
                    self.plan.topic,
                    partition,
                    self._stall,
                    part.next,
                    part.end,
                )
                chunk = self._finish(partition, part, part.next)
                chunk.gave_up = part.end - part.next
                chunks.append(chunk)
        return chunks

    def close(self) -> None:
        self._consumer.close()

    def _cut(self, partition: int, part: _Partition) -> Chunk:
        chunk = Chunk(partition, part.next, part.read, part.buffer)
        part.buffer, part.read = [], 0
        return chunk

    def _finish(self, partition: int, part: _Partition, end: int) -> Chunk:
        part.next, part.done = max(part.next, end), True
        self._consumer.pause([TopicPartition(self.plan.topic, partition)])
        chunk = self._cut(partition, part)
        chunk.end = end
        return chunk

    def _record(self, msg: Message, partition: int, offset: int) -> SourceRecord:
        position = source_position(self.plan.topic, partition, offset)
        ts_type, ts = msg.timestamp()
        timestamp = ts if ts_type and ts > 0 else None
        if self._envelopes is not None:
            return self._from_envelope(self._envelopes, msg, position, timestamp)
        value = msg.value()
        headers = _headers(msg)
        lineage = read_lineage(headers)
        request, error = self._decode(value)
        return SourceRecord(
            position=position,
            key=msg.key(),
            value=value,
            headers=headers,
            timestamp_ms=timestamp,
            request=request,
            error=error,
            origin=(lineage.origin if lineage and lineage.origin else position),
            history=list(lineage.history) if lineage else [],
            attempt=lineage.attempt if lineage else 1,
        )

    def _from_envelope(
        self,
        envelopes: Decoder,
        msg: Message,
        position: SourcePositionRecord,
        timestamp: int | None,
    ) -> SourceRecord:
        try:
            envelope = envelopes(msg.value())
        except SerializationError as exc:
            return SourceRecord(
                position, msg.key(), msg.value(), [], timestamp, None, exc, position
            )
        headers: Headers = [(h["key"], h["value"]) for h in envelope["original_headers"]]
        lineage = read_lineage(headers)
        value = envelope["original_value"]
        request, error = self._decode(value)
        original = envelope.get("original_timestamp")
        return SourceRecord(
            position=position,
            key=envelope["original_key"],
            value=value,
            headers=headers,
            timestamp_ms=int(original.timestamp() * 1000) if original is not None else timestamp,
            request=request,
            error=error,
            origin=envelope.get("origin") or envelope["source"],
            history=list(envelope.get("history") or []),
            attempt=lineage.attempt if lineage else 1,
        )

    def _decode(self, value: bytes | None) -> tuple[RequestRecord | None, TidegateError | None]:
        """A `RetriableError` (the registry is unreachable) propagates: the run stops, and its
        checkpoint still points before this record."""
        try:
            request: RequestRecord = self._requests(value)
            return request, None
        except SerializationError as exc:
            return None, exc


def _headers(msg: Message) -> Headers:
    raw = msg.headers() or []
    items = raw.items() if isinstance(raw, dict) else raw
    return [(str(k), v.encode() if isinstance(v, str) else v) for k, v in items]
