"""One worker's parts, started in order and stopped in reverse (`running_worker`): the Faust app
runs this, and so do the integration tests, so both run the same wiring. One `InferenceWorker`
per lane, sharing the models, the service and one `LaneGate`.
The order and the lanes: docs/worker.md ("Start and stop").
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, cast

from confluent_kafka.schema_registry import SchemaRegistryClient
from redis.asyncio import Redis

from tidegate.agents import worker_metrics as metrics
from tidegate.agents.breakers.breaker_board import BreakerBoard, BreakerPublisher
from tidegate.agents.breakers.breaker_settings import BreakerSettings
from tidegate.agents.inference.inference_service import InferenceService
from tidegate.agents.inference.loaded import ModelCache, ModelLoader, store_loader
from tidegate.agents.inference.shadow import ShadowRunner
from tidegate.agents.inference.version_manager import VersionManager
from tidegate.agents.kafka_io.crash_guard import CrashGuard
from tidegate.agents.kafka_io.failures import default_router
from tidegate.agents.kafka_io.lanes import LaneGate
from tidegate.agents.stages.feature_settings import FeatureSettings
from tidegate.agents.stages.request_stages import front_stages
from tidegate.agents.worker import InferenceWorker
from tidegate.agents.worker_settings import WorkerSettings
from tidegate.clients.producer import LANES, Lane, lane_topic
from tidegate.core.aio import cancel_and_wait
from tidegate.core.cache_settings import PredictionCacheSettings
from tidegate.core.pool_names import DEFAULT_POOL
from tidegate.core.pools import pool_group, pool_topics
from tidegate.core.settings import (
    KafkaSettings,
    PostgresSettings,
    RedisSettings,
    SchemaRegistrySettings,
    TopicSettings,
)
from tidegate.core.telemetry import get_logger
from tidegate.core.telemetry_settings import TracingSettings
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
    "breaker_board",
    "crash_guard",
    "in_pool",
    "lane_settings",
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
    cache: PredictionCacheSettings = field(default_factory=PredictionCacheSettings)
    features: FeatureSettings = field(default_factory=FeatureSettings)
    breaker: BreakerSettings = field(default_factory=BreakerSettings)


@dataclass
class RunningWorker:
    feed: LifecycleFeed
    versions: VersionManager
    shadow: ShadowRunner
    service: InferenceService
    worker: InferenceWorker
    """The real-time lane's worker; `lanes` has every lane's."""
    breakers: BreakerBoard | None = None
    lanes: dict[Lane, InferenceWorker] = field(default_factory=dict)
    gate: LaneGate | None = None


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
    config = in_pool(config)
    metrics.POOL_INFO.labels(config.worker.pool or DEFAULT_POOL).set(1)
    worker_id = config.worker.worker_id
    # One registry client for the process: each costs 40 ms of CPU to make (its TLS context),
    # and one cache of schemas serves every part.
    registry = SchemaRegistryClient(config.registry.client_config())
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

        feed = LifecycleFeed(config.kafka, config.topics, registry, name=f"worker-{worker_id}")
        feed.start()
        stack.push_async_callback(asyncio.to_thread, feed.stop)
        await feed.caught_up(CATCH_UP_S)
        versions = VersionManager(
            ModelCache(loader or store_loader(config.models)),
            feed,
            report,
            worker_id=worker_id,
            max_loaded=config.worker.max_loaded_versions,
            pool=config.worker.pool,
            budget_bytes=budget * 2**20 if (budget := config.worker.memory_budget_mib) else None,
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
        breakers = await breaker_board(config, stack, registry)
        service = InferenceService(
            feed,
            versions,
            worker_id=worker_id,
            shadow=shadow,
            tracer=tracing.tracer,
            timeout_s=failure.policy.timeout_s,
            breakers=breakers,
        )
        front = front_stages(
            service,
            feed,
            versions,
            cache=config.cache,
            features=config.features,
            redis=config.redis,
            worker_id=worker_id,
            closers=stack,
        )
        gate = LaneGate(
            config.worker.batch_share, idle_after_s=config.worker.realtime_idle_ms / 1000.0
        )
        lanes: dict[Lane, InferenceWorker] = {}
        for lane in LANES:
            settings = lane_settings(config.worker, lane)
            topic = lane_topic(config.topics, lane)
            guard = crash_guard(config, topic=topic, group_id=settings.group_id)
            if guard is not None:
                stack.push_async_callback(guard.close)
            worker = InferenceWorker(
                # The stages have `InferenceService.process`, all the worker calls.
                cast(InferenceService, front),
                settings=settings,
                kafka=config.kafka,
                topics=config.topics,
                registry=registry,
                consumer_extra=consumer_extra,
                tracing=tracing,
                failures=failure
                if lane == "realtime"
                else default_router(config.topics, worker_id, config.failure),
                crash_guard=guard,
                relay=retry_relay(config, registry) if lane == "realtime" else None,
                requests_topic=topic,
                lane=gate.realtime if lane == "realtime" else gate.batch,
            )
            holder.append(worker)
            await worker.start()
            stack.push_async_callback(worker.stop)
            lanes[lane] = worker
            log.info("worker %s consuming %s in group %s", worker_id, topic, settings.group_id)
        watchers = [asyncio.create_task(_fail_together(w, lanes)) for w in lanes.values()]
        stack.push_async_callback(cancel_and_wait, watchers)
        log.info(
            "worker %s loaded: %s",
            worker_id,
            ", ".join(f"{n}:{v}" for n, v in versions.cache.loaded()) or "none",
        )
        realtime = lanes["realtime"]
        yield RunningWorker(feed, versions, shadow, service, realtime, breakers, lanes, gate)


def in_pool(config: WorkerConfig) -> WorkerConfig:
    """`config` as its pool's worker runs it: the pool's topics and consumer group (the default
    pool's are `config`'s own)."""
    pool = config.worker.pool
    if pool is None:
        return config
    group = pool_group(config.worker.group_id, pool)
    return dataclasses.replace(
        config,
        topics=pool_topics(config.topics, pool),
        worker=config.worker.model_copy(update={"group_id": group}),
    )


def lane_settings(settings: WorkerSettings, lane: Lane) -> WorkerSettings:
    """A lane's worker settings: the batch lane's group (and transactional id) have a suffix."""
    if lane == "realtime":
        return settings
    update: dict[str, Any] = {"group_id": f"{settings.group_id}-{lane}"}
    if settings.transactional_id:
        update["transactional_id"] = f"{settings.transactional_id}-{lane}"
    return settings.model_copy(update=update)


async def _fail_together(worker: InferenceWorker, lanes: Mapping[Lane, InferenceWorker]) -> None:
    # The process's supervisor watches one lane (`RunningWorker.worker`): a failing lane stops
    # them all, so none is left serving half the work.
    try:
        await worker.wait()
    except Exception as exc:
        for other in lanes.values():
            if other is not worker:
                other.fail(exc)


async def breaker_board(
    config: WorkerConfig, stack: AsyncExitStack, registry: SchemaRegistryClient
) -> BreakerBoard | None:
    """The worker's breakers (None when they are off), publishing to `topics.breakers`; on
    stop, after the worker, its published states are tombstoned and the producer flushed."""
    if not config.breaker.enabled and not config.breaker.models:
        return None
    publisher = BreakerPublisher(config.kafka, config.topics, registry)
    stack.push_async_callback(asyncio.to_thread, publisher.close)
    await asyncio.to_thread(publisher.prepare)
    board = BreakerBoard(config.breaker, worker_id=config.worker.worker_id, publish=publisher)
    stack.callback(board.close)
    return board


def crash_guard(
    config: WorkerConfig, *, topic: str | None = None, group_id: str | None = None
) -> CrashGuard | None:
    """The crash guard of `config.failure` (None when it is off) for one lane's topic and group
    (default: the real-time lane's), on its own Redis client: short timeouts, since a poll waits
    for its write."""
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
        group_id=group_id or config.worker.group_id,
        topic=topic or config.topics.requests,
        crash_limit=config.failure.crash_limit,
    )


def retry_relay(config: WorkerConfig, registry: SchemaRegistryClient) -> RetryRelay | None:
    """The worker process's retry relay; None when it runs none."""
    worker, topics, kafka = config.worker, config.topics, config.kafka
    if not (worker.retry_relay and topics.retry_levels):
        return None
    exactly_once = worker.delivery == "exactly-once"
    transactional = worker.transactional_id or f"{worker.group_id}-{worker.worker_id}"
    return RetryRelay(
        kafka,
        topics,
        registry,
        group_id=f"{worker.group_id}-retry",
        client_id=f"{kafka.client_id}-{worker.worker_id}-retry",
        transactional_id=f"{transactional}-retry" if exactly_once else None,
    )
