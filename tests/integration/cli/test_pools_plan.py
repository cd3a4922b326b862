"""`tidegate pools plan` and `pools apply` against the real event store and Kafka: the plan
reads each version's measured memory from the workers' `VersionLoaded` reports and each model's
rate from the indexed results, packs them within the worker's budget, and `apply` declares the
planned pools and places each model there (a second apply changes nothing)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from confluent_kafka.schema_registry import SchemaRegistryClient

from tests.integration.lifecycle.lineage_rows import served_many
from tests.integration.workers import Stack, in_thread, registered, tidegate
from tidegate.core.kafka import make_admin
from tidegate.core.pools import pool_topic_names
from tidegate.core.stack import TopicSpec, ensure_topics
from tidegate.lifecycle.domain import events as ev
from tidegate.models.model_settings import ModelSettings
from tidegate.schemas.catalog import pool_subjects

MIB = 2**20


async def test_a_plan_packs_measured_models_and_apply_places_them(
    stack: Stack, models: ModelSettings, tmp_path: Path
) -> None:
    # tiny 1 (primary) measured at 600 MiB; big 1 at 700 MiB; small 1 never measured.
    await stack.append(ev.VersionLoaded("1", "w1", 900.0, 600 * MIB))
    version_1 = (await in_thread(registered, models, "1"))[:2]
    for name, size in (("big", 700 * MIB), ("small", None)):
        await stack.append(*version_1, ev.Promoted("1"), model=name)
        if size is not None:
            await stack.append(ev.VersionLoaded("1", "w1", 1000.0, size), model=name)
    await in_thread(served_many, stack.pg.conninfo(), "small", 360)

    prefix = f"pl{stack.group[-8:].lower()}"
    args = ("pools", "plan", "--worker-memory-mib", "1024", "--worker-rate", "0.05")
    printed = await in_thread(tidegate, stack, models, *args, "--prefix", prefix, "--json")
    plan = json.loads(printed.stdout)
    # small is sized as the average of the measured (650 MiB): three pools of one model each.
    assert plan["estimated"] == ["small:1"]
    assert plan["unplaced"] == []
    assert sorted(len(p["models"]) for p in plan["pools"]) == [1, 1, 1]
    assert all(p["bytes"] <= 0.95 * 1024 * MIB for p in plan["pools"])
    by_model = {m: p for p in plan["pools"] for m in p["models"]}
    assert by_model["big"]["bytes"] == 700 * MIB
    # 360 results in the hour: 0.1 a second, over 0.05 a worker.
    assert by_model["small"]["rate_per_s"] == 0.1
    assert by_model["small"]["workers"] == 2

    plan_file = tmp_path / "plan.json"
    plan_file.write_text(printed.stdout)
    try:
        await in_thread(tidegate, stack, models, "pools", "apply", str(plan_file))
        for model, pool in plan["placement"].items():
            assert ev.PoolAssigned(pool, "pools apply") in await stack.history(model)
        again = await in_thread(tidegate, stack, models, "pools", "apply", str(plan_file), "--json")
        assert json.loads(again.stdout) == []
    finally:
        names = [n for p in plan["pools"] for n in pool_topic_names(stack.topics, p["name"])]
        admin = make_admin(stack.kafka)
        for future in admin.delete_topics(names).values():
            await asyncio.to_thread(future.result, 30)


async def test_schemas_register_reaches_every_declared_pools_subjects(
    stack: Stack, models: ModelSettings
) -> None:
    """A pool whose topics exist but whose subjects were never registered (created by hand, or
    declared before a schema evolved) gets them from `tidegate schemas register`."""
    pool = f"sr{stack.group[-8:].lower()}"
    names = pool_topic_names(stack.topics, pool)
    admin = make_admin(stack.kafka)
    await asyncio.to_thread(ensure_topics, admin, [TopicSpec(n, 4, 1) for n in names])
    client = SchemaRegistryClient(stack.registry.client_config())
    subjects = sorted(pool_subjects(stack.topics, pool))
    assert len(subjects) == len(names)
    try:
        assert not set(subjects) & set(await in_thread(client.get_subjects))
        await in_thread(tidegate, stack, models, "schemas", "register")
        registered = set(await in_thread(client.get_subjects))
        assert set(subjects) <= registered
    finally:
        for future in admin.delete_topics(names).values():
            await asyncio.to_thread(future.result, 30)
