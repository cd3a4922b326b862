"""Stopping background tasks for sure.

On Python 3.11 a cancellation can be lost: `asyncio.wait_for` drops it when the awaited future
completes in the same loop iteration (CPython gh-86296, fixed in 3.12), and psycopg waits for
socket readiness with `wait_for`. A task cancelled at that instant carries on as if nothing
happened, and a `stop()` that awaits it once hangs for good. `cancel_and_wait` cancels again until
the task is done.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from tidegate.core.errors import RetriableError

__all__ = ["Periodic", "cancel_and_wait"]

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
