"""The gateway's prediction cache: it answers only when the version is certain before a worker
routes, marks its answers, shares keys with the workers, and never serves across versions."""

from __future__ import annotations

import struct
from datetime import UTC, datetime

from tests.unit.agents.dataplane_support import fraud_table, lifecycle_table, registered
from tests.unit.agents.redis_fake import FakeRedis, as_redis
from tidegate.core.cache_settings import PredictionCacheSettings
from tidegate.gateway.modelstate.prediction_cache import (
    GatewayPredictionCache,
    certain_route,
    table_resolver,
)
from tidegate.lifecycle.domain import events as ev
from tidegate.lifecycle.domain.routing import RoutingTable
from tidegate.schemas.prediction_keys import encode_outputs, prediction_key
from tidegate.schemas.records import RequestRecord, ResultRecord, ResultStatus, TensorRecord

SETTINGS = PredictionCacheSettings(models=frozenset({"fraud"}), key_prefix="g:", ttl_s=30)
OUTPUT: TensorRecord = {
    "name": "probabilities",
    "datatype": "FP32",
    "shape": [1, 2],
    "data": struct.pack("<2f", 0.25, 0.75),
    "parameters": {},
}


def record(
    rid: str = "r1",
    *,
    model: str = "fraud",
    model_version: str | None = None,
    entity_key: str | None = None,
) -> RequestRecord:
    return {
        "request_id": rid,
        "model": model,
        "model_version": model_version,
        "tenant": "t1",
        "routing_key": None,
        "inputs": [
            {
                "name": "features",
                "datatype": "FP32",
                "shape": [1, 4],
                "data": struct.pack("<4f", 1, 2, 3, 4),
                "parameters": {},
            }
        ],
        "outputs": [],
        "parameters": {},
        "created_at": datetime.now(UTC),
        "entity_key": entity_key,
    }


def answer(status: ResultStatus = "OK", outputs: list[TensorRecord] | None = None) -> ResultRecord:
    """A worker's result of version 1 (of `record()`: the cache keys it by the request)."""
    return {
        "request_id": "r1",
        "model": "fraud",
        "model_version": "1",
        "status": status,
        "outputs": [OUTPUT] if outputs is None else outputs,
        "completed_at": datetime.now(UTC),
    }


class Feed:
    def __init__(self, table: RoutingTable) -> None:
        self.tables = {"fraud": table}

    def table(self, model: str) -> RoutingTable | None:
        return self.tables.get(model)


def only_one() -> RoutingTable:
    return lifecycle_table("fraud", *registered("1"), ev.Promoted("1"))


def test_the_version_is_certain_for_one_servable_version_an_explicit_one_or_a_pin() -> None:
    single = certain_route(only_one(), record())
    assert single is not None
    assert single.version == "1"
    explicit = certain_route(fraud_table(), record(model_version="2"))
    assert explicit is not None
    assert explicit.version == "2"
    pinned = certain_route(fraud_table(ev.RoutingRuleSet("p1", tenant="t1", version="2")), record())
    assert pinned is not None
    assert (pinned.version, pinned.rule) == ("2", "pin:p1")


def test_a_split_over_several_versions_is_left_to_the_workers() -> None:
    assert certain_route(fraud_table(), record()) is None  # 2 is servable: a fallback may differ
    assert certain_route(fraud_table(), record(model_version="9")) is None


async def test_a_stored_answer_is_served_marked_cached_with_the_version() -> None:
    redis = FakeRedis()
    cache = GatewayPredictionCache(as_redis(redis), SETTINGS, replica_id="g1")
    resolve = table_resolver(Feed(only_one()))
    assert await cache.lookup("fraud", resolve, record()) is None
    await cache.store(record(), answer())
    assert list(redis.ttls_ms.values()) == [30_000]
    hit = await cache.lookup("fraud", resolve, record("r2"))
    assert hit is not None
    assert hit["cached"] is True
    assert (hit["request_id"], hit["model_version"], hit["status"]) == ("r2", "1", "OK")
    assert hit["outputs"] == [OUTPUT]
    rule = hit["routing_rule"]
    assert rule is not None
    assert rule.startswith("split@")


async def test_it_finds_what_a_worker_stored_under_the_same_key() -> None:
    redis = FakeRedis()
    rec = record()
    key = prediction_key("g:", "fraud", "1", rec["inputs"], (), {}, tenant=rec["tenant"])
    redis.values[key] = encode_outputs([OUTPUT])
    cache = GatewayPredictionCache(as_redis(redis), SETTINGS, replica_id="g1")
    assert await cache.lookup("fraud", table_resolver(Feed(only_one())), rec) is not None


async def test_a_promotion_never_serves_the_old_versions_answer() -> None:
    redis = FakeRedis()
    cache = GatewayPredictionCache(as_redis(redis), SETTINGS, replica_id="g1")
    feed = Feed(fraud_table(ev.RoutingRuleSet("p", version="1")))
    await cache.store(record(), answer())
    assert await cache.lookup("fraud", table_resolver(feed), record()) is not None
    feed.tables["fraud"] = fraud_table(ev.RoutingRuleSet("p", version="2"))
    assert await cache.lookup("fraud", table_resolver(feed), record()) is None


async def test_entity_requests_other_models_and_failures_are_never_cached() -> None:
    redis = FakeRedis()
    cache = GatewayPredictionCache(as_redis(redis), SETTINGS, replica_id="g1")
    resolve = table_resolver(Feed(only_one()))
    ok = answer()
    await cache.store(record(entity_key="u1"), ok)
    await cache.store(record(model="other"), ok)
    await cache.store(record(), answer("INVALID", outputs=[]))
    await cache.store(record(), {**ok, "cached": True})
    await cache.store(record(), {**ok, "routing_rule": "fallback:breaker-open@fraud/1"})
    assert redis.values == {}
    await cache.store(record(), ok)
    assert await cache.lookup("fraud", resolve, record(entity_key="u1")) is None
    assert await cache.lookup("other", resolve, record(model="other")) is None


async def test_a_failing_redis_means_publishing() -> None:
    redis = FakeRedis()
    redis.down = True
    cache = GatewayPredictionCache(as_redis(redis), SETTINGS, replica_id="g1")
    assert await cache.lookup("fraud", table_resolver(Feed(only_one())), record()) is None
    await cache.store(record(), answer())
