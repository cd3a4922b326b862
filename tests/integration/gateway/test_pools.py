"""A model placed in a pool through `/admin`, served through the gateway: the gateway publishes its
calls to the pool's topic (no default-pool worker runs, so a call sent anywhere else would go
unanswered), and `/admin` refuses a pool that was never declared. Authentication is on, with a
key scoped to the model."""

from __future__ import annotations

import asyncio

from tests.integration.gateway.gateway_fixtures import GatewayServer
from tests.integration.gateway.test_auth import Keys
from tests.integration.workers import Stack, in_thread, records_in, running, tidegate
from tests.support import eventually, unique
from tidegate.agents import worker_metrics as metrics
from tidegate.agents.inference.loaded import LoadedModel, ModelLoader, store_loader
from tidegate.core.kafka import make_admin
from tidegate.core.pools import pool_topic_names, pool_topics
from tidegate.gateway.admin.lifecycle_api import lifecycle_admin
from tidegate.gateway.admission.admission_settings import AdmissionSettings
from tidegate.gateway.auth.identity import Grant
from tidegate.gateway.gateway_services import GatewayConfig
from tidegate.gateway.gateway_settings import GatewaySettings
from tidegate.lifecycle.domain import events as ev
from tidegate.models.model_settings import ModelSettings

BODY = {"inputs": [{"name": "features", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}]}


async def declared(
    stack: Stack, models: ModelSettings, prefix: str
) -> tuple[str, dict[str, str], GatewayConfig]:
    """A new pool, declared; a key with `deploy` on tiny; a gateway's config on the stack."""
    pool = unique(prefix).lower().replace("_", "-")[:40]
    await in_thread(tidegate, stack, models, "pools", "declare", pool, "--partitions", "4")
    _, headers = await in_thread(Keys(stack.pg).new, Grant("deploy", frozenset({"tiny"})))
    config = GatewayConfig(
        gateway=GatewaySettings(replica_id=unique("replica")),
        kafka=stack.kafka,
        topics=stack.topics,
        registry=stack.registry,
        postgres=stack.pg,
        # The workers' group, as the gateway's admission and moves read it.
        admission=AdmissionSettings(worker_group=stack.group),
    )
    return pool, headers, config


async def test_a_model_placed_through_admin_is_called_on_its_pools_topic(
    stack: Stack, models: ModelSettings
) -> None:
    pool, headers, config = await declared(stack, models, "gp")
    try:
        async with running(stack, models, pool=pool) as worker:
            gateway = await in_thread(GatewayServer(config, admin=lifecycle_admin).start)
            try:
                http = gateway.http
                route = "/admin/models/tiny/pool"
                bad = await in_thread(
                    lambda: http.post(route, headers=headers, json={"pool": "Not_A_Pool"})
                )
                assert bad.status_code == 400, bad.text
                assert "is not valid" in bad.json()["detail"]
                undeclared = await in_thread(
                    lambda: http.post(route, headers=headers, json={"pool": f"{pool}-x"})
                )
                assert undeclared.status_code == 422, undeclared.text
                assert "is not declared" in undeclared.json()["detail"]
                placed = await in_thread(
                    lambda: http.post(route, headers=headers, json={"pool": pool, "reason": "it"})
                )
                assert placed.status_code == 200, placed.text
                assert ev.PoolAssigned(pool, "it") in await stack.history()

                catalog = gateway.runtime.services.catalog
                await eventually(
                    lambda: catalog.pool("tiny") == pool and worker.versions.ready("tiny", "1"),
                    timeout=60,
                    what="tiny placed in the gateway's fold and warm in the worker",
                )

                resp = await in_thread(
                    lambda: http.post("/v2/models/tiny/infer", headers=headers, json=BODY)
                )
                assert resp.status_code == 200, resp.text
                assert resp.json()["model_version"] == "1"
            finally:
                await in_thread(gateway.stop)
        assert records_in(stack, pool_topics(stack.topics, pool).requests) == 1
        assert records_in(stack, stack.topics.requests) == 0
    finally:
        admin = make_admin(stack.kafka)
        for future in admin.delete_topics(pool_topic_names(stack.topics, pool)).values():
            future.result(timeout=30)


def slow_loader(models: ModelSettings) -> ModelLoader:
    """The store's loader, 2 s slower: a model as slow to load as a large one, so a call that
    did not wait for the load would meet it cold."""
    load = store_loader(models)

    async def slow(name: str, version: str) -> LoadedModel:
        await asyncio.sleep(2.0)  # the load's own duration, not a wait for a condition
        return await load(name, version)

    return slow


async def test_a_call_after_a_move_waits_for_the_new_pool_to_load_the_model(
    stack: Stack, models: ModelSettings
) -> None:
    """The gateway sees tiny move from the default pool to another: the next call is held until
    the old pool has read past the gateway's earlier call and a worker of the new pool reported
    tiny loaded, so it is answered there without a cold load."""
    pool, headers, config = await declared(stack, models, "gm")
    cold = metrics.COLD_LOADS.labels("tiny", "1")
    try:
        async with (
            running(stack, models, worker_id="old") as old,
            running(
                stack, models, slow_loader(models), relay=False, pool=pool, worker_id="new"
            ) as new,
        ):
            gateway = await in_thread(GatewayServer(config, admin=lifecycle_admin).start)
            try:
                http = gateway.http
                catalog = gateway.runtime.services.catalog
                await eventually(
                    lambda: old.versions.ready("tiny", "1") and catalog.warm_in("tiny", None),
                    timeout=60,
                    what="tiny warm in the old pool, as the gateway folds it",
                )

                def call() -> dict[str, object]:
                    resp = http.post("/v2/models/tiny/infer", headers=headers, json=BODY)
                    assert resp.status_code == 200, resp.text
                    return dict(resp.json())

                await in_thread(call)  # in the default pool
                assert not new.versions.ready("tiny", "1")
                before = cold._value.get()
                placed = await in_thread(
                    lambda: http.post(
                        "/admin/models/tiny/pool", headers=headers, json={"pool": pool}
                    )
                )
                assert placed.status_code == 200, placed.text
                await eventually(
                    lambda: catalog.pool("tiny") == pool,
                    timeout=60,
                    interval=0.05,
                    what="the move in the gateway's fold",
                )
                await in_thread(call)  # held until the new pool has tiny loaded
                assert cold._value.get() == before, "the call met a cold load"
                guard = gateway.runtime.services.publisher.move_guard
                assert guard is not None
                assert (guard.moves, guard.timeouts) == (1, 0)
            finally:
                await in_thread(gateway.stop)
        assert records_in(stack, pool_topics(stack.topics, pool).requests) == 1
        assert records_in(stack, stack.topics.requests) == 1
    finally:
        admin = make_admin(stack.kafka)
        for future in admin.delete_topics(pool_topic_names(stack.topics, pool)).values():
            future.result(timeout=30)
