"""Which asyncio event loop a long-running process runs on (decision 028).

uvloop runs the loop itself (the selector, the ready queue, timers, wake-ups from other threads)
in C. The worker and the controller hand work between their threads and the loop many times a
second, and on the stock loop that bookkeeping is Python. uvicorn makes the same choice for the
gateway (`loop="auto"`).
"""

from __future__ import annotations

import asyncio
from typing import Literal

from tidegate.core.errors import ConfigurationError

__all__ = ["EventLoopKind", "new_event_loop"]

EventLoopKind = Literal["auto", "asyncio", "uvloop"]
"""`auto`: uvloop where it is installed (not on Windows), else asyncio's own loop."""


def new_event_loop(kind: EventLoopKind = "auto") -> asyncio.AbstractEventLoop:
    """A new event loop of `kind`; `uvloop` when it is not installed is a ConfigurationError."""
    if kind == "asyncio":
        return asyncio.new_event_loop()
    try:
        import uvloop  # optional: not installed on Windows
    except ImportError as exc:
        if kind == "uvloop":
            raise ConfigurationError(
                "the event loop is set to uvloop, which is not installed (pip install uvloop)"
            ) from exc
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()
