"""A circuit breaker for one model version (`Breaker`): closed, open, half-open, counted per
request. Nothing here reads a clock of its own or does I/O: `clock` is injected (monotonic
seconds), and the owner publishes the transitions `admit` and `record` return.
The states and what counts: docs/breakers.md ("The states", "What counts"); why:
docs/decisions/014-circuit-breakers.md ("Choice").
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum

__all__ = ["Breaker", "BreakerPolicy", "BreakerState", "Snapshot", "Transition"]

_BUCKETS = 10


class BreakerState(StrEnum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


@dataclass(frozen=True, slots=True)
class BreakerPolicy:
    failure_rate: float = 0.5
    window_s: float = 10.0
    min_calls: int = 20
    open_s: float = 1.0
    max_open_s: float = 300.0
    probes: int = 5

    def __post_init__(self) -> None:
        if not 0.0 <= self.failure_rate < 1.0:
            raise ValueError(f"failure_rate must be in [0, 1), not {self.failure_rate}")
        if not (self.window_s > 0 and self.open_s > 0 and self.max_open_s >= self.open_s):
            raise ValueError("window_s and open_s must be positive, max_open_s >= open_s")
        if self.min_calls < 1 or self.probes < 1:
            raise ValueError("min_calls and probes must be at least 1")


@dataclass(frozen=True, slots=True)
class Transition:
    before: BreakerState
    after: BreakerState
    why: str


@dataclass(frozen=True, slots=True)
class Snapshot:
    """What is published about a breaker."""

    state: BreakerState
    calls: int
    failures: int
    trips: int
    """Trips in a row: 1 after the first opening, +1 per failed half-open probe, 0 once closed."""
    open_for_s: float
    """The open period of the current (or last) opening."""
    reopens_in_s: float
    """Open: seconds until probes are let through (0 otherwise)."""


class Breaker:
    def __init__(self, policy: BreakerPolicy, clock: Callable[[], float]) -> None:
        self.policy = policy
        self._clock = clock
        self._state = BreakerState.CLOSED
        self._bucket_s = policy.window_s / _BUCKETS
        # [bucket index, calls, failures], oldest first; at most _BUCKETS + 1 entries.
        self._window: deque[list[int]] = deque()
        self._calls = 0
        self._failures = 0
        self._trips = 0
        self._open_for = 0.0
        self._open_until = 0.0
        self._probes_out = 0  # probe calls admitted whose outcome is not recorded yet
        self._probes_ok = 0

    @property
    def state(self) -> BreakerState:
        """The state as last changed: an open breaker past its period stays `open` until the
        next `admit` moves it to half-open (see `reopens_in_s`)."""
        return self._state

    def snapshot(self) -> Snapshot:
        self._expire(self._clock())
        remaining = 0.0
        if self._state is BreakerState.OPEN:
            remaining = max(0.0, self._open_until - self._clock())
        return Snapshot(
            self._state, self._calls, self._failures, self._trips, self._open_for, remaining
        )

    def admit(self, calls: int) -> tuple[int, Transition | None]:
        """How many of `calls` may go to the model now (the first ones), and the transition
        asking made (open to half-open once the open period is over)."""
        if self._state is BreakerState.CLOSED:
            return calls, None
        moved = None
        if self._state is BreakerState.OPEN:
            if self._clock() < self._open_until:
                return 0, None
            self._state = BreakerState.HALF_OPEN
            self._probes_out = self._probes_ok = 0
            moved = Transition(BreakerState.OPEN, BreakerState.HALF_OPEN, "open period over")
        room = self.policy.probes - self._probes_ok - self._probes_out
        allowed = max(0, min(calls, room))
        self._probes_out += allowed
        return allowed, moved

    def record(self, ok: int, failed: int, ignored: int = 0) -> Transition | None:
        """The outcomes of admitted calls: `ignored` ones neither succeeded nor failed (a
        client's error) and only give back their probe slot."""
        if self._state is BreakerState.HALF_OPEN:
            self._probes_out = max(0, self._probes_out - ok - failed - ignored)
            if failed:
                return self._open("a half-open probe failed")
            self._probes_ok += ok
            if self._probes_ok >= self.policy.probes:
                return self._close()
            return None
        if self._state is BreakerState.OPEN:
            return None  # calls admitted before it opened: the verdict is already in
        now = self._clock()
        self._expire(now)
        index = math.floor(now / self._bucket_s)
        if self._window and self._window[-1][0] == index:
            bucket = self._window[-1]
            bucket[1] += ok + failed
            bucket[2] += failed
        else:
            self._window.append([index, ok + failed, failed])
        self._calls += ok + failed
        self._failures += failed
        if self._calls >= self.policy.min_calls and (
            self._failures > self.policy.failure_rate * self._calls
        ):
            rate = self._failures / self._calls
            return self._open(
                f"{self._failures} of {self._calls} calls failed ({rate:.0%}) in "
                f"{self.policy.window_s:g} s"
            )
        return None

    def _expire(self, now: float) -> None:
        oldest = math.floor(now / self._bucket_s) - _BUCKETS + 1
        window = self._window
        while window and window[0][0] < oldest:
            _, calls, failures = window.popleft()
            self._calls -= calls
            self._failures -= failures

    def _open(self, why: str) -> Transition:
        before = self._state
        self._trips += 1
        doubled = self.policy.open_s * 2.0 ** min(self._trips - 1, 32)
        self._open_for = min(doubled, self.policy.max_open_s)
        self._open_until = self._clock() + self._open_for
        self._state = BreakerState.OPEN
        self._reset_window()
        return Transition(before, BreakerState.OPEN, why)

    def _close(self) -> Transition:
        self._state = BreakerState.CLOSED
        self._trips = 0
        self._reset_window()
        return Transition(BreakerState.HALF_OPEN, BreakerState.CLOSED, "half-open probes passed")

    def _reset_window(self) -> None:
        # A closed breaker judges the model from its reopening on, not on failures before it.
        self._window.clear()
        self._calls = self._failures = 0
        self._probes_out = self._probes_ok = 0
