"""Reading the audit trail back: `tidegate audit` and the tests that check what was recorded.

Like the dead-letter inspection tools, the reader never joins a consumer group and never commits:
its consumer is `assign`ed explicit offsets and the group id is a throwaway, so reading the audit
trail leaves no trace in Kafka and any number of operators can read it at once.

A read is a snapshot: each partition from the first offset at `since` (by `offsets_for_times`;
the writer stamps every message with its entry's `at`) up to the first offset past `until` (a
minute later, so an entry from a replica whose clock is behind is not cut off) or the high
watermark the partition had when the read began. Entries are then filtered on their own fields,
so the time bounds are exact. `follow` goes on past the snapshot's end, for `--follow`.

The topic has one partition in the stack layout, so entries come in the order they were written.
With more partitions, a read merges them by `at`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from types import TracebackType
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition

from tidegate.core.errors import InvalidInputError, RetriableError, TidegateError
from tidegate.core.kafka import make_reader
from tidegate.core.settings import KafkaSettings, SchemaRegistrySettings, TopicSettings
from tidegate.schemas.catalog import AUDIT_EVENT, load_schema
from tidegate.schemas.codec import AvroDecoder, Registry, registry_client

__all__ = ["AuditFilter", "AuditReader", "AuditUnavailableError"]

_UNTIL_SLACK = timedelta(minutes=1)
_POLL_S = 0.2


class AuditUnavailableError(RetriableError):
    """Kafka could not be read: unreachable, or a read stalled before its end."""

    code = "AUDIT_UNAVAILABLE"


@dataclass(frozen=True)
class AuditFilter:
    """Which entries to keep. `action` is a prefix (`keys.` matches every key change); the
    others match exactly; `since` is inclusive and `until` exclusive."""

    since: datetime | None = None
    until: datetime | None = None
    actor: str | None = None
    action: str | None = None
    outcome: str | None = None
    target: str | None = None

    def __post_init__(self) -> None:
        if self.since is not None and self.until is not None and self.until <= self.since:
            raise InvalidInputError("until must be later than since", field="until")

    def matches(self, event: Mapping[str, Any]) -> bool:
        at: datetime = event["at"]
        return (
            (self.since is None or at >= self.since)
            and (self.until is None or at < self.until)
            and (self.actor is None or event["actor"] == self.actor)
            and (self.action is None or str(event["action"]).startswith(self.action))
            and (self.outcome is None or event["outcome"] == self.outcome)
            and (self.target is None or event.get("target") == self.target)
        )


def _ms(moment: datetime) -> int:
    return int(moment.timestamp() * 1000)


class AuditReader:
    """A blocking reader of the audit topic. Use it as a context manager, or `close()` it."""

    def __init__(
        self,
        kafka: KafkaSettings | None = None,
        topics: TopicSettings | None = None,
        registry: Registry | None = None,
        *,
        timeout_s: float = 10.0,
    ) -> None:
        self.topic = (topics or TopicSettings()).audit
        client = registry_client(registry or SchemaRegistrySettings())
        self._decoder = AvroDecoder(client, load_schema(AUDIT_EVENT))
        self._timeout_s = timeout_s
        self.skipped = 0
        """Messages that were not audit entries (undecodable): counted, never fatal."""
        try:
            self._consumer: Consumer = make_reader(kafka or KafkaSettings(), "audit-read")
        except KafkaException as exc:
            raise AuditUnavailableError(f"cannot create a Kafka consumer: {exc}") from exc

    def close(self) -> None:
        self._consumer.close()

    def __enter__(self) -> AuditReader:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def read(
        self, where: AuditFilter | None = None, *, limit: int | None = None
    ) -> list[dict[str, Any]]:
        """The matching entries of the snapshot, oldest first; with `limit`, the newest `limit`."""
        return self._snapshot(where or AuditFilter(), limit, None)

    def follow(
        self,
        where: AuditFilter | None = None,
        *,
        limit: int | None = None,
        stop: threading.Event | None = None,
    ) -> Iterator[dict[str, Any]]:
        """What `read` gives, then each new matching entry as it is written, until `stop` is set."""
        where = where or AuditFilter()
        # Entries past a partition's snapshot end, read while another partition was still
        # being drained: they belong to what follows.
        later: list[dict[str, Any]] = []
        yield from self._snapshot(where, limit, later)
        yield from (event for event in later if where.matches(event))
        stop = stop or threading.Event()
        while not stop.is_set():
            event = self._decode(self._consumer.poll(_POLL_S))
            if event is not None and where.matches(event):
                yield event

    def _snapshot(
        self, where: AuditFilter, limit: int | None, later: list[dict[str, Any]] | None
    ) -> list[dict[str, Any]]:
        ranges = self._plan(where)
        found = [event for event in self._drain(ranges, later) if where.matches(event)]
        if len(ranges) > 1:
            found.sort(key=lambda event: event["at"])  # one partition keeps its write order
        return found[-limit:] if limit is not None and limit > 0 else found

    def _partitions(self) -> list[int]:
        try:
            meta = self._consumer.list_topics(self.topic, timeout=self._timeout_s)
        except KafkaException as exc:
            raise AuditUnavailableError(
                f"cannot read the metadata of {self.topic!r}: {exc}"
            ) from exc
        found = meta.topics.get(self.topic)
        if found is None or found.error is not None or not found.partitions:
            raise InvalidInputError(f"audit topic {self.topic!r} does not exist", field="topic")
        return sorted(found.partitions)

    def _offsets_at(self, parts: list[int], moment: datetime) -> dict[int, int]:
        """Per partition, the first offset stamped at or after `moment`; -1 where none is."""
        asked = [TopicPartition(self.topic, p, _ms(moment)) for p in parts]
        found = self._consumer.offsets_for_times(asked, timeout=self._timeout_s)
        return {tp.partition: tp.offset for tp in found}

    def _plan(self, where: AuditFilter) -> dict[int, tuple[int, int]]:
        """Partition -> [start, end) to read, and the consumer assigned to the starts."""
        parts = self._partitions()
        try:
            starts = self._offsets_at(parts, where.since) if where.since is not None else {}
            ends = (
                self._offsets_at(parts, where.until + _UNTIL_SLACK)
                if where.until is not None
                else {}
            )
            ranges: dict[int, tuple[int, int]] = {}
            for p in parts:
                low, high = self._consumer.get_watermark_offsets(
                    TopicPartition(self.topic, p), timeout=self._timeout_s
                )
                start = starts.get(p, low)
                start = high if start < 0 else max(low, start)
                end = ends.get(p, high)
                end = high if end < 0 else min(high, end)
                ranges[p] = (start, max(start, end))
            self._consumer.assign(
                [TopicPartition(self.topic, p, start) for p, (start, _) in ranges.items()]
            )
        except KafkaException as exc:
            raise AuditUnavailableError(f"cannot read offsets of {self.topic!r}: {exc}") from exc
        return ranges

    def _drain(
        self, ranges: Mapping[int, tuple[int, int]], later: list[dict[str, Any]] | None = None
    ) -> Iterator[dict[str, Any]]:
        """Every entry of `ranges`, in offset order per partition; entries past a range's end go
        to `later` when given. A read that stalls for the timeout raises."""
        left = {p: end for p, (start, end) in ranges.items() if end > start}
        deadline = time.monotonic() + self._timeout_s
        while left:
            if time.monotonic() > deadline:
                raise AuditUnavailableError(f"reading {self.topic!r} stalled before its end")
            msg = self._consumer.poll(_POLL_S)
            if msg is None:
                continue
            deadline = time.monotonic() + self._timeout_s
            partition, offset = msg.partition(), msg.offset()
            if partition is None or offset is None:
                continue
            end = left.get(partition)
            if end is None or offset >= end:
                if end is not None:
                    del left[partition]
                beyond = self._decode(msg)
                if beyond is not None and later is not None:
                    later.append(beyond)
                continue
            if offset + 1 >= end:
                del left[partition]
            event = self._decode(msg)
            if event is not None:
                yield event

    def _decode(self, msg: Message | None) -> dict[str, Any] | None:
        if msg is None:
            return None
        err = msg.error()
        if err is not None:
            if err.code() == KafkaError._PARTITION_EOF:
                return None
            raise AuditUnavailableError(f"cannot read {self.topic!r}: {err.str()}")
        try:
            event = self._decoder(msg.value())
        except TidegateError:
            self.skipped += 1
            return None
        return dict(event)
