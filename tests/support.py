"""Helpers shared by the test suites."""

from __future__ import annotations

import asyncio
import functools
import importlib.util
import inspect
import socket
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from types import ModuleType
from typing import Any, TypeVar, overload

T = TypeVar("T")

__all__ = [
    "TRANSIENT",
    "WaitTimeoutError",
    "alive",
    "eventually",
    "free_port",
    "retry_later",
    "settings_reference",
    "unique",
    "wait_for",
]

# What a probe may meet while the thing it waits for is still coming up: a port not listening
# yet, a connection reset by a server that is restarting. Anything else is a failure of the test.
TRANSIENT: tuple[type[Exception], ...] = (ConnectionError,)


class WaitTimeoutError(AssertionError):
    """The condition never held within the time given (an AssertionError: the test failed)."""


def unique(prefix: str) -> str:
    """A name no other test (or earlier run) uses: topics, groups, subjects."""
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


class _Poll:
    """The rules `wait_for` and `eventually` share: a falsy answer or one of the named transient
    errors means "not yet"; any other exception (an AssertionError above all) is the probe's
    verdict and propagates at once, so a wrong answer inside a probe fails its test."""

    def __init__(
        self, timeout: float, interval: float, what: str, retry_on: tuple[type[Exception], ...]
    ) -> None:
        for kind in retry_on:
            # Exception or BaseException would catch an AssertionError and retry it.
            if issubclass(AssertionError, kind):
                raise TypeError(f"retry_on names {kind.__name__}, which would hide a failure")
        self.timeout = timeout
        self.interval = interval
        self.what = what
        self.retry_on = retry_on
        self.deadline = time.monotonic() + timeout
        self.last_error: Exception | None = None

    def pause(self) -> float:
        """How long to sleep before the next try; raises once the deadline has passed."""
        left = self.deadline - time.monotonic()
        if left <= 0:
            note = f"; last transient error: {self.last_error!r}" if self.last_error else ""
            raise WaitTimeoutError(f"timed out after {self.timeout}s waiting for {self.what}{note}")
        return min(self.interval, left)


def wait_for(
    probe: Callable[[], T | None],
    *,
    timeout: float = 30.0,
    interval: float = 0.1,
    what: str = "condition",
    retry_on: tuple[type[Exception], ...] = TRANSIENT,
) -> T:
    """Poll `probe` until it returns something truthy, or fail after `timeout` seconds.

    `retry_on` names the exceptions that mean "not yet" (default: `TRANSIENT`); every other one
    propagates at once. A probe says "not yet" by returning something falsy, never by asserting.
    """
    poll = _Poll(timeout, interval, what, retry_on)
    while True:
        try:
            value = probe()
        except retry_on as exc:
            poll.last_error = exc
        else:
            if value:
                return value
        time.sleep(poll.pause())


@overload
async def eventually(
    probe: Callable[[], Awaitable[T | None]],
    *,
    timeout: float = ...,  # noqa: ASYNC109
    interval: float = ...,
    what: str = ...,
    retry_on: tuple[type[Exception], ...] = ...,
) -> T: ...


@overload
async def eventually(
    probe: Callable[[], T | None],
    *,
    timeout: float = ...,  # noqa: ASYNC109
    interval: float = ...,
    what: str = ...,
    retry_on: tuple[type[Exception], ...] = ...,
) -> T: ...


async def eventually(
    probe: Callable[[], Any],
    *,
    # The same keywords as wait_for's; a probe that hangs is the test's own timeout's to catch.
    timeout: float = 30.0,  # noqa: ASYNC109
    interval: float = 0.1,
    what: str = "condition",
    retry_on: tuple[type[Exception], ...] = TRANSIENT,
) -> Any:
    """`wait_for` on the running event loop, which goes on between tries; the same rules. The
    probe is a coroutine function, or a plain one reading what the loop's tasks change."""
    poll = _Poll(timeout, interval, what, retry_on)
    while True:
        try:
            value = probe()
            if inspect.isawaitable(value):
                value = await value
        except retry_on as exc:
            poll.last_error = exc
        else:
            if value:
                return value
        await asyncio.sleep(poll.pause())


def alive(pid: int) -> bool:
    """Whether process `pid` runs: a zombie does not (nothing reaps orphans in some containers)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def retry_later(response: Any) -> bool:
    """Whether an HTTP response (httpx's, or a TestClient's) is a 503 problem marked retriable:
    what a gateway answers while a model is still loading or Kafka is coming back. A probe may
    take it for "not yet"; any other failure is an answer to assert on."""
    if response.status_code != 503:
        return False
    body = response.json()
    return isinstance(body, dict) and body.get("retriable") is True


def free_port() -> int:
    """A TCP port nothing listens on right now, on the loopback interface."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def free_ports(count: int) -> list[int]:
    """`count` distinct TCP ports nothing listens on right now, on the loopback interface: all
    bound at once, so none is handed out twice."""
    socks = [socket.socket() for _ in range(count)]
    try:
        for sock in socks:
            sock.bind(("127.0.0.1", 0))
        return [int(sock.getsockname()[1]) for sock in socks]
    finally:
        for sock in socks:
            sock.close()


@functools.cache
def settings_reference() -> ModuleType:
    """infra/settings_reference.py, the one finder of the code's settings classes (a script, not
    a module of the package: loaded from its file)."""
    path = Path(__file__).resolve().parents[1] / "infra" / "settings_reference.py"
    spec = importlib.util.spec_from_file_location("settings_reference", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
