"""The worker's prediction cache (`CachedInference`): a stage in front of the inference service that
answers a request from Redis when the same version already answered the same question. It is an
optimisation, never a dependency: when Redis fails, the batch is computed.
Keys, lookups and stores: docs/prediction-cache.md ("Where it is consulted", "When Redis fails").
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from prometheus_client import Counter
from redis.asyncio import Redis
from redis.exceptions import RedisError

from tidegate.agents import worker_metrics as metrics
from tidegate.agents.inference.result_builders import Timings, ok_result
from tidegate.agents.inference.version_manager import TableSource
from tidegate.agents.stages.pre_route import Ready, Service, pre_route
from tidegate.agents.tasks.inference_task import InferenceTask
from tidegate.core.cache_settings import PredictionCacheSettings
from tidegate.core.telemetry import get_logger
from tidegate.lifecycle.domain.routing import Decision
from tidegate.schemas.prediction_keys import (
    cacheable_result,
    decode_outputs,
    encode_outputs,
    prediction_key,
)
from tidegate.schemas.records import ResultRecord

__all__ = ["CACHE_EVENTS", "CachedInference", "cache_key"]

log = get_logger(__name__)

CACHE_EVENTS = Counter(
    "tidegate_prediction_cache_total",
    "Prediction cache lookups and stores by the workers, by model and outcome "
    "(hit, miss, stored, too_large, error).",
    ["model", "outcome"],
)


def cache_key(settings: PredictionCacheSettings, task: InferenceTask, version: str) -> str:
    request = task.request
    return prediction_key(
        settings.key_prefix,
        task.model,
        version,
        request["inputs"],
        request.get("outputs") or (),
        request.get("parameters"),
        tenant=str(request.get("tenant") or "default"),
    )


class CachedInference:
    """`Service` over `inner`, answering what the cache holds."""

    def __init__(
        self,
        inner: Service,
        tables: TableSource,
        models: Ready,
        redis: Redis,
        settings: PredictionCacheSettings,
        *,
        worker_id: str,
    ) -> None:
        self._inner = inner
        self._tables = tables
        self._models = models
        self._redis = redis
        self._settings = settings
        self._worker_id = worker_id
        self._ttl_ms = int(settings.ttl_s * 1000)

    async def process(
        self, tasks: Sequence[InferenceTask], waits_ms: Sequence[float]
    ) -> list[ResultRecord]:
        lookups = self._lookups(tasks)
        if not lookups:
            return await self._inner.process(tasks, waits_ms)
        values = await self._get([key for _, _, key in lookups])
        if values is None:
            for model in {tasks[index].model for index, _, _ in lookups}:
                CACHE_EVENTS.labels(model, "error").inc()
        results: list[ResultRecord | None] = [None] * len(tasks)
        for (index, decision, _), value in zip(lookups, values or [], strict=False):
            results[index] = self._hit(tasks[index], decision, value, waits_ms[index])
        misses = [index for index, result in enumerate(results) if result is None]
        if misses:
            computed = await self._inner.process(
                [tasks[i] for i in misses], [waits_ms[i] for i in misses]
            )
            for index, result in zip(misses, computed, strict=True):
                results[index] = result
            if values is not None:  # Redis answered: storing is worth one more round trip
                await self._store([(tasks[i], results[i]) for i in misses])
        done = [result for result in results if result is not None]
        self._count(lookups, done)
        return done

    def _lookups(self, tasks: Sequence[InferenceTask]) -> list[tuple[int, Decision, str]]:
        """(index, decision, key) of each task the cache may answer. Those past their deadline
        are left to the service, which answers them DEADLINE_EXCEEDED."""
        now_ms = time.time() * 1000.0
        out: list[tuple[int, Decision, str]] = []
        for index, task in enumerate(tasks):
            if not self._settings.enabled(task.model):
                continue
            deadline = task.deadline_ms
            if deadline is not None and deadline <= now_ms:
                continue
            decision = pre_route(self._tables, self._models, task)
            if decision is not None:
                out.append((index, decision, cache_key(self._settings, task, decision.version)))
        return out

    async def _get(self, keys: list[str]) -> list[bytes | None] | None:
        try:
            values: list[bytes | None] = await self._redis.mget(keys)
        except (RedisError, OSError) as exc:
            log.warning("prediction cache lookup failed, computing instead: %s", exc)
            return None
        return values

    def _hit(
        self, task: InferenceTask, decision: Decision, value: bytes | None, waited_ms: float
    ) -> ResultRecord | None:
        if value is None:
            return None
        try:
            outputs = decode_outputs(value)
        except ValueError as exc:
            log.warning("ignoring a damaged prediction cache entry for %s: %s", task.model, exc)
            return None
        return ok_result(
            task,
            outputs,
            version=decision.version,
            timings=Timings(batch_ms=waited_ms),
            worker_id=self._worker_id,
            rule=decision.rule,
            cached=True,
        )

    async def _store(self, computed: Sequence[tuple[InferenceTask, ResultRecord | None]]) -> None:
        limit = self._settings.max_entry_bytes
        pipe = self._redis.pipeline(transaction=False)
        stored: dict[str, int] = {}
        for task, result in computed:
            if result is None or not cacheable_result(result):
                continue
            if not self._settings.enabled(task.model):
                continue
            value = encode_outputs(result["outputs"])
            if len(value) > limit:
                CACHE_EVENTS.labels(task.model, "too_large").inc()
                continue
            version = result.get("model_version")
            if version is None:  # never for a computed OK answer: cacheable_result checked it
                continue
            pipe.set(cache_key(self._settings, task, version), value, px=self._ttl_ms)
            stored[task.model] = stored.get(task.model, 0) + 1
        if not stored:
            return
        try:
            await pipe.execute()
        except (RedisError, OSError) as exc:
            log.warning("prediction cache store failed: %s", exc)
            for model in stored:
                CACHE_EVENTS.labels(model, "error").inc()
            return
        for model, count in stored.items():
            CACHE_EVENTS.labels(model, "stored").inc(count)

    def _count(self, lookups: list[tuple[int, Decision, str]], results: list[ResultRecord]) -> None:
        """Per batch: hits and misses per model, and the hits in the worker's request metrics
        (the service counts only what it answered)."""
        counts: dict[tuple[str, str], int] = {}
        hits: dict[tuple[str, str], int] = {}
        for index, _, _ in lookups:
            result = results[index]
            model = result["model"]
            outcome = "hit" if result["cached"] else "miss"
            counts[(model, outcome)] = counts.get((model, outcome), 0) + 1
            if result["cached"]:
                hit = (model, result.get("model_version") or "")
                hits[hit] = hits.get(hit, 0) + 1
                metrics.end_to_end(model).observe(result["timings"]["total_ms"] / 1000.0)
        for (model, outcome), count in counts.items():
            CACHE_EVENTS.labels(model, outcome).inc(count)
        for (model, version), count in hits.items():
            metrics.requests(model, version, "OK").inc(count)
