"""`consume_ready`: wait for the first message only, then collect for the fetch window."""

from __future__ import annotations

from typing import Any

from tidegate.core.kafka import consume_ready


class Recording:
    def __init__(self, first: object | None, rest: list[object]) -> None:
        self.first, self.rest = first, rest
        self.calls: list[tuple[str, Any]] = []

    def poll(self, timeout: float) -> object | None:
        self.calls.append(("poll", timeout))
        return self.first

    def consume(self, num_messages: int, timeout: float) -> list[object]:
        self.calls.append(("consume", (num_messages, timeout)))
        return self.rest[:num_messages]


def test_after_the_first_message_the_window_collects_more() -> None:
    consumer = Recording("m0", ["m1", "m2"])
    assert consume_ready(consumer, 500, 0.1, 0.005) == ["m0", "m1", "m2"]  # type: ignore[arg-type,comparison-overlap]
    assert consumer.calls == [("poll", 0.1), ("consume", (499, 0.005))]


def test_without_a_window_only_what_is_there_is_taken() -> None:
    consumer = Recording("m0", ["m1"])
    assert consume_ready(consumer, 500, 0.1) == ["m0", "m1"]  # type: ignore[arg-type,comparison-overlap]
    assert consumer.calls[-1] == ("consume", (499, 0.0))


def test_a_quiet_topic_waits_only_for_the_poll() -> None:
    consumer = Recording(None, ["never"])
    assert consume_ready(consumer, 500, 0.1, 0.005) == []  # type: ignore[arg-type]
    assert consumer.calls == [("poll", 0.1)], "the window must not add to a quiet topic's wait"


def test_room_for_one_takes_one() -> None:
    consumer = Recording("m0", ["m1"])
    assert consume_ready(consumer, 1, 0.1, 0.005) == ["m0"]  # type: ignore[arg-type,comparison-overlap]
    assert consumer.calls == [("poll", 0.1)]
