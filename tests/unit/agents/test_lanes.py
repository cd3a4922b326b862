"""The lane gate: real-time batches never wait; batch-lane ones wait while real-time is busy,
but never past their share, so the batch lane is never starved."""

from __future__ import annotations

import asyncio
import math

import pytest

from tests.unit.virtual_time import in_virtual_time
from tidegate.agents.kafka_io.lanes import BusyShare, LaneGate


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_busy_share_is_the_decaying_fraction_of_busy_time() -> None:
    clock = Clock()
    busy = BusyShare(1.0, clock)
    assert busy.share == 0.0
    busy.begin()
    clock.now += 1.0
    assert busy.share == pytest.approx(1 - math.exp(-1))
    busy.end()
    clock.now += 1.0
    assert busy.share == pytest.approx((1 - math.exp(-1)) * math.exp(-1))
    # How long until it decays below a share, and that it does then.
    wait = busy.falls_below_in(0.05)
    clock.now += wait
    assert busy.share == pytest.approx(0.05)
    assert busy.falls_below_in(0.06) == 0.0
    busy.begin()
    assert busy.falls_below_in(0.01) == math.inf  # while it runs, it only grows


async def test_a_batch_waits_while_realtime_runs_and_its_share_is_spent() -> None:
    clock = Clock()
    gate = LaneGate(0.1, window_s=1.0, idle_after_s=0.05, clock=clock)
    async with gate.batch():  # alone: at once
        clock.now += 0.5
    started = asyncio.Event()

    async def batch() -> None:
        async with gate.batch():
            started.set()

    async with gate.realtime():
        async with gate.realtime():  # real-time batches never wait, not even for each other
            waiter = asyncio.create_task(batch())
            await asyncio.sleep(0.01)
            assert not started.is_set()  # share about 0.39, above 0.1
        clock.now += 10.0  # the share decays below 0.1 while real-time still runs
        await asyncio.wait_for(started.wait(), 2.0)
    await waiter


async def test_a_batch_starts_once_realtime_has_been_idle_a_while() -> None:
    clock = Clock()
    gate = LaneGate(0.1, window_s=1.0, idle_after_s=0.05, clock=clock)
    async with gate.batch():
        clock.now += 0.5  # the share is spent
    async with gate.realtime():
        pass
    started = asyncio.Event()

    async def batch() -> None:
        async with gate.batch():
            started.set()

    waiter = asyncio.create_task(batch())
    await asyncio.sleep(0.01)
    assert not started.is_set()  # real-time ended just now: a gap, not idleness
    clock.now += 0.06
    await asyncio.wait_for(started.wait(), 2.0)  # woken by its own timer, 0.05 s at most
    await waiter


def test_under_continuous_realtime_load_batch_still_gets_its_share() -> None:
    async def share_of_batch() -> float:
        loop = asyncio.get_running_loop()
        gate = LaneGate(0.2, window_s=0.2, idle_after_s=0.05, clock=loop.time)
        stop = asyncio.Event()
        batch_busy = 0.0

        async def realtime() -> None:
            # Two overlapping streams of 5 ms batches: the real-time lane is never idle.
            while not stop.is_set():
                async with gate.realtime():
                    await asyncio.sleep(0.005)

        async def batch() -> None:
            nonlocal batch_busy
            while not stop.is_set():
                async with gate.batch():
                    started = loop.time()
                    await asyncio.sleep(0.01)
                    batch_busy += loop.time() - started

        tasks = [asyncio.create_task(realtime()), asyncio.create_task(realtime())]
        await asyncio.sleep(0.002)
        tasks.append(asyncio.create_task(batch()))
        began = loop.time()
        await asyncio.sleep(5.0)
        stop.set()
        await asyncio.gather(*tasks)
        return batch_busy / (loop.time() - began)

    # On the virtual clock the run is the same on any machine: neither starved nor unbounded,
    # its share (plus the batches that started just before the share was spent).
    assert in_virtual_time(share_of_batch()) == pytest.approx(0.2, abs=0.04)


def test_a_lone_batch_lane_runs_flat_out() -> None:
    async def twenty_batches() -> tuple[float, float]:
        loop = asyncio.get_running_loop()
        gate = LaneGate(0.1, window_s=1.0, idle_after_s=0.05, clock=loop.time)
        began = loop.time()
        for _ in range(20):
            async with gate.batch():
                await asyncio.sleep(0.005)
        return loop.time() - began, gate.batch_share_now

    took, share = in_virtual_time(twenty_batches())
    assert took == pytest.approx(20 * 0.005, abs=0.001)  # no real-time traffic: never held
    assert share > 0.05


def test_the_share_must_be_positive() -> None:
    with pytest.raises(ValueError, match="batch_share"):
        LaneGate(0.0)
