"""Stopping background tasks for sure.

On Python 3.11 a cancellation can be lost: `asyncio.wait_for` drops it when the awaited future
completes in the same loop iteration (CPython gh-86296, fixed in 3.12), and psycopg waits for
socket readiness with `wait_for`. A task cancelled at that instant carries on as if nothing
happened, and a `stop()` that awaits it once hangs for good. `cancel_and_wait` cancels again until
the task is done.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

__all__ = ["cancel_and_wait"]


async def cancel_and_wait(tasks: Iterable[asyncio.Future[Any]], *, recancel_s: float = 0.5) -> None:
    """Cancel `tasks` and return once every one is done, cancelling again each `recancel_s` any
    task that swallowed the cancellation. The tasks' results and exceptions are retrieved and
    dropped: callers stop what they no longer want."""
    if recancel_s <= 0:
        raise ValueError("recancel_s must be positive")
    tasks = list(tasks)
    pending = {task for task in tasks if not task.done()}
    while pending:
        for task in pending:
            task.cancel()
        _, pending = await asyncio.wait(pending, timeout=recancel_s)
    for task in tasks:
        if not task.cancelled():
            task.exception()
