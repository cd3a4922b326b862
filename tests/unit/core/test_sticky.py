"""Sticky partitions: one partition per window, every partition in turn."""

from __future__ import annotations

from tidegate.core.sticky import StickyPartitions


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_one_partition_within_a_window_then_the_next() -> None:
    clock = Clock()
    sticky = StickyPartitions(0.01, clock)
    first = sticky.pick("t", 8)
    assert all(sticky.pick("t", 8) == first for _ in range(50))
    clock.now += 0.011
    second = sticky.pick("t", 8)
    assert second == (first + 1) % 8
    assert sticky.pick("t", 8) == second


def test_every_partition_in_turn_and_topics_apart() -> None:
    clock = Clock()
    sticky = StickyPartitions(0.01, clock)
    seen = []
    for _ in range(8):
        seen.append(sticky.pick("t", 8))
        assert sticky.pick("other", 3) in range(3)
        clock.now += 0.02
    assert sorted(seen) == list(range(8))


def test_a_shrunk_count_is_never_exceeded() -> None:
    clock = Clock()
    sticky = StickyPartitions(10.0, clock)
    sticky.pick("t", 1000)
    assert all(sticky.pick("t", 2) in (0, 1) for _ in range(5))
