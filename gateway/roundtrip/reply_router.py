"""Routing the results addressed to this replica to the calls that wait for them (`ReplyRouter`),
by request id and submission nonce; only results the gateway promised to keep reach Redis.
What is stored, attached or dropped: docs/decisions/009-gateway-hot-path.md ("Decision");
the nonce: docs/security.md ("Results by id belong to their caller").
"""

from __future__ import annotations

import asyncio
import logging
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Coroutine
from typing import Any, Protocol

from cachetools import TTLCache
from opentelemetry.context import Context
from opentelemetry.trace import SpanKind, Tracer, get_current_span

from tidegate.core.errors import TidegateError
from tidegate.gateway import http_metrics as metrics
from tidegate.gateway.roundtrip.result_store import ResultStore
from tidegate.schemas.records import ReplyToRecord, ResultRecord

__all__ = ["Deliver", "ReplyFeed", "ReplyRouter"]

_log = logging.getLogger(__name__)


class Deliver(Protocol):
    def __call__(
        self,
        result: ResultRecord,
        raw: bytes,
        trace: Context | None = None,
        nonce: str | None = None,
    ) -> None:
        """Take a decoded InferenceResult, the framed bytes it was decoded from, the trace
        context of its message (only when tracing is on), and the nonce of the submission it
        answers (its `SUBMISSION_HEADER`)."""


class ReplyFeed(ABC):
    """The source of this replica's replies. `deliver` is always called on the event loop."""

    @abstractmethod
    async def start(self, deliver: Deliver) -> None: ...

    @abstractmethod
    async def stop(self) -> None: ...

    def reply_to(self) -> ReplyToRecord | None:
        """The `reply_to` of requests published now, or None while no partition is held."""
        return None

    @property
    def ready(self) -> bool:
        return self.reply_to() is not None


class _Waiter:
    __slots__ = ("future", "nonce", "owner")

    def __init__(
        self, future: asyncio.Future[ResultRecord], owner: str | None, nonce: str | None
    ) -> None:
        self.future = future
        self.owner = owner
        self.nonce = nonce


class ReplyRouter:
    """Futures of waiting calls by request id. Create it on the event loop it serves.

    A reply is matched to its submission by the nonce the request carried and the reply carries
    back (`SUBMISSION_HEADER`), never by its request id alone: a caller who reuses another's id
    is not handed that other's result, nor is a reply from anyone but the worker that served it.
    """

    def __init__(
        self, store: ResultStore, *, keep_s: float, max_kept: int, tracer: Tracer | None = None
    ) -> None:
        self._store = store
        self._tracer = tracer
        self._waiting: dict[str, _Waiter] = {}
        # The owner (the caller's subject) and nonce of a kept request's submission.
        self._kept: TTLCache[str, tuple[str | None, str | None]] = TTLCache(
            max_kept, keep_s, timer=time.monotonic
        )
        self._writes: set[asyncio.Task[None]] = set()
        self.listeners: list[Callable[[ResultRecord], None]] = []

    def expect(
        self, request_id: str, owner: str | None = None, nonce: str | None = None
    ) -> asyncio.Future[ResultRecord]:
        """Register before publishing, so that a result arriving at once is not missed; `owner`
        is the caller's subject, whose the result is if it has to be stored, and `nonce` the
        submission's, which its reply must carry."""
        future: asyncio.Future[ResultRecord] = asyncio.get_running_loop().create_future()
        self._waiting[request_id] = _Waiter(future, owner, nonce)
        return future

    def is_waiting(self, request_id: str) -> bool:
        return request_id in self._waiting

    def holder(self, request_id: str) -> tuple[bool, str | None]:
        """Whether a call here waits for, or keeps, this id; and its owner."""
        waiter = self._waiting.get(request_id)
        if waiter is not None:
            return True, waiter.owner
        kept = self._kept.get(request_id)
        if kept is not None:
            return True, kept[0]
        return False, None

    def forget(self, request_id: str, future: asyncio.Future[ResultRecord] | None = None) -> None:
        """Stop waiting; given its `future`, only if no later call of the same id took over."""
        waiter = self._waiting.get(request_id)
        if waiter is None or (future is not None and waiter.future is not future):
            return
        del self._waiting[request_id]
        if not waiter.future.done():
            waiter.future.cancel()

    def keep(self, request_id: str, owner: str | None = None, nonce: str | None = None) -> None:
        """Store this request's result, as `owner`'s submission `nonce`, when it comes: the
        caller was promised a later fetch."""
        self._kept[request_id] = (owner, nonce)

    def drop(self, request_id: str) -> None:
        self._kept.pop(request_id, None)

    def deliver(
        self,
        result: ResultRecord,
        raw: bytes,
        trace: Context | None = None,
        nonce: str | None = None,
    ) -> None:
        request_id = str(result["request_id"])
        waiter = self._waiting.get(request_id)
        if waiter is not None and waiter.nonce != nonce:
            waiter = None  # another submission's reply, or a forged one: not this call's
        kept = self._kept.get(request_id)
        if kept is not None and kept[1] != nonce:
            kept = None
        if waiter is not None and not waiter.future.done():
            del self._waiting[request_id]
            waiter.future.set_result(result)
            if result.get("status") == "DEADLINE_EXCEEDED":
                # Answered 504, which promises a fetch by id (`Inference._call` stores the rest).
                self._write(self._store_result(request_id, raw, waiter.owner, nonce))
            outcome = "awaited"
        elif kept is not None or waiter is not None:
            # A call still registered but ended has just ended, almost always at its deadline:
            # it answers 504, which promises this result, and may not have said `keep` yet.
            if waiter is not None:
                del self._waiting[request_id]
            owner = kept[0] if kept is not None else waiter.owner if waiter is not None else None
            self._kept.pop(request_id, None)
            self._write(self._store_result(request_id, raw, owner, nonce))
            outcome = "stored"
        else:
            self._write(self._attach_result(request_id, raw, nonce))
            outcome = "unclaimed"
        metrics.count_reply(outcome)
        if self._tracer is not None and trace is not None and _carries_trace(trace):
            self._tracer.start_span(
                "reply",
                context=trace,
                kind=SpanKind.CONSUMER,
                attributes={"tidegate.request_id": request_id, "tidegate.reply": outcome},
            ).end()
        for listener in self.listeners:
            listener(result)

    def _write(self, write: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(write)
        self._writes.add(task)
        task.add_done_callback(self._writes.discard)

    async def _store_result(
        self, request_id: str, raw: bytes, owner: str | None, nonce: str | None
    ) -> None:
        try:
            await self._store.save(request_id, result=raw, owner=owner, nonce=nonce)
        except TidegateError as exc:
            # Only a later fetch by id misses this result, and Kafka's results topic holds it.
            _log.warning(
                "could not store the result of %s: %s",
                request_id,
                exc,
                extra={"request_id": request_id},
            )

    async def _attach_result(self, request_id: str, raw: bytes, nonce: str | None) -> None:
        try:
            await self._store.attach(request_id, raw, nonce)
        except TidegateError as exc:
            _log.warning(
                "could not store the result of %s: %s",
                request_id,
                exc,
                extra={"request_id": request_id},
            )

    async def drain(self) -> None:
        """Finish pending result writes and fail nothing silently: waiting calls are cancelled."""
        if self._writes:
            await asyncio.gather(*self._writes, return_exceptions=True)
        for request_id in list(self._waiting):
            self.forget(request_id)


def _carries_trace(context: Context) -> bool:
    """Whether a reply's headers held a trace context: a reply without one (its request came
    without, or was not sampled) starts no trace here."""
    return get_current_span(context).get_span_context().is_valid
