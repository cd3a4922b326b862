"""The solo lane: after a worker died, its unfinished messages are processed one at a time.

The crash guard (`agents.kafka_io.crash_guard`) names the suspects of each partition it finds a dead
owner's marks on. They leave the batch queues: this lane takes them in offset order, marks each
in Redis, decodes and computes it alone, and delivers its result as a batch of one. A message
that kills this process too is then known exactly, and counted; one counted `crash_limit` times
is quarantined without being decoded again. Messages of the partition read after its suspects
follow them through the lane until the suspects are passed, so the partition keeps its order.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager

from confluent_kafka import Message

from tidegate.agents.kafka_io.crash_guard import CrashGuard
from tidegate.agents.kafka_io.partition import PartitionPipeline, Slot
from tidegate.core.aio import cancel_and_wait
from tidegate.core.errors import CrashLoopError, RetriableError
from tidegate.core.telemetry import get_logger
from tidegate.dlq.envelopes import error_info
from tidegate.schemas.records import ResultRecord

__all__ = ["ComputeGate", "SoloLane"]

log = get_logger(__name__)
Compute = Callable[[Sequence[Slot], Sequence[float]], Awaitable[list[ResultRecord]]]
Deliver = Callable[[Sequence[Slot], Sequence[ResultRecord] | BaseException], None]


class ComputeGate:
    """Batches run side by side (`shared`); a suspect runs alone (`exclusive`): no batch starts
    while it waits or runs, and it starts once the running ones have ended, so a crash while it
    holds its `solo` mark is its own."""

    def __init__(self) -> None:
        self._open = asyncio.Event()
        self._open.set()
        self._idle = asyncio.Event()
        self._idle.set()
        self._running = 0

    @asynccontextmanager
    async def shared(self) -> AsyncIterator[None]:
        while not self._open.is_set():
            await self._open.wait()
        self._running += 1
        self._idle.clear()
        try:
            yield
        finally:
            self._running -= 1
            if not self._running:
                self._idle.set()

    @asynccontextmanager
    async def exclusive(self) -> AsyncIterator[None]:
        self._open.clear()
        try:
            await self._idle.wait()
            yield
        finally:
            self._open.set()


class SoloLane:
    def __init__(
        self,
        guard: CrashGuard,
        pipelines: dict[int, PartitionPipeline],
        compute: Compute,
        deliver: Deliver,
        reread: Callable[[int, int], None],
    ) -> None:
        self.guard = guard
        self._pipelines = pipelines
        self._compute = compute
        self._deliver = deliver
        self._reread = reread
        self._queue: deque[Message] = deque()
        self._waiting: dict[int, int] = {}
        self._ready = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.gate = ComputeGate()

    @property
    def backlog(self) -> int:
        """Messages queued here, not yet accepted by their partition: in flight too."""
        return len(self._queue)

    def start(self) -> asyncio.Task[None]:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="solo-lane")
        return self._task

    async def stop(self) -> None:
        if self._task is not None:
            await cancel_and_wait([self._task])

    def takes(self, partition: int, offset: int) -> bool:
        """Whether a message of the partition goes through this lane (`put` it then)."""
        guard = self.guard.partitions.get(partition)
        return bool(self._waiting.get(partition)) or (guard is not None and guard.suspect(offset))

    def put(self, msg: Message) -> None:
        partition = msg.partition() or 0
        self._waiting[partition] = self._waiting.get(partition, 0) + 1
        self._queue.append(msg)
        self._ready.set()

    def forget(self, partitions: Sequence[int]) -> None:
        """Revoked partitions: their queued messages are the next owner's."""
        gone = set(partitions)
        self._queue = deque(m for m in self._queue if m.partition() not in gone)
        for partition in gone:
            self._waiting.pop(partition, None)

    async def _run(self) -> None:
        while True:
            await self._ready.wait()
            while self._queue:
                msg = self._queue.popleft()
                partition = msg.partition() or 0
                try:
                    await self._one(partition, msg)
                finally:
                    # Only now: while it is in hand, later messages of its partition queue
                    # behind it here instead of overtaking it on the batch path.
                    if partition in self._waiting:
                        self._waiting[partition] = max(0, self._waiting[partition] - 1)
            self._ready.clear()

    async def _one(self, partition: int, msg: Message) -> None:
        pipeline = self._pipelines.get(partition)
        guard = self.guard.partitions.get(partition)
        if pipeline is None or pipeline.closed or guard is None:
            return
        offset = int(msg.offset() or 0)
        if offset in guard.quarantined:
            count = guard.counts.get(offset, 0)
            log.error(
                "partition %d offset %d killed %d workers: quarantined", partition, offset, count
            )
            crash = CrashLoopError(f"processing this message killed {count} worker processes")
            pipeline.quarantine(msg, error_info(crash, details={"crashes": str(count)}))
        elif guard.suspect(offset):
            async with self.gate.exclusive():
                await self.guard.solo(partition, offset)
                if not await self._process(pipeline, partition, msg, offset):
                    return
        elif not await self._process(pipeline, partition, msg, offset):
            return
        if guard.suspect_hi is not None and offset >= guard.suspect_hi:
            await self.guard.passed(partition)

    async def _process(
        self, pipeline: PartitionPipeline, partition: int, msg: Message, offset: int
    ) -> bool:
        """Decode, compute alone and deliver; False when the partition must be read again."""
        try:
            slot = pipeline.accept(msg)
        except RetriableError as exc:
            log.warning("cannot decode %s@%d yet: %s", partition, offset, exc)
            self.forget([partition])
            self._reread(partition, offset)
            return False
        if slot is not None:
            outcome: Sequence[ResultRecord] | BaseException
            try:
                outcome = await self._compute([slot], [0.0])
            except Exception as exc:
                outcome = exc
            self._deliver([slot], outcome)
        return True
