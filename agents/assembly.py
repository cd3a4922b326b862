"""One worker's parts, started in order and stopped in reverse: the Faust app runs this, and so do
the integration tests (with their own model loaders), so both run the same wiring.

Start order: the lifecycle log (to report loads), the lifecycle feed (caught up with the whole
`model-lifecycle` topic), the version manager (every wanted version loaded, warmed up and
reported), the shadow runner, then consumption. Stop is the reverse: stop consuming and drain,
abandon running shadow comparisons, unload and report every version, stop the feed, close the log.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka.schema_registry import SchemaRegistryClient
from redis.asyncio import Redis

from tidegate.agents.crash_guard import CrashGuard
from tidegate.agents.dataplane import InferenceService
from tidegate.agents.failures import default_router
from tidegate.agents.loaded import ModelCache, ModelLoader, store_loader
from tidegate.agents.shadow import ShadowRunner
from tidegate.agents.version_manager import VersionManager
from tidegate.agents.worker import InferenceWorker
from tidegate.agents.worker_settings import WorkerSettings
from tidegate.core.settings import (
    KafkaSettings,
    PostgresSettings,
    RedisSettings,
    SchemaRegistrySettings,
    TopicSettings,
    TracingSettings,
)
from tidegate.core.telemetry import get_logger
from tidegate.core.tracing import Tracing, start_tracing
from tidegate.dlq.failure_settings import FailureSettings
from tidegate.dlq.retry_relay import RetryRelay
from tidegate.lifecycle.domain.events import NewEvent
from tidegate.lifecycle.eventstore.lifecycle_log import LifecycleLog
from tidegate.lifecycle.lifecycle_settings import LifecycleSettings
from tidegate.lifecycle.readmodels.feed import LifecycleFeed
from tidegate.models.model_settings import ModelSettings

__all__ = [
    "CATCH_UP_S",
    "RunningWorker",
    "WorkerConfig",
    "crash_guard",
    "retry_relay",
    "running_worker",
]

log = get_logger(__name__)

CATCH_UP_S = 60.0
"""Replaying the lifecycle topic is a few thousand small events: a minute means Kafka is gone."""


@dataclass(frozen=True)
class WorkerConfig:
    worker: WorkerSettings = field(default_factory=WorkerSettings)
    kafka: KafkaSettings = field(default_factory=KafkaSettings)
    topics: TopicSettings = field(default_factory=TopicSettings)
    models: ModelSettings = field(default_factory=ModelSettings)
    registry: SchemaRegistrySettings = field(default_factory=SchemaRegistrySettings)
    postgres: PostgresSettings = field(default_factory=PostgresSettings)
    lifecycle: LifecycleSettings = field(default_factory=LifecycleSettings)
    tracing: TracingSettings = field(default_factory=TracingSettings)
    failure: FailureSettings = field(default_factory=FailureSettings)
    redis: RedisSettings = field(default_factory=RedisSettings)


@dataclass
class RunningWorker:
    feed: LifecycleFeed
    versions: VersionManager
    shadow: ShadowRunner
    service: InferenceService
    worker: InferenceWorker


@asynccontextmanager
async def running_worker(
    config: WorkerConfig,
    *,
    loader: ModelLoader | None = None,
    consumer_extra: Mapping[str, Any] | None = None,
    tracing: Tracing | None = None,
) -> AsyncIterator[RunningWorker]:
    """A started worker; leaving the block stops it gracefully. `loader` defaults to the artifact
    store of `config.models`, `tracing` to the one `config.tracing` describes (off by default)."""
    worker_id = config.worker.worker_id
    async with AsyncExitStack() as stack:
        if tracing is None:
            tracing = start_tracing(config.tracing, "worker")
            # Last out: what the worker's stop still traces is exported before the process ends.
            stack.callback(tracing.shutdown)
        lifecycle = await stack.enter_async_context(
            # Serving never needs PostgreSQL, so a worker starts without it; its load reports
            # are retried until the event store answers.
            LifecycleLog.from_settings(
                config.postgres,
                config.lifecycle,
                config.kafka,
                config.topics,
                config.registry,
                require_store=False,
            )
        )

        async def report(model: str, events: Sequence[NewEvent]) -> object:
            # Facts about this worker hold whatever the stream's state: no expected version.
            return await lifecycle.append(model, events, expected_version=None)

        feed = LifecycleFeed(
            config.kafka, config.topics, config.registry, name=f"worker-{worker_id}"
        )
        feed.start()
        stack.push_async_callback(asyncio.to_thread, feed.stop)
        await feed.caught_up(CATCH_UP_S)
        versions = VersionManager(
            ModelCache(loader or store_loader(config.models)),
            feed,
            report,
            worker_id=worker_id,
            max_loaded=config.worker.max_loaded_versions,
        )
        feed.add_listener(versions.changed)
        stack.push_async_callback(versions.stop)
        failures = await versions.start(feed.states())
        for (name, version), why in failures.items():
            log.error("%s version %s cannot serve from this worker: %s", name, version, why)
        holder: list[InferenceWorker] = []

        def publish_shadow(comparison: dict[str, Any]) -> None:
            # Comparisons start only after requests were consumed, so the worker exists.
            holder[0].publisher.shadow(comparison)

        shadow = ShadowRunner(
            versions,
            publish_shadow,
            worker_id=worker_id,
            max_in_flight=config.worker.shadow_max_in_flight,
        )
        stack.push_async_callback(shadow.stop)
        failure = default_router(config.topics, worker_id, config.failure)
        service = InferenceService(
            feed,
            versions,
            worker_id=worker_id,
            shadow=shadow,
            tracer=tracing.tracer,
            timeout_s=failure.policy.timeout_s,
        )
        guard = crash_guard(config)
        if guard is not None:
            stack.push_async_callback(guard.close)
        worker = InferenceWorker(
            service,
            settings=config.worker,
            kafka=config.kafka,
            topics=config.topics,
            registry=config.registry,
            consumer_extra=consumer_extra,
            tracing=tracing,
            failures=failure,
            crash_guard=guard,
            relay=retry_relay(config),
        )
        holder.append(worker)
        await worker.start()
        stack.push_async_callback(worker.stop)
        log.info(
            "worker %s consuming %s in group %s (loaded: %s)",
            worker_id,
            config.topics.requests,
            config.worker.group_id,
            ", ".join(f"{n}:{v}" for n, v in versions.cache.loaded()) or "none",
        )
        yield RunningWorker(feed, versions, shadow, service, worker)


def crash_guard(config: WorkerConfig) -> CrashGuard | None:
    """The crash guard of `config.failure` (None when it is off), on its own Redis client: short
    timeouts, since a poll waits for its write."""
    if not config.failure.crash_guard:
        return None
    secret = config.redis.password
    redis = Redis.from_url(
        config.redis.url,
        password=secret.get_secret_value() if secret else None,
        socket_timeout=0.5,
        socket_connect_timeout=0.5,
    )
    return CrashGuard(
        redis,
        group_id=config.worker.group_id,
        topic=config.topics.requests,
        crash_limit=config.failure.crash_limit,
    )


def retry_relay(config: WorkerConfig) -> RetryRelay | None:
    """The worker process's retry relay; None when it runs none."""
    worker, topics, kafka = config.worker, config.topics, config.kafka
    if not (worker.retry_relay and topics.retry_levels):
        return None
    exactly_once = worker.delivery == "exactly-once"
    transactional = worker.transactional_id or f"{worker.group_id}-{worker.worker_id}"
    return RetryRelay(
        kafka,
        topics,
        SchemaRegistryClient(config.registry.client_config()),
        group_id=f"{worker.group_id}-retry",
        client_id=f"{kafka.client_id}-{worker.worker_id}-retry",
        transactional_id=f"{transactional}-retry" if exactly_once else None,
    )
