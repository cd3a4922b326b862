"""`consume_ready`: wait for the first message only, take what is there, and collect for the
fetch window only while messages arrive faster than they are read."""

from __future__ import annotations

from typing import Any

import pytest

from tidegate.core.kafka import consume_ready


class Recording:
    """A consumer whose queue holds `ready` now; `later` arrives during a consume's wait."""

    def __init__(self, first: str | None, ready: list[str], later: list[str] | None = None) -> None:
        self.first, self.ready, self.later = first, ready, later or []
        self.calls: list[tuple[str, Any]] = []

    def poll(self, timeout: float) -> str | None:
        self.calls.append(("poll", timeout))
        return self.first

    def consume(self, num_messages: int, timeout: float) -> list[str]:
        self.calls.append(("consume", (num_messages, timeout)))
        if timeout > 0:
            self.ready += self.later
            self.later = []
        taken, self.ready = self.ready[:num_messages], self.ready[num_messages:]
        return taken


def take(consumer: Recording, room: int, window: float = 0.0) -> list[str]:
    return consume_ready(consumer, room, 0.1, window)  # type: ignore[arg-type,return-value]


def test_under_load_the_window_collects_more() -> None:
    consumer = Recording("m0", ["m1"], later=["m2", "m3"])
    assert take(consumer, 500, 0.005) == ["m0", "m1", "m2", "m3"]
    assert consumer.calls == [("poll", 0.1), ("consume", (499, 0)), ("consume", (498, 0.005))]


def test_a_lone_message_goes_at_once() -> None:
    consumer = Recording("m0", [], later=["m1"])
    assert take(consumer, 500, 0.005) == ["m0"], "a quiet topic paid the window"
    assert consumer.calls == [("poll", 0.1), ("consume", (499, 0))]


def test_without_a_window_only_what_is_there_is_taken() -> None:
    consumer = Recording("m0", ["m1"], later=["m2"])
    assert take(consumer, 500) == ["m0", "m1"]
    assert consumer.calls[-1] == ("consume", (499, 0))


def test_a_quiet_topic_waits_only_for_the_poll() -> None:
    consumer = Recording(None, ["never"])
    assert take(consumer, 500, 0.005) == []
    assert consumer.calls == [("poll", 0.1)]


def test_the_room_is_never_exceeded() -> None:
    consumer = Recording("m0", ["m1", "m2"], later=["m3"])
    assert take(consumer, 3, 0.005) == ["m0", "m1", "m2"]
    assert take(Recording("m0", ["m1"]), 1, 0.005) == ["m0"]


class Arriving:
    """A consumer to which each timed consume brings the next chunk of `chunks`."""

    def __init__(self, ready: list[str], chunks: list[list[str]]) -> None:
        self.ready, self.chunks = ready, chunks
        self.waits: list[float] = []

    def poll(self, timeout: float) -> str:
        return "m0"

    def consume(self, num_messages: int, timeout: float) -> list[str]:
        if timeout == 0:
            taken, self.ready = self.ready, []
            return taken
        self.waits.append(timeout)
        return (self.chunks.pop(0) if self.chunks else [])[:num_messages]


def idle_take(consumer: Arriving, room: int = 500) -> list[str]:
    return consume_ready(consumer, room, 0.1, 0.010, 0.002)  # type: ignore[arg-type,return-value]


def test_a_burst_goes_after_the_idle_slice_not_the_whole_window() -> None:
    consumer = Arriving(["m1", "m2"], [])
    assert idle_take(consumer) == ["m0", "m1", "m2"]
    assert consumer.waits == [0.002], "a burst waited out the window"


def test_a_stream_still_arriving_gets_the_rest_of_the_window() -> None:
    consumer = Arriving(["m1"], [["m2"], ["m3", "m4"], ["m5"]])
    assert idle_take(consumer) == ["m0", "m1", "m2", "m3", "m4"]
    assert consumer.waits == pytest.approx([0.002, 0.008]), "the window is 10 ms in all"


def test_the_idle_slice_keeps_to_the_room() -> None:
    consumer = Arriving(["m1"], [["m2", "m3", "m4"]])
    assert idle_take(consumer, 3) == ["m0", "m1", "m2"]
    assert consumer.waits == [0.002], "a full batch waited for more"


def test_an_idle_at_or_past_the_window_leaves_the_window_whole() -> None:
    for idle in (0.010, 0.050):
        consumer = Arriving(["m1"], [["m2"]])
        taken: list[str] = consume_ready(consumer, 500, 0.1, 0.010, idle)  # type: ignore[arg-type,assignment]
        assert taken == ["m0", "m1", "m2"]
        assert consumer.waits == [0.010], f"idle {idle}: the window was not one whole wait"
