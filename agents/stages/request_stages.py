"""The stages a worker runs in front of its inference service, when their settings turn them on:
online feature enrichment first (so the cache keys on the filled-in inputs), then the
prediction cache, then the service."""

from __future__ import annotations

from contextlib import AsyncExitStack

from redis.asyncio import Redis

from tidegate.agents.inference.loaded import Versions
from tidegate.agents.inference.version_manager import TableSource
from tidegate.agents.stages.cached_inference import CachedInference
from tidegate.agents.stages.enrichment import Enrichment
from tidegate.agents.stages.feature_settings import FeatureSettings
from tidegate.agents.stages.pre_route import Service
from tidegate.core.cache_settings import PredictionCacheSettings, cache_redis
from tidegate.core.settings import RedisSettings

__all__ = ["FEATURE_STORE_TIMEOUT_S", "front_stages"]

FEATURE_STORE_TIMEOUT_S = 0.5
"""A batch waits this long at most for its features: then it is answered UNAVAILABLE (retried)."""


def front_stages(
    service: Service,
    tables: TableSource,
    models: Versions,
    *,
    cache: PredictionCacheSettings,
    features: FeatureSettings,
    redis: RedisSettings,
    worker_id: str,
    closers: AsyncExitStack,
) -> Service:
    """`service` behind the stages that are on; their Redis clients close with `closers`."""
    front = service
    if cache.models:
        client = cache_redis(cache, redis)
        closers.push_async_callback(client.aclose)
        front = CachedInference(front, tables, models, client, cache, worker_id=worker_id)
    if features.declared:
        secret = redis.password
        store = Redis.from_url(
            redis.url,
            password=secret.get_secret_value() if secret else None,
            socket_timeout=FEATURE_STORE_TIMEOUT_S,
            socket_connect_timeout=FEATURE_STORE_TIMEOUT_S,
        )
        closers.push_async_callback(store.aclose)
        front = Enrichment(front, tables, models, store, features, worker_id=worker_id)
    return front
