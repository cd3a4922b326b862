"""How a synchronous call's wait for its reply ends other than by the reply: a failed publish, or
the deadline once Kafka has the request (docs/deadlines-and-faults.md)."""

from __future__ import annotations

import asyncio

from tidegate.core.errors import ResultTimeoutError
from tidegate.gateway.roundtrip.request_publisher import Delivery
from tidegate.gateway.v2api import call_record
from tidegate.schemas.records import ResultRecord

__all__ = ["AwaitedResult", "CallDeadline"]

AwaitedResult = asyncio.Future[ResultRecord]
"""What a synchronous call waits on: its result, or the error that ended the wait."""


class CallDeadline:
    """Ends a synchronous call's wait for its reply when the publish fails, or at the deadline once
    Kafka has acknowledged the request (if the ack is late, when it comes). A successful publish
    costs the loop nothing: its acknowledgement is a flag on the `Delivery`, read only here."""

    __slots__ = ("_delivery", "_reply", "_request_id", "_timer", "_wait_s")

    def __init__(self, reply: AwaitedResult, wait_s: float, request_id: str) -> None:
        self._reply = reply
        self._wait_s = wait_s
        self._request_id = request_id
        self._delivery: Delivery | None = None
        self._timer: asyncio.TimerHandle | None = None

    def arm(self, delivery: Delivery) -> None:
        """The request is enqueued: its deadline runs from now."""
        self._delivery = delivery
        self._timer = asyncio.get_running_loop().call_later(self._wait_s, self._passed)

    def cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()

    def failed(self, error: Exception) -> None:
        """The publish failed (on the loop): the call ends with it."""
        self._end(error)

    def _passed(self) -> None:
        delivery = self._delivery
        if delivery is None or delivery.error is not None:
            return  # ended by its failure already
        # Kafka may not have it yet: a 504 then would promise a fetch of a request that may never
        # be taken, so the ack ends the call when it comes (librdkafka settles it within
        # `publish_timeout_s`). Asked for before `acked` is read: see `Delivery.acknowledged`.
        delivery.on_ack = self._ack_after_deadline
        if delivery.acked:
            self._end(self._timeout())

    def _ack_after_deadline(self) -> None:
        self._end(self._timeout())

    def _timeout(self) -> ResultTimeoutError:
        # The request's deadline is this wait (or earlier): a worker that reaches it later
        # answers DEADLINE_EXCEEDED rather than compute it, unless it was computing already.
        return ResultTimeoutError(
            f"no result for {self._request_id} within {self._wait_s}s, its deadline: it will be "
            "answered DEADLINE_EXCEEDED, unless a worker computed it just in time; the answer "
            f"can be fetched at {call_record.location(self._request_id)}"
        )

    def _end(self, error: BaseException) -> None:
        if not self._reply.done():
            self._reply.set_exception(error)
