"""`consume_ready`: wait for the first message only, take what is there, and collect for the
fetch window only while messages arrive faster than they are read."""

from __future__ import annotations

import time
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


class Slow(Recording):
    """A consumer whose first message arrives `after` seconds into the poll."""

    def __init__(self, after: float, ready: list[str], later: list[str]) -> None:
        super().__init__("m0", ready, later)
        self.after = after

    def poll(self, timeout: float) -> str | None:
        time.sleep(self.after)
        return super().poll(timeout)


def since_take(consumer: Recording, since: float) -> list[str]:
    return consume_ready(consumer, 500, 0.1, 0.010, since=since)  # type: ignore[arg-type,return-value]


def window_waited(consumer: Recording) -> float | None:
    waits = [args[1] for call, args in consumer.calls if call == "consume" and args[1] > 0]
    return waits[0] if waits else None


def test_a_queued_message_waits_the_window_from_the_last_batch_not_from_the_poll() -> None:
    consumer = Recording("m0", ["m1"], later=["m2"])
    assert since_take(consumer, time.monotonic() - 0.004) == ["m0", "m1", "m2"]
    waited = window_waited(consumer)
    assert waited is not None
    assert waited <= 0.0065, f"the window ran {waited * 1000:.1f} ms after 4 ms already waited"


def test_a_caller_busy_past_the_window_takes_what_is_queued_at_once() -> None:
    consumer = Recording("m0", ["m1"], later=["m2"])
    assert since_take(consumer, time.monotonic() - 0.020) == ["m0", "m1"]
    assert window_waited(consumer) is None, "a message that waited 20 ms waited for more"


def test_a_message_the_poll_waited_for_gets_the_whole_window() -> None:
    # It arrived during the poll, so it has waited for nothing before it.
    consumer = Slow(0.005, ["m1"], later=["m2"])
    assert since_take(consumer, time.monotonic() - 0.050) == ["m0", "m1", "m2"]
    assert window_waited(consumer) == pytest.approx(0.010)
