"""Range parsing and resolving: what an operator's `--offsets`, `--from` and `--to` read."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import pytest
from confluent_kafka import TopicPartition

from tidegate.core.errors import ConfigurationError
from tidegate.dlq.ranges import (
    OffsetSpan,
    PartitionRange,
    ReadPlan,
    parse_offsets,
    parse_time_ms,
    resolve_offsets,
    resolve_times,
)

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
NOW_MS = int(NOW.timestamp() * 1000)


def test_offsets_name_partitions_and_half_open_bounds() -> None:
    assert parse_offsets("0:100-200, 3:50-") == [
        OffsetSpan(0, 100, 200),
        OffsetSpan(3, 50, None),
    ]
    assert parse_offsets("-10") == [OffsetSpan(None, None, 10)]
    assert parse_offsets("*:5-7") == [OffsetSpan(None, 5, 7)]


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("", "no offset range"),
        ("0:100", "PARTITION:START-END"),
        ("a:1-2", "PARTITION:START-END"),
        ("0:200-100", "ends before it starts"),
        ("0:1-2,0:3-4", "named twice"),
        ("1-2,0:3-4", "cannot be combined"),
    ],
)
def test_malformed_offsets_are_refused_with_the_reason(text: str, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        parse_offsets(text)


def test_times_are_iso_or_relative_and_naive_means_utc() -> None:
    assert parse_time_ms("now", NOW) == NOW_MS
    assert parse_time_ms("-1h", NOW) == NOW_MS - 3_600_000
    assert parse_time_ms("-30m", NOW) == NOW_MS - 1_800_000
    assert parse_time_ms("2026-12-01T11:00:00", NOW) == NOW_MS - 3_600_000
    assert parse_time_ms("2026-12-01T12:00:00+01:00", NOW) == NOW_MS - 3_600_000
    with pytest.raises(ValueError, match="ISO-8601"):
        parse_time_ms("yesterday", NOW)


@dataclass
class _Meta:
    partitions: dict[int, Any]
    error: Any = None


@dataclass
class FakeOffsets:
    """A topic whose partition p holds offsets [low, high), record i written at `times[p][i]`."""

    marks: dict[int, tuple[int, int]]
    times: dict[int, list[int]] = field(default_factory=dict)
    topic: str = "requests"

    def list_topics(self, topic: str | None = None, timeout: float = -1) -> Any:
        @dataclass
        class Topics:
            topics: dict[str, _Meta]

        return Topics({self.topic: _Meta({p: object() for p in self.marks})})

    def get_watermark_offsets(
        self, partition: TopicPartition, timeout: float = -1, cached: bool = False
    ) -> tuple[int, int]:
        return self.marks[partition.partition]

    def offsets_for_times(
        self, partitions: list[TopicPartition], timeout: float = -1
    ) -> list[TopicPartition]:
        out = []
        for tp in partitions:
            low, _ = self.marks[tp.partition]
            found = [i for i, t in enumerate(self.times[tp.partition]) if t >= tp.offset]
            out.append(TopicPartition(tp.topic, tp.partition, low + found[0] if found else -1))
        return out


def test_offset_spans_are_clamped_to_what_each_partition_retains() -> None:
    client = FakeOffsets({0: (10, 50), 1: (0, 5)})
    plan = resolve_offsets(client, "requests", parse_offsets("0:0-20,1:3-"))
    assert plan.ranges == (PartitionRange(0, 10, 20), PartitionRange(1, 3, 5))
    every = resolve_offsets(client, "requests", parse_offsets("40-100"))
    assert every.ranges == (PartitionRange(0, 40, 50), PartitionRange(1, 5, 5))
    assert every.total == 10
    with pytest.raises(ConfigurationError, match="no partition 7"):
        resolve_offsets(client, "requests", parse_offsets("7:1-2"))
    with pytest.raises(ConfigurationError, match="does not exist"):
        resolve_offsets(client, "other", parse_offsets("1-2"))


def test_a_time_range_is_the_first_offset_at_or_after_each_bound() -> None:
    client = FakeOffsets(
        {0: (100, 104), 1: (0, 2)},
        {0: [1_000, 2_000, 3_000, 4_000], 1: [500, 600]},
    )
    plan = resolve_times(client, "requests", 2_000, 4_000)
    # Partition 1 has nothing at or after 2000: an empty range at its end.
    assert plan.ranges == (PartitionRange(0, 101, 103), PartitionRange(1, 2, 2))
    open_end = resolve_times(client, "requests", 1_500, None)
    assert open_end.ranges == (PartitionRange(0, 101, 104), PartitionRange(1, 2, 2))
    everything = resolve_times(client, "requests", None, None)
    assert everything.ranges == (PartitionRange(0, 100, 104), PartitionRange(1, 0, 2))


def test_a_plan_survives_its_json_round_trip() -> None:
    plan = ReadPlan("t", (PartitionRange(0, 1, 5), PartitionRange(3, 7, 7)))
    assert ReadPlan.from_json(plan.to_json()) == plan
