"""Hold-key ordering's bookkeeping: only the oldest waiting request of a key may run."""

from __future__ import annotations

from tidegate.agents.kafka_io.failures import KeyHolds


def test_followers_wait_behind_the_oldest_until_it_finishes() -> None:
    holds = KeyHolds()
    assert holds.blocking(b"k", "a") is None
    holds.retried(b"k", "a", 1, 5000)
    hold = holds.blocking(b"k", "b")
    assert hold is not None
    assert (hold.level, hold.retry_at_ms) == (1, 5000)
    holds.held(b"k", "b")
    assert holds.blocking(b"k", "a") is None  # the head comes back: it runs
    assert holds.blocking(b"other", "x") is None
    holds.retried(b"k", "a", 2, 9000)  # failed again: followers now wait at level 2
    hold = holds.blocking(b"k", "b")
    assert hold is not None
    assert hold.level == 2
    holds.finished(b"k", "a")
    assert holds.blocking(b"k", "b") is None
    holds.finished(b"k", "b")
    assert len(holds) == 0
