"""Online feature enrichment (`Enrichment`): a stage in front of the inference service that builds
the inputs a request names by `entity_key` from the entity's hash in Redis.
What is declared, read and answered: docs/features.md ("Declaring features", "What a worker does
per batch").
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from redis.asyncio import Redis
from redis.exceptions import RedisError

from tidegate.agents.inference.loaded import Versions
from tidegate.agents.inference.result_builders import Timings, error_result
from tidegate.agents.inference.version_manager import TableSource
from tidegate.agents.stages.feature_settings import UPDATED_AT, FeatureSettings, InputFeatures
from tidegate.agents.stages.feature_store import entity_redis_key
from tidegate.agents.stages.pre_route import Service, pre_route
from tidegate.agents.tasks.inference_task import InferenceTask
from tidegate.core.errors import ConfigurationError, InvalidInputError, ModelUnavailableError
from tidegate.lifecycle.domain.routing import Decision
from tidegate.schemas.prediction_keys import FALLBACK_PREFIX
from tidegate.schemas.records import ResultRecord
from tidegate.schemas.tensors import DATATYPES, from_numpy

__all__ = ["ENTITY_FIELD", "Enrichment"]

ENTITY_FIELD = "entity_key"
"""The field an entity's errors name."""


@dataclass(slots=True)
class _Plan:
    index: int
    decision: Decision
    declared: InputFeatures
    missing: InputFeatures
    entity: str


class Enrichment:
    """`Service` over `inner`, filling declared inputs from the online feature store."""

    def __init__(
        self,
        inner: Service,
        tables: TableSource,
        models: Versions,
        redis: Redis,
        settings: FeatureSettings,
        *,
        worker_id: str,
    ) -> None:
        self._inner = inner
        self._tables = tables
        self._models = models
        self._redis = redis
        self._settings = settings
        self._worker_id = worker_id

    async def process(
        self, tasks: Sequence[InferenceTask], waits_ms: Sequence[float]
    ) -> list[ResultRecord]:
        plans = self._plans(tasks)
        if not plans:
            return await self._inner.process(tasks, waits_ms)
        results: list[ResultRecord | None] = [None] * len(tasks)
        try:
            rows = await self._fetch(plans)
        except (RedisError, OSError) as exc:
            error = ModelUnavailableError(f"the online feature store is unreachable: {exc}")
            for plan in plans:
                results[plan.index] = self._failed(tasks[plan.index], plan, error, waits_ms)
        else:
            for plan, row in zip(plans, rows, strict=True):
                task = tasks[plan.index]
                try:
                    await self._fill(task, plan, row)
                except (InvalidInputError, ConfigurationError) as exc:
                    results[plan.index] = self._failed(task, plan, exc, waits_ms)
        rest = [index for index, result in enumerate(results) if result is None]
        computed = await self._inner.process([tasks[i] for i in rest], [waits_ms[i] for i in rest])
        by_index = {plan.index: plan for plan in plans}
        for index, result in zip(rest, computed, strict=True):
            used = by_index.get(index)
            if used is not None and not self._same_features(tasks[index], used, result):
                moved = ModelUnavailableError(
                    f"routing moved to version {result['model_version']} while the features of "
                    f"version {used.decision.version} were fetched"
                )
                result = self._failed(tasks[index], used, moved, waits_ms)
            results[index] = result
        return [result for result in results if result is not None]

    def _plans(self, tasks: Sequence[InferenceTask]) -> list[_Plan]:
        plans: list[_Plan] = []
        now_ms = time.time() * 1000.0
        for index, task in enumerate(tasks):
            entity = task.request.get(ENTITY_FIELD)
            deadline = task.deadline_ms
            if entity is None or (deadline is not None and deadline <= now_ms):
                continue  # an expired request is answered by the service, never fetched for
            decision = pre_route(self._tables, self._models, task)
            if decision is None:
                continue
            declared = self._settings.inputs(task.model, decision.version)
            if declared is None:
                continue
            carried = {tensor["name"] for tensor in task.request["inputs"]}
            missing = {n: names for n, names in declared.items() if n not in carried}
            if missing:
                plans.append(_Plan(index, decision, declared, missing, str(entity)))
        return plans

    async def _fetch(self, plans: Sequence[_Plan]) -> list[list[bytes | None]]:
        """Every planned entity's declared features and timestamp, in one round trip."""
        pipe = self._redis.pipeline(transaction=False)
        for plan in plans:
            names = [name for features in plan.missing.values() for name in features]
            pipe.hmget(entity_redis_key(self._settings, plan.entity), [*names, UPDATED_AT])
        rows: list[list[bytes | None]] = await pipe.execute()
        return rows

    async def _fill(self, task: InferenceTask, plan: _Plan, row: list[bytes | None]) -> None:
        """Add the missing inputs to the task. Per request, not per batch: each entity's row
        is its own request's input, and a bad value must fail that request alone."""
        *values, updated = row
        if updated is None and all(value is None for value in values):
            raise InvalidInputError(
                f"entity {plan.entity!r} has no online features "
                f"(no hash at {entity_redis_key(self._settings, plan.entity)})",
                ENTITY_FIELD,
            )
        try:
            model = await self._models.get(task.model, plan.decision.version)
        except Exception:
            return  # the service fails the request the same way, with its own words
        arrays = dict(task.arrays or {})
        tensors = list(task.request["inputs"])
        start = 0
        for name, features in plan.missing.items():
            chunk = values[start : start + len(features)]
            start += len(features)
            spec = model.signature.input(name)
            if spec is None or spec.datatype == "BYTES" or not spec.accepts([1, len(features)]):
                raise ConfigurationError(
                    f"{task.model} version {plan.decision.version}: {len(features)} features are "
                    f"declared for input {name!r}, which is "
                    f"{f'{spec.datatype} {list(spec.shape)}' if spec else 'not an input'}"
                )
            array = _row(plan.entity, features, chunk).astype(DATATYPES[spec.datatype])
            arrays[name] = array
            tensors.append(from_numpy(name, array))
        task.arrays = arrays
        task.request["inputs"] = tensors
        task.features_at = _timestamp(updated)

    def _same_features(self, task: InferenceTask, plan: _Plan, result: ResultRecord) -> bool:
        served = result.get("model_version")
        if served is None or served == plan.decision.version:
            return True
        if str(result.get("routing_rule") or "").startswith(FALLBACK_PREFIX):
            return True  # a fallback model takes the primary's inputs as they are, by contract
        return self._settings.inputs(task.model, str(served)) == plan.declared

    def _failed(
        self,
        task: InferenceTask,
        plan: _Plan,
        exc: BaseException,
        waits_ms: Sequence[float],
    ) -> ResultRecord:
        return error_result(
            task,
            exc,
            worker_id=self._worker_id,
            version=plan.decision.version,
            timings=Timings(batch_ms=waits_ms[plan.index]),
            rule=plan.decision.rule,
        )


def _row(entity: str, features: Sequence[str], values: Sequence[bytes | None]) -> Any:
    """The `[1, N]` float64 row of one entity's features."""
    parsed: list[float] = []
    for name, value in zip(features, values, strict=True):
        if value is None:
            raise InvalidInputError(f"entity {entity!r} lacks feature {name!r}", ENTITY_FIELD)
        try:
            parsed.append(float(value))
        except ValueError:
            raise InvalidInputError(
                f"entity {entity!r} feature {name!r} is not a number: {value[:32]!r}",
                ENTITY_FIELD,
            ) from None
    return np.asarray(parsed, dtype=np.float64).reshape(1, len(parsed))


def _timestamp(value: bytes | None) -> float | None:
    """`_updated_at` in epoch ms; None when absent or not a number (written by hand)."""
    if value is None:
        return None
    try:
        return float(value)
    except ValueError:
        return None
