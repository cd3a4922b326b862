"""The controller's export of each pool's demand (`PoolDemandExport`): every
`pool_scaling_every_s`, the requests each pool's models served in the last two windows (from the
indexed results) and their versions' load times (from the event log), turned into
`tidegate_pool_desired_workers` by `PoolScaler`, which KEDA scales each pool's workers on.
Why ahead of the lag: docs/pools.md ("Scaling ahead of demand")."""

from __future__ import annotations

import time
from collections import defaultdict
from datetime import timedelta
from typing import Any

from prometheus_client import Gauge
from psycopg_pool import AsyncConnectionPool

from tidegate.core.aio import Periodic
from tidegate.core.db import connection
from tidegate.core.pool_names import DEFAULT_POOL
from tidegate.lifecycle.domain.pool_scaling import PoolDemand, PoolScaler
from tidegate.lifecycle.eventstore.event_store import EventStore
from tidegate.lifecycle.lifecycle_settings import LifecycleSettings

__all__ = ["POOL_DESIRED", "POOL_RATE", "PoolDemandExport"]

POOL_DESIRED = Gauge(
    "tidegate_pool_desired_workers",
    "Workers the pool should have once a worker started now is ready: ceil((request rate + "
    "its rise per second x (worker start + p90 of its versions' loads)) / one worker's rate), "
    "held after a rise for twice that lead. KEDA's Prometheus trigger scales on it.",
    ["pool"],
)
POOL_RATE = Gauge(
    "tidegate_pool_request_rate",
    "Results per second the pool's models served over the last scaling window (indexed).",
    ["pool"],
)

_COUNTS = """
SELECT model,
       count(*) FILTER (WHERE completed_at >= now() - %(window)s::interval) AS last,
       count(*) FILTER (WHERE completed_at < now() - %(window)s::interval) AS before
FROM served_requests
WHERE completed_at >= now() - 2 * %(window)s::interval
GROUP BY model
"""


class PoolDemandExport:
    def __init__(
        self, pool: AsyncConnectionPool[Any], events: EventStore, settings: LifecycleSettings
    ) -> None:
        self._pool = pool
        self._events = events
        self._window_s = settings.pool_scaling_window_s
        self._scaler = PoolScaler(
            worker_rate=settings.pool_worker_rates,
            default_rate=settings.pool_worker_rate,
            start_s=settings.pool_worker_start_s,
        )
        self._periodic = Periodic(self.step, settings.pool_scaling_every_s, name="pool-demand")

    def start(self) -> None:
        self._periodic.start()

    async def stop(self) -> None:
        await self._periodic.stop()

    async def step(self) -> list[PoolDemand]:
        """Read the counts and the placements, export each pool's demand, and return it."""
        pools: dict[str, str] = {}
        loads: dict[str, list[float]] = defaultdict(list)
        for stream in await self._events.streams():
            state = await self._events.load(stream)
            pool = pools[stream] = state.pool or DEFAULT_POOL
            loads[pool] += [v.load_ms for v in state.versions if v.servable and v.load_ms]
        window = timedelta(seconds=self._window_s)
        async with connection(self._pool) as conn:
            cur = await conn.execute(_COUNTS, {"window": window})
            rows = await cur.fetchall()
        last: dict[str, int] = defaultdict(int)
        before: dict[str, int] = defaultdict(int)
        for model, in_last, in_before in rows:
            pool = pools.get(str(model), DEFAULT_POOL)
            last[pool] += int(in_last)
            before[pool] += int(in_before)
        now = time.monotonic()
        out = []
        for pool in sorted({DEFAULT_POOL, *pools.values()}):
            demand = self._scaler.update(
                pool,
                last=last[pool],
                before=before[pool],
                window_s=self._window_s,
                load_ms=loads[pool],
                now=now,
            )
            POOL_DESIRED.labels(pool).set(demand.desired)
            POOL_RATE.labels(pool).set(demand.rate)
            out.append(demand)
        return out
