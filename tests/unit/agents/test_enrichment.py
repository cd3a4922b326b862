"""Feature enrichment over the real inference service (fake runtimes, an in-memory Redis): the
declared input is built from the entity's hash in one round trip per batch, inputs the request
carries win, missing entities and features are INVALID_INPUT, an unreachable store UNAVAILABLE."""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any

import numpy as np

from tests.unit.agents.dataplane_support import (
    Tables,
    error_of,
    fraud_table,
    make_service,
    manager,
    task,
)
from tests.unit.agents.redis_fake import FakeRedis, as_redis
from tidegate.agents.inference.inference_service import InferenceService
from tidegate.agents.stages.enrichment import Enrichment
from tidegate.agents.stages.feature_settings import FeatureSettings
from tidegate.agents.tasks.inference_task import InferenceTask
from tidegate.lifecycle.domain import events as ev
from tidegate.schemas.records import ResultRecord
from tidegate.schemas.tensors import to_numpy

FEATURES = ("amount", "age", "hour", "risk")
SETTINGS = FeatureSettings(declared={"fraud": {"features": FEATURES}}, key_prefix="f:")


def enriching(
    service: InferenceService, redis: FakeRedis, settings: FeatureSettings = SETTINGS
) -> Enrichment:
    assert isinstance(service.tables, Tables)
    return Enrichment(
        service,
        service.tables,
        service.models,
        as_redis(redis),
        settings,
        worker_id="w-test",
    )


def by_entity(rid: str, entity: str, **options: Any) -> InferenceTask:
    """A request naming `entity` and carrying no input."""
    made = task(rid, **options)
    made.request["inputs"] = []
    made.request["entity_key"] = entity
    made.arrays = {}
    return made


def put(redis: FakeRedis, entity: str, values: list[float], at: int = 1_700_000_000_123) -> None:
    row = {name: repr(value).encode() for name, value in zip(FEATURES, values, strict=True)}
    redis.hashes[f"f:{entity}"] = {**row, "_updated_at": str(at).encode()}


async def run(stage: Enrichment, tasks: list[InferenceTask]) -> list[ResultRecord]:
    return await stage.process(tasks, [1.5] * len(tasks))


def probabilities(result: ResultRecord) -> Any:
    return to_numpy(next(o for o in result["outputs"] if o["name"] == "probabilities"))


async def test_an_entitys_features_give_the_same_answer_as_inline_ones() -> None:
    service, runtimes = make_service()
    redis = FakeRedis()
    put(redis, "u1", [0.5, 1.25, -3.0, 7.0], at=1_700_000_000_123)
    stage = enriching(service, redis)
    enriched, inline = await run(stage, [by_entity("e", "u1"), task("i", [0.5, 1.25, -3.0, 7.0])])
    assert enriched["status"] == "OK", enriched["error"]
    np.testing.assert_array_equal(probabilities(enriched), probabilities(inline))
    assert enriched["features_at"] == 1_700_000_000_123
    assert inline["features_at"] is None
    assert runtimes["1"].calls == [2], "the enriched request is batched like any other"


async def test_a_batch_reads_every_entity_in_one_round_trip() -> None:
    service, _ = make_service()
    redis = FakeRedis()
    for n in range(5):
        put(redis, f"u{n}", [float(n)] * 4)
    results = await run(enriching(service, redis), [by_entity(f"r{n}", f"u{n}") for n in range(5)])
    assert [r["status"] for r in results] == ["OK"] * 5
    assert redis.round_trips == 1


async def test_inputs_the_request_carries_win() -> None:
    service, _ = make_service()
    redis = FakeRedis()
    put(redis, "u1", [9.0, 9.0, 9.0, 9.0])
    carried = task("c", [1.0, 2.0, 3.0, 4.0])
    carried.request["entity_key"] = "u1"
    (result,) = await run(enriching(service, redis), [carried])
    (plain,) = await run(enriching(service, redis), [task("p", [1.0, 2.0, 3.0, 4.0])])
    np.testing.assert_array_equal(probabilities(result), probabilities(plain))
    assert redis.round_trips == 0
    assert result["features_at"] is None


async def test_a_missing_entity_is_invalid_input_without_compute() -> None:
    service, runtimes = make_service()
    redis = FakeRedis()
    put(redis, "known", [1.0, 1.0, 1.0, 1.0])
    results = await run(
        enriching(service, redis), [by_entity("a", "ghost"), by_entity("b", "known")]
    )
    missing, found = results
    assert missing["status"] == "INVALID"
    assert error_of(missing)["code"] == "INVALID_INPUT"
    assert "ghost" in error_of(missing)["message"]
    assert missing["model_version"] == "1"
    assert found["status"] == "OK"
    assert runtimes["1"].calls == [1]


async def test_a_missing_or_non_numeric_feature_is_invalid_input_naming_it() -> None:
    service, _ = make_service()
    redis = FakeRedis()
    redis.hashes["f:partial"] = {"amount": b"1", "age": b"2", "hour": b"3"}
    redis.hashes["f:text"] = {"amount": b"1", "age": b"x", "hour": b"3", "risk": b"4"}
    partial, text = await run(
        enriching(service, redis), [by_entity("a", "partial"), by_entity("b", "text")]
    )
    assert partial["status"] == text["status"] == "INVALID"
    assert "'risk'" in error_of(partial)["message"]
    assert "'age'" in error_of(text)["message"]
    assert partial["features_at"] is None


async def test_an_unreachable_store_is_unavailable_so_the_request_is_retried() -> None:
    service, runtimes = make_service()
    redis = FakeRedis()
    redis.down = True
    results = await run(enriching(service, redis), [by_entity("a", "u1"), task("b")])
    assert [r["status"] for r in results] == ["UNAVAILABLE", "OK"]
    assert error_of(results[0])["retriable"] is True
    assert runtimes["1"].calls == [1]


async def test_a_declaration_for_the_routed_version_wins_over_the_models() -> None:
    service, _ = make_service()
    redis = FakeRedis()
    redis.hashes["f:u1"] = {"a": b"1", "b": b"2", "c": b"3", "d": b"4", "_updated_at": b"5"}
    settings = FeatureSettings(
        declared={"fraud": {"features": FEATURES}, "fraud@1": {"features": ("a", "b", "c", "d")}},
        key_prefix="f:",
    )
    (result,) = await run(enriching(service, redis, settings), [by_entity("r", "u1")])
    (inline,) = await run(enriching(service, redis), [task("i", [1.0, 2.0, 3.0, 4.0])])
    np.testing.assert_array_equal(probabilities(result), probabilities(inline))


async def test_a_declaration_that_does_not_fit_the_signature_is_an_error() -> None:
    service, _ = make_service()
    redis = FakeRedis()
    redis.hashes["f:u1"] = {"a": b"1", "_updated_at": b"5"}
    settings = FeatureSettings(declared={"fraud": {"features": ("a",)}}, key_prefix="f:")
    (result,) = await run(enriching(service, redis, settings), [by_entity("r", "u1")])
    assert result["status"] == "ERROR"
    assert "'features'" in error_of(result)["message"]


async def test_routing_that_moves_to_a_version_with_other_features_is_retried() -> None:
    service, _ = make_service()
    redis = FakeRedis()
    put(redis, "u1", [1.0, 2.0, 3.0, 4.0])
    settings = FeatureSettings(
        declared={"fraud@1": {"features": FEATURES}, "fraud@2": {"features": FEATURES[::-1]}},
        key_prefix="f:",
    )
    stage = enriching(service, redis, settings)
    # Promoted, but 2 is warm only once the enrichment routed to 1: the service then routes to 2.
    assert isinstance(service.tables, Tables)
    await manager(service).cache.get("fraud", "1")
    service.tables.tables["fraud"] = fraud_table(ev.Promoted("2"))
    original = service.process

    async def warm_then_process(
        tasks: Sequence[InferenceTask], waits_ms: Sequence[float]
    ) -> list[ResultRecord]:
        await manager(service).cache.get("fraud", "2")
        return await original(tasks, waits_ms)

    service.process = warm_then_process  # type: ignore[method-assign]
    (result,) = await run(stage, [by_entity("r", "u1")])
    assert result["status"] == "UNAVAILABLE"
    assert "routing moved" in error_of(result)["message"]


async def test_requests_without_an_entity_pass_through_untouched() -> None:
    service, _ = make_service()
    redis = FakeRedis()
    plain = task("p")
    inputs = list(plain.request["inputs"])
    (result,) = await run(enriching(service, redis), [plain])
    assert result["status"] == "OK"
    assert plain.request["inputs"] == inputs
    assert redis.round_trips == 0
    assert struct.calcsize("<4f") == len(inputs[0]["data"])


async def test_an_expired_request_is_answered_without_fetching_its_features() -> None:
    service, _ = make_service()
    redis = FakeRedis()
    (result,) = await run(enriching(service, redis), [by_entity("late", "u1", deadline_ms=1.0)])
    assert result["status"] == "DEADLINE_EXCEEDED"
    assert redis.round_trips == 0
