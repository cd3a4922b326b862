"""A pool's desired workers: the rate plus its rise over the lead time (a worker's start and its
pool's loads) over one worker's rate; it rises at once and falls only after twice the lead."""

from __future__ import annotations

from tidegate.lifecycle.domain.pool_scaling import PoolScaler, desired_workers, p90


def test_the_desired_workers_lead_a_rising_rate_by_the_lead_time() -> None:
    assert desired_workers(rate=900, slope=0, lead_s=40, worker_rate=300) == 3
    # Rising by 10/s each second: in 40 s, 400/s more are expected, so 5 workers now.
    assert desired_workers(rate=900, slope=10, lead_s=40, worker_rate=300) == 5
    # A falling rate is not anticipated.
    assert desired_workers(rate=900, slope=-10, lead_s=40, worker_rate=300) == 3
    assert desired_workers(rate=0, slope=0, lead_s=40, worker_rate=300) == 0


def test_p90_is_the_nearest_rank() -> None:
    assert p90([]) == 0.0
    assert p90([5.0]) == 5.0
    assert p90([float(i) for i in range(1, 11)]) == 9.0


def test_a_rise_is_held_for_twice_the_lead_before_it_falls() -> None:
    scaler = PoolScaler(worker_rate={"nlp": 10.0}, default_rate=100.0, start_s=20.0)
    # 30 s windows: 600 then 1,200 requests: 40/s, rising by 20/s over 30 s (0.67/s a second).
    up = scaler.update("nlp", last=1200, before=600, window_s=30, load_ms=[10_000.0], now=0.0)
    assert (up.rate, up.lead_s) == (40.0, 30.0)
    assert up.desired == 6  # (40 + 0.67 x 30) / 10
    # The load drops at once: still 6 until 2 x 30 s after the rise.
    calm = scaler.update("nlp", last=300, before=300, window_s=30, load_ms=[10_000.0], now=59.0)
    assert (calm.rate, calm.desired) == (10.0, 6)
    later = scaler.update("nlp", last=300, before=300, window_s=30, load_ms=[10_000.0], now=60.0)
    assert later.desired == 1
    # Another pool has the default worker rate and its own history.
    other = scaler.update("cv", last=3000, before=3000, window_s=30, load_ms=[], now=60.0)
    assert (other.lead_s, other.desired) == (20.0, 1)
