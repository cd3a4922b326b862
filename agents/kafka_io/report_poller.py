"""Serving the producer's delivery reports on the event loop (decision 029).

confluent-kafka runs each report's callback on the thread that calls `Producer.poll`, taking the
GIL for each report. Served by a thread of their own, every result's report was a GIL hand-off
with the loop, and each flush woke the loop from that thread. Here the loop polls, from timers:
`_EVERY_S` after a flush and again as often while any message awaits its report, each poll
serving all that arrived; otherwise every `_IDLE_S`, for librdkafka's logs and errors, which
arrive through the same poll. A report served late delays only the release of offsets (committed
every 100 ms), never a result.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from tidegate.agents.kafka_io.delivery import ResultPublisher

__all__ = ["ReportPoller"]

_EVERY_S = 0.01
_IDLE_S = 0.1


class ReportPoller:
    def __init__(
        self,
        publisher: ResultPublisher,
        loop: asyncio.AbstractEventLoop,
        on_fatal: Callable[[BaseException], None],
    ) -> None:
        self._publisher = publisher
        self._loop = loop
        self._fatal = on_fatal
        self._due: asyncio.TimerHandle | None = None
        self._idle: asyncio.TimerHandle | None = None

    def start(self) -> None:
        self._idle = self._loop.call_later(_IDLE_S, self._idle_poll)

    def flushed(self) -> None:
        """Messages went out: serve their reports soon (one timer per flush at most)."""
        if self._due is None:
            self._due = self._loop.call_later(_EVERY_S, self._serve)

    def stop(self) -> None:
        for handle in (self._idle, self._due):
            if handle is not None:
                handle.cancel()
        self._idle = self._due = None

    def _serve(self) -> None:
        self._due = None
        try:
            self._publisher.poll(0)
        except Exception as exc:  # a report's callback failed: nothing after it is counted
            self._fatal(exc)
            return
        if self._publisher.outstanding():
            self.flushed()

    def _idle_poll(self) -> None:
        self._idle = self._loop.call_later(_IDLE_S, self._idle_poll)
        if self._due is None:
            self._serve()
