"""`close_within`: a consumer's close that does not return in time is left on its own thread, so
the caller's shutdown (or a prober's next probe) goes on."""

from __future__ import annotations

import logging
import threading
import time

import pytest

from tidegate.core.kafka import close_within


class Closing:
    """A consumer whose close takes `takes_s` (and raises `fails` at its end, if given)."""

    def __init__(self, takes_s: float, fails: Exception | None = None) -> None:
        self.takes_s, self.fails = takes_s, fails
        self.released = threading.Event()
        self.closed = threading.Event()

    def close(self) -> None:
        self.released.wait(self.takes_s)
        self.closed.set()
        if self.fails is not None:
            raise self.fails


def test_a_close_that_returns_in_time_is_waited_for() -> None:
    consumer = Closing(0.05)
    assert close_within(consumer, 5.0, "reader")  # type: ignore[arg-type]
    assert consumer.closed.is_set()


def test_a_close_that_hangs_is_left_behind_after_its_deadline(
    caplog: pytest.LogCaptureFixture,
) -> None:
    consumer = Closing(30.0)
    started = time.monotonic()
    try:
        with caplog.at_level(logging.WARNING, "tidegate.core.kafka"):
            assert not close_within(consumer, 0.2, "reader")  # type: ignore[arg-type]
        assert time.monotonic() - started < 2.0
        assert not consumer.closed.is_set()
        assert "reader did not close within" in caplog.text
    finally:
        consumer.released.set()
    assert consumer.closed.wait(5.0)


def test_a_close_that_fails_is_logged_not_raised() -> None:
    consumer = Closing(0.0, RuntimeError("Consumer closed"))
    assert close_within(consumer, 5.0, "reader")  # type: ignore[arg-type]
