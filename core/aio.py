"""Stopping background tasks for sure, and one thread that owns a blocking client.

On Python 3.11 a cancellation can be lost: `asyncio.wait_for` drops it when the awaited future
completes in the same loop iteration (CPython gh-86296, fixed in 3.12), and psycopg waits for
socket readiness with `wait_for`. A task cancelled at that instant carries on as if nothing
happened, and a `stop()` that awaits it once hangs for good. `cancel_and_wait` cancels again until
the task is done.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from tidegate.core.errors import RetriableError

__all__ = ["LoopWatchdog", "OwnerThread", "Periodic", "cancel_and_wait"]

_log = logging.getLogger(__name__)


async def cancel_and_wait(tasks: Iterable[asyncio.Future[Any]], *, recancel_s: float = 2.0) -> None:
    """Cancel `tasks` and return once every one is done, cancelling again every `recancel_s` a
    task that is still running (it swallowed the cancellation, or is slow to clean up: psycopg
    cancels a running query on the server first).

    A task that had failed before it was cancelled is logged, since nobody else will see its
    error; results are dropped: callers stop what they no longer want.
    """
    if recancel_s <= 0:
        raise ValueError("recancel_s must be positive")
    tasks = list(tasks)
    pending = {task for task in tasks if not task.done()}
    rounds = 0
    while pending:
        for task in pending:
            task.cancel()
        _, pending = await asyncio.wait(pending, timeout=recancel_s)
        rounds += 1
        for task in pending:
            _log.warning(
                "%s still running %.0f s after it was cancelled; cancelling again",
                _name(task),
                rounds * recancel_s,
            )
    for task in tasks:
        if task.cancelled():
            continue
        exc = task.exception()
        if exc is not None:
            _log.warning("%s had failed before it was stopped", _name(task), exc_info=exc)


def _name(task: asyncio.Future[Any]) -> str:
    return task.get_name() if isinstance(task, asyncio.Task) else repr(task)


class Periodic:
    """Runs `step` at once and then every `every_s` seconds, between `start()` and `stop()`.

    A failing step never ends the loop: a `RetriableError` (the database is away) is logged as a
    warning, anything else with its traceback, and the next step tries again.
    """

    def __init__(self, step: Callable[[], Awaitable[object]], every_s: float, *, name: str) -> None:
        if every_s <= 0:
            raise ValueError("every_s must be positive")
        self.name = name
        self._step = step
        self._every_s = every_s
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name=self.name)

    async def stop(self) -> None:
        if self._task is not None:
            await cancel_and_wait([self._task])
            self._task = None

    async def _run(self) -> None:
        while True:
            try:
                await self._step()
            except RetriableError as exc:
                _log.warning("%s: %s; trying again in %.1f s", self.name, exc, self._every_s)
            except Exception:
                _log.exception("%s failed; trying again in %.1f s", self.name, self._every_s)
            await asyncio.sleep(self._every_s)


class OwnerThread:
    """One thread that runs every call on a client that must stay on one thread (a Kafka
    consumer: its rebalance callbacks run on the thread that polls it).

    `run_in_executor` on a one-thread pool does the same, but pays for a concurrent future chained
    to an asyncio one on every call; on the worker's hot path that is once per poll. Here a call is
    one queue put, and its result one `call_soon_threadsafe`.
    """

    def __init__(self, name: str) -> None:
        self._calls: queue.SimpleQueue[tuple[Callable[..., Any], tuple[Any, ...], Any] | None] = (
            queue.SimpleQueue()
        )
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._loop: asyncio.AbstractEventLoop | None = None

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._thread.start()

    def call(self, function: Callable[..., Any], *args: Any) -> asyncio.Future[Any]:
        """Run `function(*args)` on the thread; the future (of the running loop) gets its
        result or exception."""
        assert self._loop is not None, "start() first"  # noqa: S101 - a programming error
        future = self._loop.create_future()
        self._calls.put((function, args, future))
        return future

    def stop(self) -> None:
        """Let the calls already queued finish, then end the thread (blocks until it did)."""
        self._calls.put(None)
        self._thread.join()

    def _serve(self) -> None:
        loop = self._loop
        assert loop is not None  # noqa: S101 - set by start()
        while (job := self._calls.get()) is not None:
            function, args, future = job
            try:
                result = function(*args)
            except BaseException as exc:  # handed to the caller
                loop.call_soon_threadsafe(_settle, future, None, exc)
            else:
                loop.call_soon_threadsafe(_settle, future, result, None)


def _settle(future: asyncio.Future[Any], result: Any, exc: BaseException | None) -> None:
    if future.done():
        return
    if exc is not None:
        future.set_exception(exc)
    else:
        future.set_result(result)


class LoopWatchdog:
    """Calls `on_stall` (from its own thread) when the event loop has not run for `limit_s`.

    A call that never returns on the loop (a fast model run inline that hangs, a blocking call
    by mistake) stops everything the loop serves and cannot be timed out from the loop itself;
    a worker process would stay up doing nothing. `on_stall` typically ends the process, so its
    supervisor starts a fresh one (and a crash guard learns which message did it).
    """

    def __init__(self, limit_s: float, on_stall: Callable[[float], None]) -> None:
        self._limit_s = limit_s
        self._on_stall = on_stall
        self._beat = time.monotonic()
        self._stop = threading.Event()
        self._task: asyncio.Task[None] | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._beat = time.monotonic()
        self._task = asyncio.get_running_loop().create_task(self._heartbeat(), name="watchdog")
        self._thread = threading.Thread(target=self._watch, name="loop-watchdog", daemon=True)
        self._thread.start()

    async def stop(self) -> None:
        self._stop.set()
        if self._task is not None:
            await cancel_and_wait([self._task])

    async def _heartbeat(self) -> None:
        every = min(0.5, self._limit_s / 4)
        while True:
            self._beat = time.monotonic()
            await asyncio.sleep(every)

    def _watch(self) -> None:
        every = min(0.5, self._limit_s / 4)
        while not self._stop.wait(every):
            stalled = time.monotonic() - self._beat
            if stalled >= self._limit_s:
                self._on_stall(stalled)
                return
