"""The offset tracker, whatever order deliveries complete in: the committable position never
passes an offset whose outputs are not all acknowledged, it never moves back, and once everything
is delivered it is one past the last offset consumed (property tests)."""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import given
from hypothesis import strategies as st

from tidegate.agents.kafka_io.offsets import OffsetTracker


@dataclass
class Partition:
    """What a partition consumed: offsets in order (gaps where transaction markers or compaction
    left them) and how many messages each offset's outputs are."""

    offsets: list[int]
    outputs: dict[int, int]


@st.composite
def partitions(draw: st.DrawFn) -> Partition:
    first = draw(st.integers(0, 10**12))
    gaps = draw(st.lists(st.integers(1, 3), min_size=1, max_size=25))
    offsets = [first + sum(gaps[:i]) for i in range(len(gaps))]
    outputs = {o: draw(st.integers(0, 3)) for o in offsets}
    return Partition(offsets, outputs)


@st.composite
def runs(draw: st.DrawFn) -> tuple[Partition, list[int]]:
    """A partition and the order its tokens are released in: each offset once for its
    processing, then once per acknowledgement of its outputs, interleaved in any order."""
    partition = draw(partitions())
    tokens = [o for o in partition.offsets for _ in range(1 + partition.outputs[o])]
    return partition, draw(st.permutations(tokens))


@given(runs())
def test_the_position_never_passes_an_undelivered_offset(run: tuple[Partition, list[int]]) -> None:
    partition, releases = run
    tracker = OffsetTracker()
    consumed = 0
    left = {o: 1 + n for o, n in partition.outputs.items()}
    finished: set[int] = set()
    positions: list[int] = []
    for offset in releases:
        # Consumed in order, and before anything of it can finish.
        while consumed < len(partition.offsets) and partition.offsets[consumed] <= offset:
            tracker.consumed(partition.offsets[consumed])
            consumed += 1
        if offset not in finished:
            # Its processing ends: the outputs are produced, each awaiting an acknowledgement.
            finished.add(offset)
            tracker.expect(offset, partition.outputs[offset])
        tracker.done(offset)
        left[offset] -= 1

        position = tracker.position
        committable = tracker.committable()
        if position is None:
            assert committable is None
            continue
        undelivered = [o for o in partition.offsets if left[o] > 0]
        assert all(position <= o for o in undelivered), (position, undelivered)
        assert not positions or position >= positions[-1], "the position moved back"
        # Offered for commit exactly when it moved.
        assert committable == (position if not positions or position != positions[-1] else None)
        positions.append(position)
    assert tracker.position == partition.offsets[-1] + 1
    assert tracker.in_flight == 0


@given(runs())
def test_the_position_is_the_end_of_the_longest_delivered_prefix(
    run: tuple[Partition, list[int]],
) -> None:
    partition, releases = run
    tracker = OffsetTracker()
    for offset in partition.offsets:
        tracker.consumed(offset)
    left = {o: 1 + n for o, n in partition.outputs.items()}
    finished: set[int] = set()
    for offset in releases:
        if offset not in finished:
            finished.add(offset)
            tracker.expect(offset, partition.outputs[offset])
        tracker.done(offset)
        left[offset] -= 1
        prefix = 0
        while prefix < len(partition.offsets) and left[partition.offsets[prefix]] == 0:
            prefix += 1
        expected = partition.offsets[prefix - 1] + 1 if prefix else None
        assert tracker.position == expected
        assert tracker.in_flight == len(partition.offsets) - prefix
