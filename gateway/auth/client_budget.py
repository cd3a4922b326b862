"""Per-address budgets, counted in this process with the `limits` library's fixed windows.

Some work a call asks for is dear and cannot be cached for a caller who lies: verifying a key or
token nobody verified here yet costs a database read and an argon2 check, or an RSA signature
check. `ClientBudget` bounds such work per client address, before it starts, so one address
cannot keep the verifier's two argon2 slots full and lock every other caller's new key out. What
a cache answers costs nothing and is never counted.
"""

from __future__ import annotations

import time

from limits import RateLimitItemPerSecond
from limits.storage import MemoryStorage
from limits.strategies import FixedWindowRateLimiter

from tidegate.core.errors import RateLimitedError

__all__ = ["ClientBudget"]

_ANYWHERE = "-"


class ClientBudget:
    """`per_second` units for each client (an address; None counts as one unknown client):
    `allows(client)` spends one if there is one left, `take(client)` too, or raises
    `RateLimitedError` with the seconds until its window has room."""

    def __init__(self, per_second: int, what: str) -> None:
        self._limiter = FixedWindowRateLimiter(MemoryStorage())
        self._item = RateLimitItemPerSecond(per_second)
        self._what = what

    def allows(self, client: str | None) -> bool:
        return self._limiter.hit(self._item, client or _ANYWHERE)

    def take(self, client: str | None) -> None:
        if self.allows(client):
            return
        reset_at, _ = self._limiter.get_window_stats(self._item, client or _ANYWHERE)
        retry_s = max(0.1, reset_at - time.time())  # the library's windows are on wall time
        raise RateLimitedError(
            retry_s, f"too many {self._what} from this address; retry after {retry_s:.1f} s"
        )
