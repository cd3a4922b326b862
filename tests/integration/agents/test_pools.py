"""Model pools against the real Kafka, registry and PostgreSQL: `tidegate pools declare` creates a
pool's topics, `tidegate pools place` records the placement, a `tidegate worker --pool` process
loads the pool's models and answers the requests its topic gets, a default-pool worker next to
it loads none of them, and a producer routes by placement; placing the model back moves it."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from tests.integration.workers import (
    Reader,
    Stack,
    controller_relay,
    records_in,
    request,
    start_worker,
    stop_workers,
    tidegate,
)
from tests.support import unique, wait_for
from tidegate.clients.producer import TidegateProducer
from tidegate.core.kafka import make_admin
from tidegate.core.pools import pool_topic_names, pool_topics
from tidegate.lifecycle.domain import events as ev
from tidegate.models.model_settings import ModelSettings


def loaded_on(history: list[ev.Payload]) -> set[str]:
    """The workers that have tiny version 1 loaded now, by the reports in its history."""
    on: set[str] = set()
    for payload in history:
        if isinstance(payload, ev.VersionLoaded) and payload.version == "1":
            on.add(payload.worker_id)
        if isinstance(payload, ev.VersionUnloaded) and payload.version == "1":
            on.discard(payload.worker_id)
    return on


async def test_a_pool_worker_serves_its_pools_model_and_a_default_worker_none_of_it(
    stack: Stack, models: ModelSettings, tmp_path: Path
) -> None:
    pool = unique("p").lower().replace("_", "-")[:40]
    declared = await asyncio.to_thread(
        tidegate, stack, models, "pools", "declare", pool, "--partitions", "4"
    )
    names = pool_topic_names(stack.topics, pool)
    assert all(f"created {name} (partitions: 4)" in declared.stdout for name in names)
    layout = pool_topics(stack.topics, pool)
    placement = {"tiny": pool}
    async with controller_relay(stack):
        # Refused before it is declared, then placed.
        place = ("pools", "place", "tiny")
        refused = await asyncio.to_thread(tidegate, stack, models, *place, f"{pool}-x", code=2)
        assert "is not declared" in refused.stderr
        await asyncio.to_thread(tidegate, stack, models, *place, pool, "--reason", "it")
        assert ev.PoolAssigned(pool, "it") in await stack.history()
        listed = json.loads(
            (await asyncio.to_thread(tidegate, stack, models, "pools", "list", "--json")).stdout
        )
        assert {"pool": pool, "models": ["tiny"]}.items() <= next(
            row for row in listed if row["pool"] == pool
        ).items()
        assert next(row for row in listed if row["pool"] == "default")["models"] == []

        in_pool = start_worker(
            stack, models, TIDEGATE_WORKER_POOL=pool, TIDEGATE_WORKER_WORKER_ID="pool-worker"
        )
        default = start_worker(stack, models, TIDEGATE_WORKER_WORKER_ID="default-worker")
        results = Reader(stack, stack.topics.results)
        try:
            await wait_until_loaded_on(stack, {"pool-worker"})
            # The default pool's worker is up too, and loaded nothing: tiny is not its model.
            await wait_for_log(models, "default-worker")
            assert "default-worker" not in loaded_on(await stack.history())

            with TidegateProducer(
                stack.kafka, stack.topics, stack.registry, placement=placement.get
            ) as producer:
                for i in range(20):
                    producer.publish_record(request(f"pool-{i}", f"k{i % 5}"))  # type: ignore[arg-type]
            answered = await asyncio.to_thread(results.until, 20)
            assert {r["request_id"] for r in answered} == {f"pool-{i}" for i in range(20)}
            assert {r["worker_id"] for r in answered} == {"pool-worker"}
            assert {r["status"] for r in answered} == {"OK"}
            # Every request went to the pool's topic, none to the default pool's.
            assert records_in(stack, layout.requests) == 20
            assert records_in(stack, stack.topics.requests) == 0

            # Placed back in the default pool: its worker loads it, the pool's unloads it.
            await asyncio.to_thread(tidegate, stack, models, *place, "--default")
            await wait_until_loaded_on(stack, {"default-worker"})
            history = await stack.history()
            assert ev.VersionUnloaded("1", "pool-worker", "placed in the default pool") in history
        finally:
            stop_workers(in_pool, default)
            results.close()
            admin = make_admin(stack.kafka)
            for future in admin.delete_topics(names).values():
                future.result(timeout=30)


async def wait_until_loaded_on(stack: Stack, workers: set[str]) -> None:
    async def probe() -> bool:
        return loaded_on(await stack.history()) == workers

    deadline = asyncio.get_running_loop().time() + 120
    while not await probe():
        assert asyncio.get_running_loop().time() < deadline, await stack.history()
        await asyncio.sleep(0.2)  # polling the event store, with a deadline


async def wait_for_log(models: ModelSettings, worker_id: str) -> None:
    """Until the worker's log says it consumes: its start-up loads are done by then."""

    def consuming() -> bool:
        logs = models.store_dir.parent.glob("worker*.log")
        return any(
            f"worker {worker_id} consuming" in path.read_text(errors="replace") for path in logs
        )

    await asyncio.to_thread(wait_for, consuming, timeout=120, what=f"{worker_id} consuming")
