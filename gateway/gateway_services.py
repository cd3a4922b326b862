"""What the gateway talks to, behind small interfaces, and how the real ones are built.

`GatewayConfig` bundles the settings; `GatewayServices` holds the publisher, the reply feed, the
result store, the model catalog, the result decoder, the audit trail and the probe of the workers'
lag that admission control reads. `kafka_services` builds the real ones (Kafka, Redis, the
registry, the lifecycle feed that says which versions are served and what their signatures are,
the `audit-log` writer, the lag probe); tests build in-memory ones instead.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.serialization import MessageField, SerializationContext
from redis.asyncio import Redis

from tidegate.clients.audit import AuditTrail, KafkaAuditTrail
from tidegate.core.cache_settings import PredictionCacheSettings, cache_redis
from tidegate.core.settings import (
    KafkaSettings,
    PostgresSettings,
    RedisSettings,
    SchemaRegistrySettings,
    TopicSettings,
)
from tidegate.core.telemetry_settings import TracingSettings
from tidegate.core.tracing import TRACING_OFF, Tracing, start_tracing
from tidegate.gateway.admission.admission_settings import AdmissionSettings
from tidegate.gateway.admission.lag_probe import LagProbe
from tidegate.gateway.admission.rate_limit_settings import RateLimitSettings
from tidegate.gateway.auth.auth_settings import AuthSettings
from tidegate.gateway.gateway_settings import GatewaySettings
from tidegate.gateway.modelstate.model_catalog import ModelCatalog
from tidegate.gateway.modelstate.model_health import BreakerStates, ModelHealth
from tidegate.gateway.modelstate.prediction_cache import (
    GatewayPredictionCache,
    VersionResolver,
    table_resolver,
)
from tidegate.gateway.roundtrip.lease import PartitionLease
from tidegate.gateway.roundtrip.reply_feed import KafkaReplyFeed
from tidegate.gateway.roundtrip.reply_router import ReplyFeed
from tidegate.gateway.roundtrip.request_publisher import KafkaRequestPublisher, RequestPublisher
from tidegate.gateway.roundtrip.result_store import RedisResultStore, ResultStore
from tidegate.lifecycle.readmodels.feed import LifecycleFeed
from tidegate.schemas.catalog import INFERENCE_RESULT, load_schema
from tidegate.schemas.codec import AvroDecoder
from tidegate.schemas.records import ResultRecord

__all__ = ["GatewayConfig", "GatewayServices", "ServicesFactory", "kafka_services"]


@dataclass(frozen=True)
class GatewayConfig:
    gateway: GatewaySettings = field(default_factory=GatewaySettings)
    kafka: KafkaSettings = field(default_factory=KafkaSettings)
    topics: TopicSettings = field(default_factory=TopicSettings)
    registry: SchemaRegistrySettings = field(default_factory=SchemaRegistrySettings)
    redis: RedisSettings = field(default_factory=RedisSettings)
    tracing: TracingSettings = field(default_factory=TracingSettings)
    # Who may call (on by default) and where the API keys are (the `api_keys` table).
    auth: AuthSettings = field(default_factory=AuthSettings)
    postgres: PostgresSettings = field(default_factory=PostgresSettings)
    rate_limits: RateLimitSettings = field(default_factory=RateLimitSettings)
    admission: AdmissionSettings = field(default_factory=AdmissionSettings)
    # Which models' answers are cached, and where (docs/prediction-cache.md).
    cache: PredictionCacheSettings = field(default_factory=PredictionCacheSettings)


@dataclass
class GatewayServices:
    catalog: ModelCatalog
    publisher: RequestPublisher
    feed: ReplyFeed
    store: ResultStore
    decode_result: Callable[[bytes], ResultRecord]
    closers: list[Callable[[], Awaitable[None]]] = field(default_factory=list)
    tracing: Tracing = TRACING_OFF
    # Admin actions and failed authentications (`tidegate.gateway.auth.audit_hooks`); None: none
    # kept.
    audit: AuditTrail | None = None
    # Reads the workers' lag for admission (started by the app); None: only this replica's calls.
    lag_probe: LagProbe | None = None
    # The workers' circuit breakers (docs/breakers.md); None: the workers' own 503s only.
    health: BreakerStates | None = None
    # The prediction cache and how the gateway knows the version that would serve; None: off.
    prediction_cache: GatewayPredictionCache | None = None
    resolve_version: VersionResolver | None = None

    async def close(self) -> None:
        for close in self.closers:
            await close()


ServicesFactory = Callable[[GatewayConfig], GatewayServices]


def kafka_services(config: GatewayConfig, *, tracing: Tracing | None = None) -> GatewayServices:
    """The real services. Call it on the event loop that will use them. `tracing` defaults to
    the one `config.tracing` describes (off by default)."""
    closers: list[Callable[[], Awaitable[None]]] = []
    if tracing is None:
        tracing = start_tracing(config.tracing, "gateway")
        built = tracing

        async def stop_tracing() -> None:
            await asyncio.to_thread(built.shutdown)

        closers.append(stop_tracing)

    password = config.redis.password.get_secret_value() if config.redis.password else None
    redis = Redis.from_url(config.redis.url, password=password)
    # One registry client for the process's parts (each costs 40 ms of CPU to make).
    registry = SchemaRegistryClient(config.registry.client_config())
    decoder = AvroDecoder(registry, load_schema(INFERENCE_RESULT))
    ctx = SerializationContext(config.topics.replies, MessageField.VALUE)

    def decode(raw: bytes) -> ResultRecord:
        record: ResultRecord = decoder(raw, ctx)
        return record

    gateway = config.gateway
    lease = PartitionLease(
        redis, topic=config.topics.replies, owner=gateway.replica_id, lease_s=gateway.reply_lease_s
    )
    lifecycle = LifecycleFeed(
        config.kafka, config.topics, registry, name=f"gateway-{gateway.replica_id}"
    )
    lifecycle.start()

    async def stop_lifecycle() -> None:
        await asyncio.to_thread(lifecycle.stop)

    # Started by the app's lifespan (a registry look-up); closing flushes what is queued.
    audit = KafkaAuditTrail(config.kafka, config.topics, registry, service="gateway")

    async def stop_audit() -> None:
        await asyncio.to_thread(audit.close)

    probe = None
    stops = [redis.aclose, stop_lifecycle, stop_audit]
    if config.admission.probe:
        probe = LagProbe(config.kafka, config.topics.requests, config.admission)
        built_probe = probe

        async def stop_probe() -> None:
            await asyncio.to_thread(built_probe.stop)

        stops.append(stop_probe)
    health = ModelHealth(
        config.kafka, config.topics, registry, name=f"gateway-{gateway.replica_id}"
    )
    health.start()

    async def stop_health() -> None:
        await asyncio.to_thread(health.stop)

    stops.append(stop_health)
    catalog = ModelCatalog(lifecycle)
    cache = None
    if config.cache.models:
        cache_client = cache_redis(config.cache, config.redis)
        stops.append(cache_client.aclose)
        cache = GatewayPredictionCache(cache_client, config.cache, replica_id=gateway.replica_id)

    return GatewayServices(
        catalog=catalog,
        publisher=KafkaRequestPublisher(
            config.kafka,
            config.topics,
            registry,
            gateway=gateway,
            tracing=tracing,
            placement=catalog.pool,
            worker_group=config.admission.worker_group,
            warm=catalog.warm_in,
        ),
        feed=KafkaReplyFeed(
            config.kafka,
            config.topics.replies,
            lease,
            decode,
            renew_every_s=gateway.reply_lease_s / 3,
            traced=tracing.enabled,
        ),
        store=RedisResultStore(redis, gateway.result_ttl_s),
        decode_result=decode,
        # Tracing last: what stopping still traces is exported.
        closers=[*stops, *closers],
        tracing=tracing,
        audit=audit,
        lag_probe=probe,
        health=health,
        prediction_cache=cache,
        resolve_version=table_resolver(lifecycle) if cache is not None else None,
    )
