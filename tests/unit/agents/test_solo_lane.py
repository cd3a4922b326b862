"""The solo lane after a crash: suspects run alone, in order, and nothing overtakes them."""

from __future__ import annotations

import asyncio
from typing import Any

from tidegate.agents.kafka_io.crash_guard import PartitionGuard
from tidegate.agents.kafka_io.solo_lane import ComputeGate, SoloLane


class Msg:
    def __init__(self, offset: int, partition: int = 0) -> None:
        self._offset, self._partition = offset, partition

    def partition(self) -> int:
        return self._partition

    def offset(self) -> int:
        return self._offset


class Guard:
    """The crash guard's side the lane uses; `solo` blocks until released."""

    def __init__(self, suspect_hi: int) -> None:
        self.partitions = {0: PartitionGuard(suspect_hi=suspect_hi)}
        self.marks: list[int] = []
        self.release = asyncio.Event()
        self.marked = asyncio.Event()
        self.range_passed = asyncio.Event()

    async def solo(self, partition: int, offset: int) -> None:
        self.marks.append(offset)
        self.marked.set()
        await self.release.wait()

    async def passed(self, partition: int) -> None:
        self.partitions[partition].suspect_hi = None
        self.range_passed.set()


class Pipeline:
    closed = False

    def __init__(self) -> None:
        self.accepted: list[int] = []

    def accept(self, msg: Msg) -> None:
        self.accepted.append(msg.offset())


async def test_the_last_suspect_in_hand_keeps_later_messages_behind_it() -> None:
    guard = Guard(suspect_hi=12)
    pipeline = Pipeline()

    async def compute(*_: Any) -> list[Any]:
        return []

    lane = SoloLane(
        guard,  # type: ignore[arg-type]
        {0: pipeline},  # type: ignore[dict-item]
        compute,
        lambda *_: None,
        lambda *_: None,
    )
    task = lane.start()
    lane.put(Msg(12))  # type: ignore[arg-type]
    await asyncio.wait_for(guard.marked.wait(), 5)
    assert guard.marks == [12]
    # 12 is in hand (its mark being written): 13 must queue behind it, not take the batch path.
    assert lane.takes(0, 13)
    guard.release.set()
    await asyncio.wait_for(guard.range_passed.wait(), 5)
    assert pipeline.accepted == [12]
    assert not lane.takes(0, 13)  # passed: an ordinary partition again
    await lane.stop()
    assert task.done()


async def test_a_suspect_waits_for_running_batches_and_holds_new_ones_back() -> None:
    gate = ComputeGate()
    order: list[str] = []
    batch_may_end = asyncio.Event()

    async def batch(name: str) -> None:
        async with gate.shared():
            order.append(f"{name} starts")
            await batch_may_end.wait()
            order.append(f"{name} ends")

    async def suspect() -> None:
        async with gate.exclusive():
            order.append("suspect runs")

    first = asyncio.create_task(batch("first"))
    await asyncio.sleep(0)
    alone = asyncio.create_task(suspect())
    await asyncio.sleep(0)
    second = asyncio.create_task(batch("second"))
    await asyncio.sleep(0.01)
    assert order == ["first starts"]  # the suspect waits; the new batch waits behind it
    batch_may_end.set()
    await asyncio.gather(first, alone, second)
    assert order == ["first starts", "first ends", "suspect runs", "second starts", "second ends"]
