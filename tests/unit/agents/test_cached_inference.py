"""The worker's prediction cache over the real inference service (fake runtimes, an in-memory
Redis): a hit skips the model and is marked, one round trip per batch each way, the version is
part of the key, opt-in per model, and a failing Redis only means computing."""

from __future__ import annotations

from collections.abc import Sequence

from tests.unit.agents.dataplane_support import Tables, fraud_table, make_service, manager, task
from tests.unit.agents.redis_fake import FakeRedis, as_redis
from tidegate.agents.inference.inference_service import InferenceService
from tidegate.agents.stages.cached_inference import CachedInference
from tidegate.agents.tasks.inference_task import InferenceTask
from tidegate.core.cache_settings import PredictionCacheSettings
from tidegate.lifecycle.domain import events as ev
from tidegate.schemas.records import ResultRecord

SETTINGS = PredictionCacheSettings(models=frozenset({"fraud"}), ttl_s=60, key_prefix="t:")


def cached(
    service: InferenceService, redis: FakeRedis, settings: PredictionCacheSettings = SETTINGS
) -> CachedInference:
    assert isinstance(service.tables, Tables)
    return CachedInference(
        service,
        service.tables,
        service.models,
        as_redis(redis),
        settings,
        worker_id="w-test",
    )


async def run(stage: CachedInference, tasks: list[InferenceTask]) -> list[ResultRecord]:
    return await stage.process(tasks, [1.5] * len(tasks))


async def test_a_repeated_request_is_answered_from_the_cache_without_the_model() -> None:
    service, runtimes = make_service()
    redis = FakeRedis()
    stage = cached(service, redis)
    first = await run(stage, [task("a", [1, 2, 3, 4])])
    assert runtimes["1"].calls == [1]
    assert first[0]["cached"] is False
    assert list(redis.ttls_ms.values()) == [60_000]
    again = await run(stage, [task("b", [1, 2, 3, 4])])
    assert runtimes["1"].calls == [1], "a hit must not call the model"
    (hit,) = again
    assert hit["cached"] is True
    assert hit["request_id"] == "b"
    assert hit["status"] == "OK"
    assert hit["model_version"] == "1"
    assert hit["routing_rule"] is not None
    assert hit["routing_rule"].startswith(("split@", "warming-fallback@"))
    assert hit["outputs"] == [{**output, "parameters": {}} for output in first[0]["outputs"]]


async def test_a_batch_costs_one_lookup_and_one_store_and_computes_only_its_misses() -> None:
    service, runtimes = make_service()
    redis = FakeRedis()
    stage = cached(service, redis)
    await run(stage, [task("a", [1, 1, 1, 1]), task("b", [2, 2, 2, 2])])
    assert redis.round_trips == 2
    redis.round_trips = 0
    batch = [task("c", [1, 1, 1, 1]), task("d", [3, 3, 3, 3]), task("e", [2, 2, 2, 2])]
    results = await run(stage, batch)
    assert redis.round_trips == 2  # one MGET, one pipelined SET for the one miss
    assert runtimes["1"].calls == [2, 1]
    assert [r["request_id"] for r in results] == ["c", "d", "e"]
    assert [r["cached"] for r in results] == [True, False, True]


async def test_a_promotion_never_serves_the_old_versions_answer() -> None:
    service, runtimes = make_service()
    redis = FakeRedis()
    stage = cached(service, redis)
    (old,) = await run(stage, [task("a", [1, 2, 3, 4])])
    assert old["model_version"] == "1"
    assert isinstance(service.tables, Tables)
    service.tables.tables["fraud"] = fraud_table(ev.Promoted("2"))
    # While 2 warms up here, routing falls back to 1, and so may its cached answer.
    (warming,) = await run(stage, [task("w", [1, 2, 3, 4])])
    assert (warming["model_version"], warming["cached"]) == ("1", True)
    await manager(service).cache.get("fraud", "2")
    (new,) = await run(stage, [task("b", [1, 2, 3, 4])])
    assert new["model_version"] == "2"
    assert new["cached"] is False
    assert runtimes["2"].calls == [1]
    assert new["outputs"] != old["outputs"]
    (again,) = await run(stage, [task("c", [1, 2, 3, 4])])
    assert (again["model_version"], again["cached"]) == ("2", True)
    assert again["outputs"] == [{**o, "parameters": {}} for o in new["outputs"]]


async def test_an_explicit_version_has_its_own_entries() -> None:
    service, runtimes = make_service()
    stage = cached(service, FakeRedis())
    await run(stage, [task("a")])
    (pinned,) = await run(stage, [task("b", version="2")])
    assert (pinned["model_version"], pinned["cached"]) == ("2", False)
    assert runtimes["2"].calls == [1]


async def test_requested_outputs_are_part_of_the_question() -> None:
    service, _ = make_service()
    stage = cached(service, FakeRedis())
    await run(stage, [task("a")])
    (score,) = await run(stage, [task("b", outputs=["score"])])
    assert score["cached"] is False
    assert [o["name"] for o in score["outputs"]] == ["score"]
    (again,) = await run(stage, [task("c", outputs=["score"])])
    assert again["cached"] is True
    assert [o["name"] for o in again["outputs"]] == ["score"]


async def test_models_not_opted_in_are_never_cached() -> None:
    service, runtimes = make_service()
    redis = FakeRedis()
    stage = cached(service, redis, PredictionCacheSettings(models=frozenset({"other"})))
    await run(stage, [task("a")])
    await run(stage, [task("b")])
    assert runtimes["1"].calls == [1, 1]
    assert redis.round_trips == 0


async def test_failures_and_expired_requests_are_not_cached() -> None:
    service, _ = make_service()
    redis = FakeRedis()
    stage = cached(service, redis)
    expired = task("late", deadline_ms=1.0)
    invalid = task("bad", [1.0, 2.0])  # shape [1, 2] does not fit [-1, 4]
    results = await run(stage, [expired, invalid])
    assert [r["status"] for r in results] == ["DEADLINE_EXCEEDED", "INVALID"]
    assert redis.values == {}


async def test_answers_over_the_size_cap_are_computed_but_not_stored() -> None:
    service, _ = make_service()
    redis = FakeRedis()
    small = PredictionCacheSettings(models=frozenset({"fraud"}), max_entry_bytes=64)
    stage = cached(service, redis, small)
    (result,) = await run(stage, [task("a")])
    assert result["status"] == "OK"
    assert redis.values == {}


async def test_an_unreachable_cache_only_means_computing() -> None:
    service, runtimes = make_service()
    redis = FakeRedis()
    redis.down = True
    stage = cached(service, redis)
    results = await run(stage, [task("a"), task("b")])
    assert [(r["status"], r["cached"]) for r in results] == [("OK", False)] * 2
    assert runtimes["1"].calls == [2]


async def test_a_damaged_entry_is_a_miss() -> None:
    service, runtimes = make_service()
    redis = FakeRedis()
    stage = cached(service, redis)
    await run(stage, [task("a")])
    for key in redis.values:
        redis.values[key] = b"garbage"
    (result,) = await run(stage, [task("b")])
    assert result["cached"] is False
    assert runtimes["1"].calls == [1, 1]


class FallbackService:
    """An inner service whose every answer came from a fallback model (an open breaker)."""

    def __init__(self, service: InferenceService) -> None:
        self.service = service

    async def process(
        self, tasks: Sequence[InferenceTask], waits_ms: Sequence[float]
    ) -> list[ResultRecord]:
        results = await self.service.process(tasks, waits_ms)
        return [{**r, "routing_rule": "fallback:breaker-open@fraud/1"} for r in results]


async def test_a_fallbacks_answer_is_never_stored_under_the_primary() -> None:
    service, _ = make_service()
    redis = FakeRedis()
    assert isinstance(service.tables, Tables)
    stage = CachedInference(
        FallbackService(service),
        service.tables,
        service.models,
        as_redis(redis),
        SETTINGS,
        worker_id="w-test",
    )
    (result,) = await run(stage, [task("a")])
    assert result["status"] == "OK"
    assert redis.values == {}
