"""Micro-batching, like Ray Serve's batch queue, with one queue per Kafka partition.

Each submitted item gets an asyncio future. A queue's loop waits for its first item, then for up
to `max_batch_delay_ms` (counted from that item's arrival) or until `max_batch_size` items are
there, and hands the batch to the handler. Batches of one queue run one after another, so the
order of a partition (and so of every key) holds; queues of different partitions run concurrently.

Every member is answered: with the handler's result in its position, or, when the handler fails
or returns a different number of results than it was given, with the same exception.
"""

from __future__ import annotations

import asyncio
import functools
from collections import deque
from collections.abc import Awaitable, Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from tidegate.core.aio import cancel_and_wait
from tidegate.core.errors import ModelExecutionError, ModelUnavailableError

__all__ = [
    "BatchObserver",
    "BatchQueue",
    "BatchResultCountError",
    "PartitionBatcher",
    "Pending",
    "QueueClosedError",
]

T = TypeVar("T")
R = TypeVar("R")

# The handler gets the items and how long each waited in the queue, in milliseconds.
Handler = Callable[[Sequence[T], Sequence[float]], Awaitable[Sequence[R]]]


class BatchResultCountError(ModelExecutionError):
    """The handler returned a different number of results than the batch had members."""


class QueueClosedError(ModelUnavailableError):
    """The queue stopped (shutdown or partition revoked) before this item was batched."""


class BatchObserver(Protocol):
    def observe_batch(self, size: int, waits_ms: Sequence[float]) -> None: ...


@dataclass(slots=True, eq=False)
class Pending(Generic[T, R]):
    item: T
    future: asyncio.Future[R]
    enqueued: float


def check_knobs(max_batch_size: int, max_batch_delay_ms: float) -> None:
    if max_batch_size < 1:
        raise ValueError(f"max_batch_size must be at least 1, got {max_batch_size}")
    if max_batch_delay_ms < 0:
        raise ValueError(f"max_batch_delay_ms must not be negative, got {max_batch_delay_ms}")


class BatchQueue(Generic[T, R]):
    """One queue and its batching loop. Create and start it inside the running loop."""

    def __init__(
        self,
        handler: Handler[T, R],
        *,
        max_batch_size: int = 32,
        max_batch_delay_ms: float = 5.0,
        observer: BatchObserver | None = None,
    ) -> None:
        check_knobs(max_batch_size, max_batch_delay_ms)
        self._handler = handler
        self._max = max_batch_size
        self._delay = max_batch_delay_ms / 1000.0
        self._observer = observer
        self._items: deque[Pending[T, R]] = deque()
        self._loop = asyncio.get_running_loop()
        self._ready = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closed = False

    def __len__(self) -> int:
        return len(self._items)

    def start(self) -> None:
        if self._task is None:
            self._task = self._loop.create_task(self._run(), name="batch-queue")

    def submit(self, item: T) -> asyncio.Future[R]:
        future: asyncio.Future[R] = self._loop.create_future()
        if self._closed:
            future.set_exception(QueueClosedError("the batch queue is closed"))
            return future
        self._items.append(Pending(item, future, self._loop.time()))
        if len(self._items) == 1 or len(self._items) >= self._max:
            self._ready.set()
        return future

    async def stop(self) -> None:
        """Stop batching; a batch being computed is cancelled, and every member not yet answered
        (running or still queued) fails with `QueueClosedError`."""
        self._closed = True
        if self._task is not None:
            await cancel_and_wait([self._task])
            self._task = None
        self._fail(self._items, QueueClosedError("the batch queue stopped"))
        self._items.clear()

    async def _run(self) -> None:
        while True:
            await self._wait_for_batch()
            batch = [self._items.popleft() for _ in range(min(self._max, len(self._items)))]
            await self._dispatch(batch)

    async def _wait_for_batch(self) -> None:
        while not self._items:
            self._ready.clear()
            await self._ready.wait()
        if self._delay <= 0:
            return
        deadline = self._items[0].enqueued + self._delay
        while len(self._items) < self._max:
            remaining = deadline - self._loop.time()
            if remaining <= 0:
                return
            self._ready.clear()
            timer = self._loop.call_later(remaining, self._ready.set)
            try:
                await self._ready.wait()
            finally:
                timer.cancel()

    async def _dispatch(self, batch: list[Pending[T, R]]) -> None:
        now = self._loop.time()
        waits = [(now - p.enqueued) * 1000.0 for p in batch]
        if self._observer is not None:
            self._observer.observe_batch(len(batch), waits)
        try:
            results = await self._handler([p.item for p in batch], waits)
        except asyncio.CancelledError:
            self._fail(batch, QueueClosedError("the batch was cancelled"))
            raise
        except Exception as exc:
            self._fail(batch, exc)
            return
        if len(results) != len(batch):
            self._fail(
                batch,
                BatchResultCountError(f"{len(results)} results for a batch of {len(batch)}"),
            )
            return
        for pending, result in zip(batch, results, strict=True):
            if not pending.future.done():
                pending.future.set_result(result)

    @staticmethod
    def _fail(batch: Sequence[Pending[T, R]], exc: BaseException) -> None:
        for pending in batch:
            if not pending.future.done():
                pending.future.set_exception(exc)


class PartitionBatcher(Generic[T, R]):
    """One `BatchQueue` per partition, made on first use and dropped when the partition goes."""

    def __init__(
        self,
        handler: Handler[T, R],
        *,
        max_batch_size: int = 32,
        max_batch_delay_ms: float = 5.0,
        observer: BatchObserver | None = None,
    ) -> None:
        check_knobs(max_batch_size, max_batch_delay_ms)
        self._new_queue = functools.partial(
            BatchQueue[T, R],
            handler,
            max_batch_size=max_batch_size,
            max_batch_delay_ms=max_batch_delay_ms,
            observer=observer,
        )
        self._queues: dict[Hashable, BatchQueue[T, R]] = {}

    def submit(self, partition: Hashable, item: T) -> asyncio.Future[R]:
        queue = self._queues.get(partition)
        if queue is None:
            queue = self._new_queue()
            queue.start()
            self._queues[partition] = queue
        return queue.submit(item)

    def queued(self, partition: Hashable) -> int:
        queue = self._queues.get(partition)
        return len(queue) if queue is not None else 0

    async def drop(self, partition: Hashable) -> None:
        queue = self._queues.pop(partition, None)
        if queue is not None:
            await queue.stop()

    async def stop(self) -> None:
        for partition in list(self._queues):
            await self.drop(partition)
