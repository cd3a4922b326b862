"""Routing results addressed to this replica to the calls that wait for them.

A `ReplyFeed` delivers every result published to this replica's reply partition; the
`ReplyRouter` resolves the future of a synchronous call waiting on it, if any, and stores every
result in the result store, so late and asynchronous results can be fetched by id afterwards.
"""

from __future__ import annotations

import asyncio
import logging
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any

from tidegate.core.errors import TidegateError
from tidegate.gateway import http_metrics as metrics
from tidegate.gateway.result_store import ResultStore

__all__ = ["Deliver", "ReplyFeed", "ReplyRouter"]

_log = logging.getLogger(__name__)

# (decoded InferenceResult, the framed bytes it was decoded from)
Deliver = Callable[[dict[str, Any], bytes], None]


class ReplyFeed(ABC):
    """The source of this replica's replies. `deliver` is always called on the event loop."""

    @abstractmethod
    async def start(self, deliver: Deliver) -> None: ...

    @abstractmethod
    async def stop(self) -> None: ...

    def reply_to(self) -> dict[str, Any] | None:
        """The `reply_to` of requests published now, or None while no partition is held."""
        return None

    @property
    def ready(self) -> bool:
        return self.reply_to() is not None


class ReplyRouter:
    """Futures of waiting calls by request id. Create it on the event loop it serves."""

    def __init__(self, store: ResultStore) -> None:
        self._store = store
        self._waiting: dict[str, asyncio.Future[dict[str, Any]]] = {}
        self._writes: set[asyncio.Task[None]] = set()
        self.listeners: list[Callable[[dict[str, Any]], None]] = []

    def expect(self, request_id: str) -> asyncio.Future[dict[str, Any]]:
        """Register before publishing, so that a result arriving at once is not missed."""
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._waiting[request_id] = future
        return future

    def is_waiting(self, request_id: str) -> bool:
        return request_id in self._waiting

    def forget(self, request_id: str) -> None:
        future = self._waiting.pop(request_id, None)
        if future is not None and not future.done():
            future.cancel()

    def deliver(self, result: dict[str, Any], raw: bytes) -> None:
        request_id = str(result["request_id"])
        future = self._waiting.pop(request_id, None)
        awaited = future is not None and not future.done()
        if future is not None and awaited:
            future.set_result(result)
        metrics.REPLIES.labels(outcome="awaited" if awaited else "stored").inc()
        for listener in self.listeners:
            listener(result)
        task = asyncio.get_running_loop().create_task(self._store_result(request_id, raw))
        self._writes.add(task)
        task.add_done_callback(self._writes.discard)

    async def _store_result(self, request_id: str, raw: bytes) -> None:
        try:
            await self._store.save(request_id, result=raw)
        except TidegateError as exc:
            # The caller that waits (if any) has its answer already; only a later fetch by id
            # misses this result, and Kafka's results topic still holds it.
            _log.warning("could not store the result of %s: %s", request_id, exc)

    async def drain(self) -> None:
        """Finish pending result writes and fail nothing silently: waiting calls are cancelled."""
        if self._writes:
            await asyncio.gather(*self._writes, return_exceptions=True)
        for request_id in list(self._waiting):
            self.forget(request_id)
