"""The controller's pool demand against the real PostgreSQL: each pool's rate and trend from the
indexed results of its models, its lead from its versions' load times in the event log, and
`tidegate_pool_desired_workers` set for every pool, the default one included."""

from __future__ import annotations

from prometheus_client import REGISTRY

from tests.integration.lifecycle.lineage_rows import served_many
from tests.integration.workers import Stack, in_thread
from tidegate.core.db import make_pool
from tidegate.lifecycle.control.pool_demand import PoolDemandExport
from tidegate.lifecycle.domain import events as ev
from tidegate.lifecycle.eventstore.event_store import EventStore
from tidegate.lifecycle.lifecycle_settings import LifecycleSettings


async def test_a_pools_desired_workers_follow_its_rate_its_rise_and_its_loads(
    stack: Stack,
) -> None:
    pool_name = "nlp"
    await stack.append(ev.PoolAssigned(pool_name), ev.VersionLoaded("1", "w1", 10_000.0))
    # 600 results 31-59 s ago, 1,200 in the last 30 s: 40/s, rising.
    await in_thread(served_many, stack.pg.conninfo(), "tiny", 600, 45)
    await in_thread(served_many, stack.pg.conninfo(), "tiny", 1200, 5)
    await in_thread(served_many, stack.pg.conninfo(), "gone", 50, 300)  # outside both windows

    settings = LifecycleSettings(
        pool_worker_rates={pool_name: 10.0}, pool_worker_start_s=20.0, pool_scaling_window_s=30
    )
    pool = make_pool(stack.pg, settings)
    await pool.open(wait=True, timeout=30)
    try:
        demands = {
            d.pool: d for d in await PoolDemandExport(pool, EventStore(pool), settings).step()
        }
    finally:
        await pool.close()
    nlp = demands[pool_name]
    assert nlp.rate == 40.0
    assert nlp.lead_s == 30.0  # 20 s start + the 10 s load
    assert nlp.desired == 6
    assert demands["default"].desired == 0
    sample = REGISTRY.get_sample_value("tidegate_pool_desired_workers", {"pool": pool_name})
    assert sample == 6
