"""Load shedding: at most `limit` requests in flight; past it, calls get 503 instead of a queue.

Synchronous calls leave when they are answered or time out. Asynchronous ones leave when their
result arrives, or at their expiry, so a request whose result never comes cannot hold a slot
forever.
"""

from __future__ import annotations

import math
import time
from typing import Any

from tidegate.core.errors import OverloadedError
from tidegate.gateway import http_metrics as metrics

__all__ = ["Admission"]


class Admission:
    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._until: dict[str, float] = {}

    @property
    def in_flight(self) -> int:
        return len(self._until)

    def check(self) -> None:
        """Shed early, before reading a body, when there is clearly no room."""
        if len(self._until) >= self._limit:
            self._prune()
            if len(self._until) >= self._limit:
                metrics.SHED.inc()
                raise OverloadedError(
                    f"{len(self._until)} requests are in flight, the most this replica takes"
                )

    def admit(self, request_id: str, ttl_s: float | None = None) -> None:
        """Take a slot until `release`, or for `ttl_s` seconds at most when given."""
        self.check()
        if request_id not in self._until:
            metrics.IN_FLIGHT.inc()
        self._until[request_id] = math.inf if ttl_s is None else time.monotonic() + ttl_s

    def release(self, request_id: str) -> None:
        if self._until.pop(request_id, None) is not None:
            metrics.IN_FLIGHT.dec()

    def on_result(self, result: dict[str, Any]) -> None:
        self.release(str(result["request_id"]))

    def _prune(self) -> None:
        now = time.monotonic()
        for request_id in [rid for rid, until in self._until.items() if until <= now]:
            self.release(request_id)
