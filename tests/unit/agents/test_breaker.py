"""The circuit breaker's state machine on an injected clock: every transition, the failure-rate
window and its minimum of calls, the backoff's doubling and cap, the half-open probe limit."""

from __future__ import annotations

import pytest

from tidegate.agents.breakers.breaker import Breaker, BreakerPolicy, BreakerState


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def breaker(**policy: float) -> tuple[Breaker, Clock]:
    clock = Clock()
    return Breaker(BreakerPolicy(**policy), clock), clock  # type: ignore[arg-type]


def trip(b: Breaker) -> None:
    assert b.admit(20) == (20, None)
    moved = b.record(ok=0, failed=20)
    assert moved is not None
    assert moved.after is BreakerState.OPEN


def test_a_closed_breaker_lets_every_call_through() -> None:
    b, _ = breaker()
    assert b.admit(500) == (500, None)
    assert b.state is BreakerState.CLOSED


def test_it_opens_above_the_failure_rate_once_the_window_holds_the_minimum_of_calls() -> None:
    b, _ = breaker()
    # 19 failures of 19 calls: below the minimum of 20, never judged.
    assert b.record(ok=0, failed=19) is None
    assert b.state is BreakerState.CLOSED
    moved = b.record(ok=0, failed=1)
    assert moved is not None
    assert (moved.before, moved.after) == (BreakerState.CLOSED, BreakerState.OPEN)
    assert "20 of 20" in moved.why
    assert b.admit(5) == (0, None)


def test_exactly_half_failing_does_not_open_it_more_than_half_does() -> None:
    b, _ = breaker()
    assert b.record(ok=10, failed=10) is None  # 50% is not > 50%
    assert b.state is BreakerState.CLOSED
    moved = b.record(ok=0, failed=1)  # 11 of 21
    assert moved is not None
    assert moved.after is BreakerState.OPEN


def test_failures_older_than_the_window_are_forgotten() -> None:
    b, clock = breaker()
    b.record(ok=0, failed=15)
    clock.now += 10.5  # every bucket of those 15 is out of the 10 s window
    assert b.record(ok=0, failed=15) is None
    assert b.snapshot().calls == 15
    clock.now += 5.0  # half the window later: both halves count
    assert b.record(ok=0, failed=5) is not None


def test_successes_in_the_window_keep_it_closed() -> None:
    b, clock = breaker()
    for _ in range(10):
        assert b.record(ok=6, failed=4) is None
        clock.now += 1.0
    assert b.state is BreakerState.CLOSED


def test_after_the_open_period_it_is_half_open_and_lets_only_the_probes_through() -> None:
    b, clock = breaker(probes=3)
    trip(b)
    clock.now += 0.999
    assert b.admit(10) == (0, None)
    clock.now += 0.002
    allowed, moved = b.admit(10)
    assert allowed == 3
    assert moved is not None
    assert (moved.before, moved.after) == (BreakerState.OPEN, BreakerState.HALF_OPEN)
    # The probe slots are taken while they run: nothing more goes.
    assert b.admit(10) == (0, None)
    assert b.record(ok=2, failed=0) is None
    # Two probes passed and the third is still out: still nothing more goes.
    assert b.admit(10) == (0, None)
    assert b.record(ok=0, failed=0, ignored=1) is None  # the third was a client's error
    assert b.admit(10) == (1, None)


def test_probe_successes_close_it_and_reset_the_backoff() -> None:
    b, clock = breaker(probes=2)
    trip(b)
    clock.now += 1.0
    assert b.admit(2)[0] == 2
    moved = b.record(ok=2, failed=0)
    assert moved is not None
    assert (moved.before, moved.after) == (BreakerState.HALF_OPEN, BreakerState.CLOSED)
    assert b.snapshot().trips == 0
    # The window starts afresh, and the next opening is a first one again: 1 s.
    assert b.record(ok=0, failed=19) is None
    trip(b)
    assert b.snapshot().open_for_s == 1.0


def test_a_failed_probe_reopens_it_for_twice_as_long() -> None:
    b, clock = breaker(probes=2)
    trip(b)
    periods = []
    for _ in range(5):
        periods.append(b.snapshot().open_for_s)
        clock.now += b.snapshot().reopens_in_s
        allowed, moved = b.admit(4)
        assert allowed == 2
        assert moved is not None
        moved = b.record(ok=1, failed=1)
        assert moved is not None
        assert (moved.before, moved.after) == (BreakerState.HALF_OPEN, BreakerState.OPEN)
    assert periods == [1.0, 2.0, 4.0, 8.0, 16.0]
    assert b.snapshot().trips == 6


def test_the_backoff_is_capped() -> None:
    b, clock = breaker(max_open_s=300.0, probes=1)
    trip(b)
    for _ in range(12):
        clock.now += b.snapshot().reopens_in_s
        assert b.admit(1)[0] == 1
        b.record(ok=0, failed=1)
    assert b.snapshot().open_for_s == 300.0
    clock.now += 299.0
    assert b.admit(1) == (0, None)
    clock.now += 1.0
    assert b.admit(1)[0] == 1


def test_ignored_outcomes_count_neither_way_but_give_back_their_probe_slot() -> None:
    b, clock = breaker(probes=1)
    assert b.record(ok=0, failed=0, ignored=100) is None
    assert b.snapshot().calls == 0
    trip(b)
    clock.now += 1.0
    assert b.admit(1)[0] == 1
    assert b.record(ok=0, failed=0, ignored=1) is None  # a client's error: no verdict
    assert b.state is BreakerState.HALF_OPEN
    assert b.admit(1) == (1, None)  # the slot is free for another probe


def test_outcomes_of_calls_admitted_before_it_opened_change_nothing() -> None:
    b, _ = breaker()
    trip(b)
    assert b.record(ok=50, failed=0) is None
    assert b.state is BreakerState.OPEN
    assert b.snapshot().reopens_in_s == pytest.approx(1.0)


def test_the_policy_refuses_nonsense() -> None:
    with pytest.raises(ValueError, match="failure_rate"):
        BreakerPolicy(failure_rate=1.0)
    with pytest.raises(ValueError, match="max_open_s"):
        BreakerPolicy(open_s=10.0, max_open_s=5.0)
    with pytest.raises(ValueError, match="probes"):
        BreakerPolicy(probes=0)
