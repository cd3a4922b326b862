"""How many workers a pool should have ahead of its demand (`PoolScaler`): the request rate plus
its trend over the time a new worker needs to serve (its start and its models' loads), over one
worker's rate. Pure: the controller feeds it counts and load times, and exports what it says.
The arithmetic and its KEDA trigger: docs/pools.md ("Scaling ahead of demand").
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["PoolDemand", "PoolScaler", "desired_workers", "p90"]


def desired_workers(rate: float, slope: float, lead_s: float, worker_rate: float) -> int:
    """ceil((rate + slope x lead) / worker rate): the workers that serve the rate expected once a
    worker started now is ready. A falling rate is not anticipated (scale-down waits for it)."""
    expected = rate + max(slope, 0.0) * lead_s
    return max(0, math.ceil(expected / worker_rate - 1e-9))


def p90(values: list[float]) -> float:
    """The 90th percentile (nearest rank); 0 for none."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.9 * len(ordered)) - 1)]


@dataclass(frozen=True, slots=True)
class PoolDemand:
    pool: str
    rate: float
    """Requests a second over the last window."""
    slope: float
    """The rate's change per second: last window's rate minus the one before, over a window."""
    lead_s: float
    """A new worker's start plus the p90 of its pool's version loads."""
    desired: int


class PoolScaler:
    """Holds each pool's desired workers between updates: it rises at once, and falls only once
    the last rise is older than twice the lead time, since a rise's effect (workers started,
    models loaded) cannot be seen sooner. One per controller."""

    def __init__(self, *, worker_rate: Mapping[str, float], default_rate: float, start_s: float):
        self._worker_rate = worker_rate
        self._default_rate = default_rate
        self._start_s = start_s
        self._held: dict[str, tuple[int, float]] = {}  # pool -> (desired, when it last rose)

    def update(
        self,
        pool: str,
        *,
        last: int,
        before: int,
        window_s: float,
        load_ms: list[float],
        now: float,
    ) -> PoolDemand:
        """The pool's demand from its requests in the last window (`last`) and the one before
        (`before`), and its versions' load times."""
        rate = last / window_s
        slope = (last - before) / window_s / window_s
        lead_s = self._start_s + p90(load_ms) / 1000.0
        worker_rate = self._worker_rate.get(pool, self._default_rate)
        wanted = desired_workers(rate, slope, lead_s, worker_rate)
        held, rose_at = self._held.get(pool, (0, -math.inf))
        if wanted > held:
            self._held[pool] = (wanted, now)
        elif wanted < held and now - rose_at >= 2 * lead_s:
            self._held[pool] = (wanted, rose_at)
        return PoolDemand(pool, rate, slope, lead_s, self._held.get(pool, (wanted, now))[0])
