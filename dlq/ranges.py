"""Which records of a topic a replay or a backtest reads, as per-partition offset ranges.

An operator names records by offsets (`--offsets 0:100-200,3:50-`), by time (`--from -1h
--to now`) or not at all (the whole retained topic, for request ids and the DLQ). Each becomes a
`ReadPlan`: for every partition a half-open range `[start, end)` of offsets, resolved once
against Kafka when the run starts. The plan is what a checkpoint saves, so a resumed run reads
exactly the range the interrupted one meant, even though the topic has grown since.

Times resolve with `offsets_for_times`: the first offset at or after `--from` up to the first at
or after `--to`; a bound past the newest record is the partition's end as of the start.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from confluent_kafka import TopicPartition

from tidegate.core.errors import ConfigurationError
from tidegate.lifecycle.domain.parse import parse_at

__all__ = [
    "OffsetSpan",
    "PartitionRange",
    "ReadPlan",
    "parse_offsets",
    "parse_time_ms",
    "resolve_offsets",
    "resolve_times",
]

_SPAN = re.compile(r"^(?:(?P<partition>\d+|\*):)?(?P<start>\d*)-(?P<end>\d*)$")
_TIMEOUT_S = 30.0


@dataclass(frozen=True, slots=True)
class OffsetSpan:
    """An operator's offset range: `partition` None means every partition, `start` None the
    oldest retained offset, `end` (exclusive) None the newest as of the start."""

    partition: int | None
    start: int | None
    end: int | None


@dataclass(frozen=True, slots=True)
class PartitionRange:
    partition: int
    start: int
    end: int
    """Exclusive."""

    @property
    def size(self) -> int:
        return max(0, self.end - self.start)


@dataclass(frozen=True, slots=True)
class ReadPlan:
    topic: str
    ranges: tuple[PartitionRange, ...]

    @property
    def total(self) -> int:
        """Offsets in the plan: what a progress bar counts to (filtered records included)."""
        return sum(r.size for r in self.ranges)

    def to_json(self) -> dict[str, Any]:
        return {
            "topic": self.topic,
            "ranges": [
                {"partition": r.partition, "start": r.start, "end": r.end} for r in self.ranges
            ],
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ReadPlan:
        ranges = tuple(
            PartitionRange(int(r["partition"]), int(r["start"]), int(r["end"]))
            for r in data["ranges"]
        )
        return cls(str(data["topic"]), ranges)


class OffsetsClient(Protocol):
    """The part of confluent-kafka's `Consumer` that resolves a plan."""

    def list_topics(self, topic: str | None = ..., timeout: float = ...) -> Any: ...

    def get_watermark_offsets(
        self, partition: TopicPartition, timeout: float = ..., cached: bool = ...
    ) -> tuple[int, int]: ...

    def offsets_for_times(
        self, partitions: list[TopicPartition], timeout: float = ...
    ) -> list[TopicPartition]: ...


def parse_offsets(text: str) -> list[OffsetSpan]:
    """`0:100-200,3:50-` (partition:start-end, end exclusive, either bound may be left out) or
    `100-200` / `*:100-200` for every partition. Raises `ValueError` on anything else."""
    spans: list[OffsetSpan] = []
    seen: set[int | None] = set()
    for part in text.replace(" ", "").split(","):
        if not part:
            continue
        match = _SPAN.match(part)
        if match is None:
            raise ValueError(
                f"offsets are PARTITION:START-END items like 0:100-200,3:50- (END exclusive), "
                f"not {part!r}"
            )
        raw = match.group("partition")
        partition = None if raw in (None, "*") else int(raw)
        start = int(match.group("start")) if match.group("start") else None
        end = int(match.group("end")) if match.group("end") else None
        if start is not None and end is not None and end < start:
            raise ValueError(f"offset range {part!r} ends before it starts")
        if partition in seen:
            raise ValueError(f"partition {raw or '*'} is named twice in {text!r}")
        seen.add(partition)
        spans.append(OffsetSpan(partition, start, end))
    if not spans:
        raise ValueError("no offset range given")
    if None in seen and len(spans) > 1:
        raise ValueError("a range for every partition cannot be combined with per-partition ones")
    return spans


def parse_time_ms(text: str, now: datetime | None = None) -> int:
    """An ISO-8601 instant (naive is UTC), `now`, or a time ago (`-1h`, `-30m`), as epoch ms."""
    return int(parse_at(text, now).timestamp() * 1000)


def _partitions(client: OffsetsClient, topic: str) -> list[int]:
    meta = client.list_topics(topic, timeout=_TIMEOUT_S).topics.get(topic)
    if meta is None or meta.error is not None or not meta.partitions:
        raise ConfigurationError(f"topic {topic!r} does not exist")
    return sorted(meta.partitions)


def _watermarks(client: OffsetsClient, topic: str, partition: int) -> tuple[int, int]:
    low, high = client.get_watermark_offsets(TopicPartition(topic, partition), timeout=_TIMEOUT_S)
    return int(low), int(high)


def resolve_offsets(client: OffsetsClient, topic: str, spans: Sequence[OffsetSpan]) -> ReadPlan:
    """Offset spans clamped to what each partition retains now."""
    partitions = _partitions(client, topic)
    unknown = [
        s.partition for s in spans if s.partition is not None and s.partition not in partitions
    ]
    if unknown:
        raise ConfigurationError(f"topic {topic!r} has no partition {unknown[0]}")
    wanted: Iterable[tuple[int, OffsetSpan]]
    if len(spans) == 1 and spans[0].partition is None:
        wanted = [(p, spans[0]) for p in partitions]
    else:
        wanted = sorted((int(s.partition), s) for s in spans if s.partition is not None)
    ranges = []
    for partition, span in wanted:
        low, high = _watermarks(client, topic, partition)
        start = low if span.start is None else min(max(span.start, low), high)
        end = high if span.end is None else min(max(span.end, start), high)
        ranges.append(PartitionRange(partition, start, end))
    return ReadPlan(topic, tuple(ranges))


def resolve_times(
    client: OffsetsClient, topic: str, from_ms: int | None, to_ms: int | None
) -> ReadPlan:
    """Every partition's records with a timestamp in `[from_ms, to_ms)`; None is unbounded."""
    partitions = _partitions(client, topic)
    marks = {p: _watermarks(client, topic, p) for p in partitions}
    starts = _offsets_at(client, topic, partitions, from_ms, marks, default_low=True)
    ends = _offsets_at(client, topic, partitions, to_ms, marks, default_low=False)
    ranges = tuple(PartitionRange(p, starts[p], max(starts[p], ends[p])) for p in partitions)
    return ReadPlan(topic, ranges)


def _offsets_at(
    client: OffsetsClient,
    topic: str,
    partitions: list[int],
    at_ms: int | None,
    marks: Mapping[int, tuple[int, int]],
    *,
    default_low: bool,
) -> dict[int, int]:
    if at_ms is None:
        return {p: marks[p][0] if default_low else marks[p][1] for p in partitions}
    asked = [TopicPartition(topic, p, at_ms) for p in partitions]
    found = client.offsets_for_times(asked, timeout=_TIMEOUT_S)
    out: dict[int, int] = {}
    for tp in found:
        if tp.error is not None:
            raise ConfigurationError(f"cannot look up {topic}[{tp.partition}] by time: {tp.error}")
        low, high = marks[tp.partition]
        # -1: no record at or after the time, so the range starts (or ends) at the end.
        out[tp.partition] = high if tp.offset < 0 else min(max(tp.offset, low), high)
    return out
