"""Helpers shared by the test suites."""

from __future__ import annotations

import socket
import time
import uuid
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

__all__ = ["free_port", "unique", "wait_for"]


def unique(prefix: str) -> str:
    """A name no other test (or earlier run) uses: topics, groups, subjects."""
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def wait_for(
    probe: Callable[[], T | None],
    *,
    timeout: float = 30.0,
    interval: float = 0.1,
    what: str = "condition",
) -> T:
    """Poll `probe` until it returns something truthy, or fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        try:
            value = probe()
        except Exception as exc:  # the probe may fail while the thing is still coming up
            last_error = exc
        else:
            if value:
                return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}; last error: {last_error}")


def free_port() -> int:
    """A TCP port nothing listens on right now, on the loopback interface."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
