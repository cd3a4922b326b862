"""`cancel_and_wait` stops tasks that lose a cancellation (the Python 3.11 `wait_for` race)."""

from __future__ import annotations

import asyncio
import logging

import pytest

from tests.support import wait_for
from tidegate.core import aio
from tidegate.core.aio import LoopWatchdog, Periodic, cancel_and_wait
from tidegate.core.errors import LifecycleUnavailableError


async def _swallows_first_cancel(swallowed: asyncio.Event) -> None:
    try:
        await asyncio.sleep(60)
    except asyncio.CancelledError:
        swallowed.set()  # what a lost cancellation looks like from outside: the task goes on
    await asyncio.sleep(60)


async def test_a_task_that_swallowed_a_cancellation_is_cancelled_again() -> None:
    swallowed = asyncio.Event()
    task = asyncio.create_task(_swallows_first_cancel(swallowed))
    await asyncio.sleep(0)
    await asyncio.wait_for(cancel_and_wait([task], recancel_s=0.05), 5)
    assert swallowed.is_set()
    assert task.cancelled()


async def test_a_single_cancel_would_leave_that_task_running() -> None:
    swallowed = asyncio.Event()
    task = asyncio.create_task(_swallows_first_cancel(swallowed))
    await asyncio.sleep(0)
    task.cancel()
    done, _ = await asyncio.wait({task}, timeout=0.2)
    assert not done
    assert swallowed.is_set()
    await cancel_and_wait([task], recancel_s=0.05)


async def test_finished_and_failed_tasks_are_collected_without_raising() -> None:
    async def fail() -> None:
        raise RuntimeError("boom")

    failed = asyncio.create_task(fail())
    finished = asyncio.create_task(asyncio.sleep(0))
    await asyncio.wait({failed, finished})
    await cancel_and_wait([failed, finished])
    assert isinstance(failed.exception(), RuntimeError)


async def test_recancel_interval_must_be_positive() -> None:
    with pytest.raises(ValueError, match="recancel_s"):
        await cancel_and_wait([], recancel_s=0)


async def test_a_task_that_had_failed_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    async def fail() -> None:
        raise RuntimeError("the relay loop died")

    task = asyncio.create_task(fail(), name="outbox-relay")
    await asyncio.wait({task})
    with caplog.at_level(logging.WARNING, logger="tidegate.core.aio"):
        await cancel_and_wait([task])
    assert "outbox-relay had failed" in caplog.text
    assert "the relay loop died" in caplog.text


async def test_a_task_slow_to_stop_is_logged_each_round(caplog: pytest.LogCaptureFixture) -> None:
    swallowed = asyncio.Event()
    task = asyncio.create_task(_swallows_first_cancel(swallowed), name="stubborn")
    await asyncio.sleep(0)
    with caplog.at_level(logging.WARNING, logger="tidegate.core.aio"):
        await cancel_and_wait([task], recancel_s=0.05)
    assert "stubborn still running" in caplog.text


async def test_periodic_steps_go_on_after_failures(caplog: pytest.LogCaptureFixture) -> None:
    calls: list[int] = []
    third = asyncio.Event()

    async def step() -> None:
        calls.append(len(calls))
        if len(calls) == 3:
            third.set()
        if len(calls) == 1:
            raise LifecycleUnavailableError("the database is away")
        if len(calls) == 2:
            raise RuntimeError("a bug")

    periodic = Periodic(step, 0.01, name="ticker")
    with caplog.at_level(logging.WARNING, logger="tidegate.core.aio"):
        periodic.start()
        await asyncio.wait_for(third.wait(), 5)
        await periodic.stop()
    assert "ticker: the database is away" in caplog.text
    assert "ticker failed" in caplog.text
    with pytest.raises(ValueError, match="every_s"):
        Periodic(step, 0, name="never")


class SteppedClock:
    """`time` as the watchdog's module sees it: its clock moves only when the test moves it, so
    a machine too loaded to run the loop for a while cannot pass for a stall."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


async def test_the_watchdog_reports_a_loop_that_stopped_running(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = SteppedClock()
    monkeypatch.setattr(aio, "time", clock)
    stalls: list[float] = []
    watchdog = LoopWatchdog(0.2, stalls.append)  # both sides look every 0.05 s
    watchdog.start()
    # 0.8 s of the loop running, 0.04 s at a time, each step longer than a heartbeat's period.
    for _ in range(20):
        clock.now += 0.04
        await asyncio.sleep(0.06)
    assert stalls == []  # a loop that runs is never reported
    clock.now += 0.6
    # The loop stays blocked (this wait sleeps on it) until the watchdog's thread reports.
    wait_for(lambda: stalls, timeout=30, interval=0.01, what="the stall reported")
    await watchdog.stop()
    assert len(stalls) == 1
    assert 0.6 <= stalls[0] <= 0.6 + 2 * 0.04
