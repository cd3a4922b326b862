"""The gateway's side of the prediction cache (`GatewayPredictionCache`): answer a call from Redis
before publishing it, only when the version is certain before any worker sees the request
(`certain_route`), and never for a request that names an `entity_key`.
When and why: docs/prediction-cache.md ("Where it is consulted").
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime
from typing import Protocol

from prometheus_client import Counter
from redis.asyncio import Redis
from redis.exceptions import RedisError

from tidegate.core.cache_settings import PredictionCacheSettings
from tidegate.core.telemetry import get_logger
from tidegate.lifecycle.domain.routing import EXPLICIT, Decision, RoutingTable
from tidegate.schemas.prediction_keys import (
    cacheable_result,
    decode_outputs,
    encode_outputs,
    prediction_key,
)
from tidegate.schemas.records import RequestRecord, ResultRecord, TensorRecord

__all__ = [
    "GATEWAY_CACHE_EVENTS",
    "GatewayPredictionCache",
    "VersionResolver",
    "certain_route",
    "table_resolver",
]

log = get_logger(__name__)

GATEWAY_CACHE_EVENTS = Counter(
    "tidegate_gateway_prediction_cache_total",
    "Prediction cache lookups and stores by the gateway, by model and outcome (hit, miss, "
    "uncertain: the version is not known before a worker routes, stored, too_large, error).",
    ["model", "outcome"],
)

VersionResolver = Callable[[str, RequestRecord], Decision | None]
"""(model, record) -> the version that will serve the record and why; None when not certain."""


class Tables(Protocol):
    """The part of `LifecycleFeed` the resolver reads."""

    def table(self, model: str) -> RoutingTable | None: ...


def certain_route(table: RoutingTable, record: RequestRecord) -> Decision | None:
    """The worker's decision for `record`, when every worker must take it; else None."""
    try:
        decision = table.route(
            tenant=record.get("tenant") or "default",
            key=record.get("routing_key") or str(record["request_id"]),
            requested=record.get("model_version"),
        )
    except Exception:
        return None  # the worker answers it (unknown version, no traffic): nothing to serve
    if decision.rule == EXPLICIT or decision.rule.startswith("pin:"):
        return decision
    if table.servable == {decision.version}:
        return decision  # one servable version: no split or fallback can choose another
    return None


def table_resolver(tables: Tables) -> VersionResolver:
    """A resolver over the lifecycle feed's routing tables."""

    def resolve(model: str, record: RequestRecord) -> Decision | None:
        table = tables.table(model)
        return certain_route(table, record) if table is not None else None

    return resolve


class GatewayPredictionCache:
    def __init__(self, redis: Redis, settings: PredictionCacheSettings, *, replica_id: str) -> None:
        self._redis = redis
        self._settings = settings
        self._worker_id = f"gateway-{replica_id}"
        self._ttl_ms = int(settings.ttl_s * 1000)

    def _key(self, model: str, version: str, record: RequestRecord) -> str:
        return prediction_key(
            self._settings.key_prefix,
            model,
            version,
            record["inputs"],
            record.get("outputs") or (),
            record.get("parameters"),
            tenant=str(record.get("tenant") or "default"),
        )

    def _cacheable(self, model: str, record: RequestRecord) -> bool:
        return self._settings.enabled(model) and not record.get("entity_key")

    async def lookup(
        self, model: str, version_resolver: VersionResolver, record: RequestRecord
    ) -> ResultRecord | None:
        """The `InferenceResult` of `record` from the cache, marked `cached`; None when it must
        be published (not cached, version not certain, a miss, or Redis failing)."""
        if not self._cacheable(model, record):
            return None
        decision = version_resolver(model, record)
        if decision is None:
            GATEWAY_CACHE_EVENTS.labels(model, "uncertain").inc()
            return None
        try:
            value = await self._redis.get(self._key(model, decision.version, record))
        except (RedisError, OSError) as exc:
            log.warning("prediction cache lookup failed, publishing instead: %s", exc)
            GATEWAY_CACHE_EVENTS.labels(model, "error").inc()
            return None
        if value is None:
            GATEWAY_CACHE_EVENTS.labels(model, "miss").inc()
            return None
        try:
            outputs = decode_outputs(value)
        except ValueError as exc:
            log.warning("ignoring a damaged prediction cache entry for %s: %s", model, exc)
            GATEWAY_CACHE_EVENTS.labels(model, "miss").inc()
            return None
        GATEWAY_CACHE_EVENTS.labels(model, "hit").inc()
        return self._result(record, decision, outputs)

    async def store(self, record: RequestRecord, result: ResultRecord) -> None:
        """Keep an OK, computed answer (the workers store theirs already: this is for a
        gateway whose workers run without the cache stage)."""
        model, version = str(record["model"]), result.get("model_version")
        if not self._cacheable(model, record) or not cacheable_result(result):
            return
        value = encode_outputs(result.get("outputs") or [])
        if len(value) > self._settings.max_entry_bytes:
            GATEWAY_CACHE_EVENTS.labels(model, "too_large").inc()
            return
        try:
            await self._redis.set(self._key(model, str(version), record), value, px=self._ttl_ms)
        except (RedisError, OSError) as exc:
            log.warning("prediction cache store failed: %s", exc)
            GATEWAY_CACHE_EVENTS.labels(model, "error").inc()
            return
        GATEWAY_CACHE_EVENTS.labels(model, "stored").inc()

    def _result(
        self, record: RequestRecord, decision: Decision, outputs: list[TensorRecord]
    ) -> ResultRecord:
        """An `InferenceResult` as a worker would write it for a cached answer."""
        now = time.time() * 1000.0
        created = record.get("created_at")
        created_ms = created.timestamp() * 1000.0 if isinstance(created, datetime) else None
        return {
            "request_id": str(record["request_id"]),
            "model": str(record["model"]),
            "model_version": decision.version,
            "status": "OK",
            "outputs": outputs,
            "error": None,
            "timings": {
                "queue_ms": 0.0,
                "batch_ms": 0.0,
                "compute_ms": 0.0,
                "total_ms": max(0.0, now - created_ms) if created_ms is not None else 0.0,
            },
            "batch_size": 0,
            "worker_id": self._worker_id,
            "source": None,
            "routing_rule": decision.rule,
            "tenant": record.get("tenant") or "default",
            "routing_key": record.get("routing_key"),
            "completed_at": int(now),
            "request_schema_id": None,
            "request_digest": None,
            "attempt": 1,
            "origin": None,
            "history": [],
            "cached": True,
            "features_at": None,
        }
