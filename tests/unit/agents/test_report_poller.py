"""Delivery reports served on the loop: soon after a flush, again while any is due, and then
only at the idle pace."""

from __future__ import annotations

import asyncio
from typing import Any

from tests.unit.agents.dataplane_support import until
from tidegate.agents.kafka_io import report_poller
from tidegate.agents.kafka_io.report_poller import ReportPoller


class _Publisher:
    def __init__(self, due: int, fail: Exception | None = None) -> None:
        self.due = due
        self.polls = 0
        self.fail = fail

    def poll(self, timeout: float = 0.0) -> int:
        self.polls += 1
        if self.fail is not None:
            raise self.fail
        served = min(self.due, 1)  # one report arrives per poll here
        self.due -= served
        return served

    def outstanding(self) -> int:
        return self.due


async def test_a_flush_is_polled_until_no_report_is_due_then_only_at_the_idle_pace(
    monkeypatch: Any,
) -> None:
    monkeypatch.setattr(report_poller, "_EVERY_S", 0.001)
    monkeypatch.setattr(report_poller, "_IDLE_S", 10.0)
    publisher = _Publisher(due=3)
    poller = ReportPoller(publisher, asyncio.get_running_loop(), lambda exc: None)  # type: ignore[arg-type]
    poller.start()
    try:
        poller.flushed()
        poller.flushed()  # a second flush before the poll adds no timer
        await until(lambda: publisher.due == 0)
        polls = publisher.polls
        await asyncio.sleep(0.05)
        assert polls == 3
        assert publisher.polls == polls, "polled again with no report due"
    finally:
        poller.stop()


async def test_a_report_callback_that_fails_fails_the_worker() -> None:
    failures: list[BaseException] = []
    publisher = _Publisher(due=1, fail=RuntimeError("callback"))
    poller = ReportPoller(publisher, asyncio.get_running_loop(), failures.append)  # type: ignore[arg-type]
    try:
        poller.flushed()
        await until(lambda: bool(failures))
        assert isinstance(failures[0], RuntimeError)
    finally:
        poller.stop()
