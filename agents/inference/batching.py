"""Dynamic batching (`KeyedBatcher`, one `BatchQueue` per model, fed by every partition): a queue
dispatches as soon as its model is idle, and each finished batch goes to `deliver` whole.
How batches form: docs/worker.md ("Batches").
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable, Hashable, Sequence
from typing import Generic, Protocol, TypeVar

from tidegate.core.aio import cancel_and_wait
from tidegate.core.errors import ModelExecutionError, ModelUnavailableError

__all__ = [
    "BatchObserver",
    "BatchQueue",
    "BatchResultCountError",
    "KeyedBatcher",
    "QueueClosedError",
]

T = TypeVar("T")
R = TypeVar("R")

# The handler gets the items and how long each waited in the queue, in milliseconds.
Handler = Callable[[Sequence[T], Sequence[float]], Awaitable[Sequence[R]]]
# Told of each finished batch: its items, and their results in order or what failed them all.
Deliver = Callable[[Sequence[T], Sequence[R] | BaseException], None]


class BatchResultCountError(ModelExecutionError):
    """The handler returned a different number of results than the batch had members."""


class QueueClosedError(ModelUnavailableError):
    """The queue stopped (shutdown) before this item was answered."""


class BatchObserver(Protocol):
    def observe_batch(self, size: int, waits_ms: Sequence[float]) -> None: ...


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
        deliver: Deliver[T, R],
        *,
        max_batch_size: int = 32,
        max_batch_delay_ms: float = 0.0,
        observer: BatchObserver | None = None,
    ) -> None:
        check_knobs(max_batch_size, max_batch_delay_ms)
        self._handler = handler
        self._deliver = deliver
        self._max = max_batch_size
        self._delay = max_batch_delay_ms / 1000.0
        self._observer = observer
        self._items: deque[tuple[T, float]] = deque()
        self._loop = asyncio.get_running_loop()
        self._ready = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closed = False

    def __len__(self) -> int:
        return len(self._items)

    def start(self) -> None:
        if self._task is None:
            self._task = self._loop.create_task(self._run(), name="batch-queue")

    def submit(self, item: T) -> None:
        if self._closed:
            self._deliver([item], QueueClosedError("the batch queue is closed"))
            return
        items = self._items
        items.append((item, self._loop.time()))
        if len(items) == 1 or len(items) == self._max:
            self._ready.set()

    async def stop(self) -> None:
        """Stop batching; a running batch is cancelled, and every member not yet answered
        (running or still queued) is delivered `QueueClosedError`."""
        self._closed = True
        if self._task is not None:
            await cancel_and_wait([self._task])
            self._task = None
        left = [item for item, _ in self._items]
        self._items.clear()
        if left:
            self._deliver(left, QueueClosedError("the batch queue stopped"))

    async def _run(self) -> None:
        while True:
            await self._wait_for_batch()
            now = self._loop.time()
            take = min(self._max, len(self._items))
            batch, waits = [], []
            for _ in range(take):
                item, enqueued = self._items.popleft()
                batch.append(item)
                waits.append((now - enqueued) * 1000.0)
            await self._dispatch(batch, waits)

    async def _wait_for_batch(self) -> None:
        while not self._items:
            self._ready.clear()
            await self._ready.wait()
        if self._delay <= 0:
            return
        deadline = self._items[0][1] + self._delay
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

    async def _dispatch(self, batch: list[T], waits: list[float]) -> None:
        if self._observer is not None:
            self._observer.observe_batch(len(batch), waits)
        outcome: Sequence[R] | BaseException
        try:
            outcome = await self._handler(batch, waits)
        except asyncio.CancelledError:
            self._deliver(batch, QueueClosedError("the batch was cancelled"))
            raise
        except Exception as exc:
            outcome = exc
        else:
            if len(outcome) != len(batch):
                outcome = BatchResultCountError(
                    f"{len(outcome)} results for a batch of {len(batch)}"
                )
        self._deliver(batch, outcome)


class KeyedBatcher(Generic[T, R]):
    """One `BatchQueue` per key (a model name), made on first use; all share one `deliver`."""

    def __init__(
        self,
        handler: Handler[T, R],
        deliver: Deliver[T, R],
        *,
        max_batch_size: int = 32,
        max_batch_delay_ms: float = 0.0,
        observer: BatchObserver | None = None,
    ) -> None:
        check_knobs(max_batch_size, max_batch_delay_ms)
        self._handler = handler
        self._deliver = deliver
        self._max = max_batch_size
        self._delay = max_batch_delay_ms
        self._observer = observer
        self._queues: dict[Hashable, BatchQueue[T, R]] = {}
        self._closed = False

    def submit(self, key: Hashable, item: T) -> None:
        queue = self._queues.get(key)
        if queue is None:
            if self._closed:
                self._deliver([item], QueueClosedError("the batcher is stopped"))
                return
            queue = BatchQueue(
                self._handler,
                self._deliver,
                max_batch_size=self._max,
                max_batch_delay_ms=self._delay,
                observer=self._observer,
            )
            queue.start()
            self._queues[key] = queue
        queue.submit(item)

    async def stop(self) -> None:
        self._closed = True
        queues, self._queues = list(self._queues.values()), {}
        for queue in queues:
            await queue.stop()
