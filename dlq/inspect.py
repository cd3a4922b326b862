"""Reading dead-letter topics for inspection: `tidegate dlq list / show / stats` and the admin
API's reads, and the redrive's input.

A reader never joins a consumer group and never commits: its consumer is `assign`ed explicit
offsets (the first, or with a `since` the first at that time by `offsets_for_times`) and reads up
to the high watermark each partition had when the read was planned. So a read is a snapshot: it
ends even while workers keep dead-lettering, and a redrive never reads back the letters its own
redriven requests produce. Only the redrive passes a group id of its own (its checkpoint, see
`tidegate.dlq.redrive`); for every other read the id is a throwaway that is never used to commit.

Envelopes are decoded with the registry's writer schemas into the current reader schema. A
record that is not an envelope becomes a `Letter` with a `problem` rather than stopping the read;
a registry that cannot be reached stops it (`RegistryUnavailableError`, retriable).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition

from tidegate.core.errors import (
    InvalidInputError,
    RetriableError,
    TidegateError,
    UnknownSchemaError,
)
from tidegate.core.kafka import make_consumer
from tidegate.core.settings import KafkaSettings, TopicSettings
from tidegate.dlq.letters import Letter, LetterFilter, LetterStats
from tidegate.schemas.catalog import DEAD_LETTER_ENVELOPE, INFERENCE_REQUEST, load_schema
from tidegate.schemas.codec import AvroDecoder, Registry, registry_client
from tidegate.schemas.wire import unpack

__all__ = [
    "DeadLetterReader",
    "DeadLetterUnavailableError",
    "Range",
    "dead_letter_topics",
    "find_letter",
    "letter_stats",
    "list_letters",
    "scan",
]

_BATCH = 500
# A dead letter is produced after its `failed_at`; the time lookup starts this much earlier so
# that a clock skew between hosts cannot hide a letter from a `since` filter.
_SKEW_MS = 60_000


class DeadLetterUnavailableError(RetriableError):
    """Kafka could not be read: unreachable, or a read stalled before its end."""

    code = "DLQ_UNAVAILABLE"


@dataclass(frozen=True)
class Range:
    """Offsets [start, end) of one partition: what a read takes."""

    topic: str
    partition: int
    start: int
    end: int

    @property
    def size(self) -> int:
        return max(0, self.end - self.start)


def dead_letter_topics(topics: TopicSettings, name: str | None) -> list[str]:
    """The topics a read covers: `failed`, `poison`, `all` (both, the default) or the name of
    one of the failed, poison and retry topics."""
    choice = (name or "all").strip()
    if choice == "all":
        return [topics.failed, topics.poison]
    if choice == "failed":
        return [topics.failed]
    if choice == "poison":
        return [topics.poison]
    known = [topics.failed, topics.poison, *topics.retry_topics()]
    if choice in known:
        return [choice]
    raise InvalidInputError(
        f"{choice!r} is not a dead-letter topic: use failed, poison, all or one of "
        f"{', '.join(known)}",
        field="topic",
    )


class DeadLetterReader:
    """A blocking reader of dead-letter topics; the async helpers below run it on a thread."""

    def __init__(
        self,
        kafka: KafkaSettings,
        registry: Registry,
        *,
        group_id: str | None = None,
        timeout_s: float = 10.0,
    ) -> None:
        client = registry_client(registry)
        self._envelopes = AvroDecoder(client, load_schema(DEAD_LETTER_ENVELOPE))
        self._requests = AvroDecoder(client, load_schema(INFERENCE_REQUEST))
        self._timeout_s = timeout_s
        self._unreadable_ids: set[int] = set()  # writer ids the registry does not know
        self.group_id = group_id or f"tidegate-dlq-inspect-{uuid.uuid4().hex[:12]}"
        try:
            self.consumer: Consumer = make_consumer(
                kafka,
                self.group_id,
                {"enable.partition.eof": True, "enable.auto.offset.store": False},
            )
        except KafkaException as exc:
            raise DeadLetterUnavailableError(f"cannot create a Kafka consumer: {exc}") from exc

    def close(self) -> None:
        self.consumer.close()

    def __enter__(self) -> DeadLetterReader:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def partitions(self, topic: str) -> list[int]:
        try:
            meta = self.consumer.list_topics(topic, timeout=self._timeout_s).topics.get(topic)
        except KafkaException as exc:
            raise DeadLetterUnavailableError(
                f"cannot read the metadata of {topic!r}: {exc}"
            ) from exc
        if meta is None or meta.error is not None or not meta.partitions:
            raise InvalidInputError(f"topic {topic!r} does not exist", field="topic")
        return sorted(meta.partitions)

    def plan(
        self,
        topics: Iterable[str],
        *,
        since_ms: int | None = None,
        starts: Mapping[tuple[str, int], int] | None = None,
    ) -> list[Range]:
        """The ranges to read: each partition from its first offset (or the first at
        `since_ms`, or a later start given in `starts`) to its high watermark now."""
        ranges: list[Range] = []
        try:
            for topic in topics:
                parts = self.partitions(topic)
                at: dict[int, int] = {}
                if since_ms is not None:
                    wanted = [TopicPartition(topic, p, max(0, since_ms - _SKEW_MS)) for p in parts]
                    for tp in self.consumer.offsets_for_times(wanted, timeout=self._timeout_s):
                        at[tp.partition] = tp.offset  # -1: nothing that recent
                for p in parts:
                    low, high = self.consumer.get_watermark_offsets(
                        TopicPartition(topic, p), timeout=self._timeout_s
                    )
                    start = low
                    if p in at:
                        start = high if at[p] < 0 else max(low, at[p])
                    if starts is not None and (topic, p) in starts:
                        start = max(start, starts[(topic, p)])
                    ranges.append(Range(topic, p, min(start, high), high))
        except KafkaException as exc:
            raise DeadLetterUnavailableError(f"cannot read offsets: {exc}") from exc
        return ranges

    def read(self, ranges: Sequence[Range], *, with_requests: bool = False) -> ReadCursor:
        """Start reading `ranges`; the cursor gives letters in batches, in offset order per
        partition."""
        return ReadCursor(self, [r for r in ranges if r.size > 0], with_requests)

    def fetch(self, topic: str, partition: int, offset: int) -> Letter | None:
        """The letter at one position (its original request decoded), or None when there is none."""
        if partition not in self.partitions(topic):
            return None
        try:
            low, high = self.consumer.get_watermark_offsets(
                TopicPartition(topic, partition), timeout=self._timeout_s
            )
        except KafkaException as exc:
            raise DeadLetterUnavailableError(f"cannot read offsets: {exc}") from exc
        if not low <= offset < high:
            return None
        cursor = self.read([Range(topic, partition, offset, offset + 1)], with_requests=True)
        while not cursor.done:
            for letter in cursor.next_batch():
                if letter.offset == offset:
                    return letter
        return None  # a transaction marker, not a record

    def decode(self, msg: Message, *, with_request: bool) -> Letter:
        ts_type, ts = msg.timestamp()
        position = (str(msg.topic()), int(msg.partition() or 0), int(msg.offset() or 0))
        timestamp = ts if ts_type and ts >= 0 else None
        try:
            envelope = self._envelopes(msg.value())
        except TidegateError as exc:
            if exc.retriable:
                raise
            return Letter(*position, timestamp, None, problem=f"{exc.code}: {exc}")
        request = self.decode_request(envelope.get("original_value")) if with_request else None
        return Letter(*position, timestamp, envelope, request=request)

    def decode_request(self, value: bytes | None) -> dict[str, Any] | None:
        """The original request, or None when its bytes are not a readable request (a poison
        pill's are not, by definition)."""
        try:
            schema_id = unpack(value)[0]
        except TidegateError:
            return None
        if schema_id in self._unreadable_ids:
            return None  # asked once: a poison backlog of one bad id costs one registry call
        try:
            request: dict[str, Any] = self._requests(value)
        except UnknownSchemaError:
            self._unreadable_ids.add(schema_id)
            return None
        except TidegateError as exc:
            if exc.retriable:
                raise
            return None
        return request


class ReadCursor:
    """The progress of one read; `next_batch` blocks for at most about a second."""

    def __init__(self, reader: DeadLetterReader, ranges: list[Range], with_requests: bool) -> None:
        self._reader = reader
        self._with_requests = with_requests
        self.ranges = ranges
        self.total = sum(r.size for r in ranges)
        self._ends = {(r.topic, r.partition): r.end for r in ranges}
        self._idle_s = 0.0
        try:
            reader.consumer.assign([TopicPartition(r.topic, r.partition, r.start) for r in ranges])
        except KafkaException as exc:
            raise DeadLetterUnavailableError(f"cannot assign the partitions: {exc}") from exc

    @property
    def done(self) -> bool:
        return not self._ends

    def next_batch(self, limit: int = _BATCH) -> list[Letter]:
        if self.done:
            return []
        consumer = self._reader.consumer
        try:
            messages = consumer.consume(num_messages=limit, timeout=0.5)
        except KafkaException as exc:
            raise DeadLetterUnavailableError(f"cannot read: {exc}") from exc
        letters: list[Letter] = []
        for msg in messages:
            key = (str(msg.topic()), int(msg.partition() or 0))
            end = self._ends.get(key)
            error = msg.error()
            if end is None:
                continue  # a partition already read to its end
            offset = int(msg.offset() or 0)
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    self._finish(key)  # the end, or the last committed record before it
                    continue
                raise DeadLetterUnavailableError(f"cannot read {key[0]}[{key[1]}]: {error}")
            if offset >= end:
                self._finish(key)
                continue
            letters.append(self._reader.decode(msg, with_request=self._with_requests))
            if offset >= end - 1:
                self._finish(key)
        self._idle_s = 0.0 if messages else self._idle_s + 0.5
        if self._idle_s > self._reader._timeout_s * 3:
            raise DeadLetterUnavailableError(
                f"the read stalled: nothing arrived for {self._idle_s:.0f} s before the end of "
                f"{sorted(self._ends)}"
            )
        return letters

    def _finish(self, key: tuple[str, int]) -> None:
        self._ends.pop(key, None)
        if not self._ends:
            self._reader.consumer.unassign()


async def scan(
    reader: DeadLetterReader,
    topics: Iterable[str],
    letters: LetterFilter,
    *,
    with_requests: bool = False,
) -> AsyncIterator[list[Letter]]:
    """Batches of the letters of `topics` that match, read on a thread."""
    ranges = await asyncio.to_thread(reader.plan, topics, since_ms=letters.since_ms)
    want = with_requests or letters.needs_request
    cursor = await asyncio.to_thread(reader.read, ranges, with_requests=want)
    while not cursor.done:
        batch = await asyncio.to_thread(cursor.next_batch)
        yield [letter for letter in batch if letters.matches(letter)]


async def list_letters(
    kafka: KafkaSettings,
    registry: Registry,
    topics: Iterable[str],
    letters: LetterFilter,
    *,
    limit: int | None = 100,
) -> tuple[list[Letter], bool]:
    """The first `limit` matching letters (None: all), oldest first per partition, and whether
    more matched."""
    found: list[Letter] = []
    with DeadLetterReader(kafka, registry) as reader:
        async for batch in scan(reader, topics, letters, with_requests=True):
            found.extend(batch)
            if limit is not None and len(found) > limit:
                return found[:limit], True
    return found, False


async def letter_stats(
    kafka: KafkaSettings,
    registry: Registry,
    topics: Iterable[str],
    letters: LetterFilter,
) -> LetterStats:
    """Counts of every matching letter, read to the end of each topic."""
    stats = LetterStats()
    with DeadLetterReader(kafka, registry) as reader:
        names = list(topics)
        ranges = await asyncio.to_thread(reader.plan, names, since_ms=letters.since_ms)
        cursor = await asyncio.to_thread(reader.read, ranges, with_requests=True)
        while not cursor.done:
            for letter in await asyncio.to_thread(cursor.next_batch):
                stats.scanned += 1
                if letters.matches(letter):
                    stats.add(letter)
    return stats


async def find_letter(
    kafka: KafkaSettings,
    registry: Registry,
    topic: str,
    partition: int,
    offset: int,
) -> Letter | None:
    with DeadLetterReader(kafka, registry) as reader:
        return await asyncio.to_thread(reader.fetch, topic, partition, offset)
