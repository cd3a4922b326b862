"""Priority between a worker process's two lanes (`LaneGate`): real-time first, batch never
starved, its share of recent time kept by `BusyShare`. A running batch is never interrupted.
How the gate decides, and what it costs: docs/lanes.md ("How a worker serves the lanes").
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from prometheus_client import Counter

__all__ = ["BATCH_HELD", "BusyShare", "LaneGate"]

BATCH_HELD = Counter(
    "tidegate_worker_batch_lane_held_seconds",
    "Time batch-lane batches waited for the real-time lane to leave them room.",
)


class BusyShare:
    """The fraction of the recent past during which something was running: an exponentially
    decaying average over `window_s` seconds of a 0/1 busy signal, kept in O(1) per change."""

    def __init__(self, window_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._tau = window_s
        self._clock = clock
        self._share = 0.0
        self._at = clock()
        self._running = 0

    def _advance(self) -> float:
        now = self._clock()
        decay = math.exp(-(now - self._at) / self._tau)
        target = 1.0 if self._running else 0.0
        self._share = target + (self._share - target) * decay
        self._at = now
        return self._share

    @property
    def share(self) -> float:
        return self._advance()

    @property
    def running(self) -> int:
        return self._running

    def begin(self) -> None:
        self._advance()
        self._running += 1

    def end(self) -> None:
        self._advance()
        self._running -= 1

    def falls_below_in(self, share: float) -> float:
        """Seconds until the share, decaying while nothing runs, is below `share` (0 if it is);
        infinite while something runs."""
        current = self._advance()
        if current < share:
            return 0.0
        if self._running:
            return math.inf
        return self._tau * math.log(current / share)


class LaneGate:
    def __init__(
        self,
        batch_share: float,
        *,
        window_s: float = 1.0,
        idle_after_s: float = 0.01,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not 0.0 < batch_share <= 1.0:
            raise ValueError("batch_share must be in (0, 1]")
        self.batch_share = batch_share
        self._idle_after_s = idle_after_s
        self._clock = clock
        self._realtime_running = 0
        self._realtime_ended = -math.inf
        self._batch = BusyShare(window_s, clock)
        # Set whenever something ends, so held batches look again at once.
        self._changed = asyncio.Event()

    @property
    def batch_share_now(self) -> float:
        """The batch lane's share of the recent time (what `batch_share` bounds under load)."""
        return self._batch.share

    @asynccontextmanager
    async def realtime(self) -> AsyncIterator[None]:
        self._realtime_running += 1
        try:
            yield
        finally:
            self._realtime_running -= 1
            self._realtime_ended = self._clock()
            self._changed.set()

    @asynccontextmanager
    async def batch(self) -> AsyncIterator[None]:
        started = self._clock()
        while (wait := self._batch_wait()) > 0:
            self._changed.clear()
            with contextlib.suppress(TimeoutError):  # the share fell: look again
                await asyncio.wait_for(self._changed.wait(), None if math.isinf(wait) else wait)
        held = self._clock() - started
        if held > 0:
            BATCH_HELD.inc(held)
        self._batch.begin()
        try:
            yield
        finally:
            self._batch.end()
            self._changed.set()

    def _batch_wait(self) -> float:
        """0 when a batch-lane batch may start now, else how long until it may at the latest
        (infinite: until something ends)."""
        if self._realtime_running == 0:
            quiet = self._clock() - self._realtime_ended
            if quiet >= self._idle_after_s:
                return 0.0
            idle_in = self._idle_after_s - quiet
        else:
            idle_in = math.inf
        return min(idle_in, self._batch.falls_below_in(self.batch_share))
