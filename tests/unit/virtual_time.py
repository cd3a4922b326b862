"""An event loop on a virtual clock, for unit tests that time pure asyncio code: the clock moves
only when nothing is ready to run, and then jumps to the next timer. Sleeps, `wait_for` timeouts
and timers take no wall time, and run in the same order however loaded the machine is."""

from __future__ import annotations

import asyncio
import selectors
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

__all__ = ["VirtualTimeLoop", "in_virtual_time"]


# What each turn of the loop costs, as on a real machine: code that polls the clock until a
# moment passes (waiting a share of a microsecond, again and again) gets there.
TURN_S = 1e-6


class _JumpingSelector(selectors.DefaultSelector):
    """Never waits: where the loop would wait `timeout` for I/O, the clock jumps by it."""

    def __init__(self, loop: VirtualTimeLoop) -> None:
        super().__init__()
        self._loop = loop

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        ready = super().select(0)
        self._loop.now += timeout if not ready and timeout else TURN_S
        return ready


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """No real I/O and no other thread: a task waiting on either would spin, never wake."""

    def __init__(self) -> None:
        self.now = 0.0
        super().__init__(selector=_JumpingSelector(self))

    def time(self) -> float:
        return self.now


def in_virtual_time(coro: Coroutine[Any, Any, T]) -> T:
    """Run `coro` to completion on a fresh `VirtualTimeLoop`."""
    loop = VirtualTimeLoop()
    try:
        return loop.run_until_complete(coro)
    finally:
        loop.close()
