"""The worker's prediction cache against the real Kafka, schema registry, PostgreSQL and Redis:
a repeated request is answered from Redis, marked `cached`, without the model; a promotion never
serves the old version's answer; the gateway's lookup finds what the worker stored.

Models are the shared tiny ONNX versions 1 and 2 (`tests.integration.workers`), served by the
real runtime behind a wrapper that counts the rows the model computed.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, cast

import numpy as np
import numpy.typing as npt
import pytest
from redis.asyncio import Redis

from tests.integration.workers import (
    Reader,
    Stack,
    controller_relay,
    in_thread,
    publish,
    request,
    tiny_softmax,
)
from tests.support import eventually, unique
from tidegate.agents.assembly import RunningWorker, WorkerConfig, running_worker
from tidegate.agents.inference.loaded import LoadedModel, store_loader
from tidegate.agents.worker_settings import WorkerSettings
from tidegate.core.cache_settings import PredictionCacheSettings
from tidegate.core.settings import RedisSettings
from tidegate.dlq.failure_settings import FailureSettings
from tidegate.gateway.modelstate.prediction_cache import GatewayPredictionCache, table_resolver
from tidegate.lifecycle.domain import events as ev
from tidegate.models.manifest import ModelPackage
from tidegate.models.model_settings import ModelSettings
from tidegate.models.runtime.contract import Arrays, ModelRuntime
from tidegate.schemas.records import RequestRecord
from tidegate.schemas.tensors import to_numpy

FEATURES = [0.5, -1.0, 2.0, 0.25]


class CountingRuntime(ModelRuntime):
    """The real runtime, counting the rows each version computed."""

    def __init__(self, inner: ModelRuntime, rows: dict[str, int], version: str) -> None:
        self.inner, self.rows, self.version = inner, rows, version
        self.device = inner.device

    async def load(self, package: ModelPackage) -> None:
        """Loaded already."""

    async def infer(self, inputs: Arrays) -> dict[str, npt.NDArray[Any]]:
        self.rows[self.version] = self.rows.get(self.version, 0) + len(inputs["features"])
        return await self.inner.infer(inputs)

    async def on_unload(self) -> None:
        await self.inner.on_unload()


@pytest.fixture
def cache() -> PredictionCacheSettings:
    return PredictionCacheSettings(models=frozenset({"tiny"}), key_prefix=f"{unique('pc')}:")


@pytest.fixture
async def redis(cache: PredictionCacheSettings) -> AsyncIterator[Redis]:
    client = Redis.from_url(RedisSettings().url)
    yield client
    keys = [key async for key in client.scan_iter(match=f"{cache.key_prefix}*")]
    if keys:
        await client.delete(*keys)
    await client.aclose()


@asynccontextmanager
async def cached_worker(
    stack: Stack, models: ModelSettings, cache: PredictionCacheSettings, rows: dict[str, int]
) -> AsyncIterator[RunningWorker]:
    real = store_loader(models)

    async def loader(name: str, version: str) -> LoadedModel:
        model = await real(name, version)
        return dataclasses.replace(model, runtime=CountingRuntime(model.runtime, rows, version))

    config = WorkerConfig(
        worker=WorkerSettings(group_id=stack.group, worker_id="it", metrics_port=0),
        kafka=stack.kafka,
        topics=stack.topics,
        models=models,
        registry=stack.registry,
        postgres=stack.pg,
        failure=FailureSettings(crash_guard=False),
        cache=cache,
    )
    # The controller's relay publishes the worker's reports (VersionLoaded) to the lifecycle.
    async with controller_relay(stack), running_worker(config, loader=loader) as worker:
        yield worker


def probabilities(result: dict[str, Any]) -> npt.NDArray[Any]:
    (output,) = result["outputs"]
    return to_numpy(output)


async def answer(stack: Stack, reader: Reader, rid: str) -> dict[str, Any]:
    publish(stack, [request(rid, f"key-{rid}", FEATURES)])
    count = len(reader.records) + 1
    records = await in_thread(reader.until, count)
    found: list[dict[str, Any]] = [r for r in records if r["request_id"] == rid]
    assert len(found) == 1, found
    return found[0]


async def test_a_repeated_request_is_answered_from_the_cache_without_the_model(
    stack: Stack, models: ModelSettings, cache: PredictionCacheSettings, redis: Redis
) -> None:
    rows: dict[str, int] = {}
    results = Reader(stack, stack.topics.results)
    async with cached_worker(stack, models, cache, rows):
        first = await answer(stack, results, "first")
        assert (first["status"], first["model_version"], first["cached"]) == ("OK", "1", False)
        computed = dict(rows)
        assert computed == {"1": 1}
        again = await answer(stack, results, "again")
    assert (again["status"], again["model_version"], again["cached"]) == ("OK", "1", True)
    assert rows == computed, "a cache hit must not call the model"
    np.testing.assert_array_equal(probabilities(again), probabilities(first))
    np.testing.assert_allclose(
        probabilities(again), tiny_softmax("1", np.array([FEATURES])), rtol=1e-6
    )
    (key,) = [key async for key in redis.scan_iter(match=f"{cache.key_prefix}tiny:1:*")]
    ttl_ms = await redis.pttl(key)
    assert 0 < ttl_ms <= cache.ttl_s * 1000
    results.close()


async def test_a_promotion_never_serves_the_old_versions_cached_answer(
    stack: Stack, models: ModelSettings, cache: PredictionCacheSettings, redis: Redis
) -> None:
    rows: dict[str, int] = {}
    results = Reader(stack, stack.topics.results)
    async with cached_worker(stack, models, cache, rows) as worker:
        old = await answer(stack, results, "old")
        assert (old["model_version"], old["cached"]) == ("1", False)
        await stack.append(ev.Promoted("2"))

        async def promoted() -> bool:
            # Routed to 2, not only its primary: the promotion's event names the primary before
            # the weights move to it (a later event), and until then the split still says 1.
            table = worker.feed.table("tiny")
            if table is None or not worker.versions.ready("tiny", "2"):
                return False
            ready = worker.versions.ready
            routed = table.route(tenant="default", key="key-new", ready=lambda v: ready("tiny", v))
            return routed.version == "2"

        await eventually(promoted, what="tiny 2 promoted and warm on the worker", timeout=60)
        new = await answer(stack, results, "new")
        again = await answer(stack, results, "again")
    assert (new["model_version"], new["cached"]) == ("2", False)
    np.testing.assert_allclose(
        probabilities(new), tiny_softmax("2", np.array([FEATURES])), rtol=1e-6
    )
    assert not np.allclose(probabilities(new), probabilities(old))
    assert (again["model_version"], again["cached"]) == ("2", True)
    np.testing.assert_array_equal(probabilities(again), probabilities(new))
    assert rows == {"1": 1, "2": 1}
    results.close()


async def test_the_gateway_finds_what_a_worker_stored(
    stack: Stack, models: ModelSettings, cache: PredictionCacheSettings, redis: Redis
) -> None:
    rows: dict[str, int] = {}
    results = Reader(stack, stack.topics.results)
    async with cached_worker(stack, models, cache, rows) as worker:
        computed = await answer(stack, results, "computed")
        gateway = GatewayPredictionCache(redis, cache, replica_id="it")
        # An explicit version is certain before any worker routes; so is a pin.
        # `request` (shared with `publish`, which takes any dict) builds a complete
        # InferenceRequest as a plain dict.
        record = cast(
            RequestRecord,
            request("http-call", "k", FEATURES, model_version="1", outputs=[], parameters={}),
        )
        hit = await gateway.lookup("tiny", table_resolver(worker.feed), record)
        split = cast(RequestRecord, request("http-split", "k", FEATURES, outputs=[], parameters={}))
        uncertain = await gateway.lookup("tiny", table_resolver(worker.feed), split)
    assert hit is not None
    assert (hit["request_id"], hit["model_version"], hit["cached"]) == ("http-call", "1", True)
    np.testing.assert_array_equal(to_numpy(hit["outputs"][0]), probabilities(computed))
    assert uncertain is None, "tiny 2 is servable too: only a worker can route a split"
    results.close()
