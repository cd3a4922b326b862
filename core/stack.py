"""The local stack's topic layout and health probes, shared by `tidegate stack` and the tests.

Topic specs are derived from `TopicSettings` only, so the layout lives in one place. Client
libraries (confluent-kafka, psycopg, redis, httpx) are imported inside the functions that use them,
which keeps `tidegate --help` fast.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from tidegate.core.kafka import make_admin
from tidegate.core.settings import (
    KafkaSettings,
    PostgresSettings,
    RedisSettings,
    RegistryServerSettings,
    SchemaRegistrySettings,
    TopicSettings,
)

if TYPE_CHECKING:
    from confluent_kafka.admin import AdminClient

__all__ = [
    "KEY_CONFIGS",
    "EnsureResult",
    "TopicSpec",
    "TopicState",
    "describe_topics",
    "ensure_topics",
    "probe_kafka",
    "probe_postgres",
    "probe_redis",
    "probe_registry",
    "topic_specs",
    "wait_healthy",
]

# The topic configs `tidegate stack status` shows.
KEY_CONFIGS = ("cleanup.policy", "retention.ms", "retention.bytes")


@dataclass(frozen=True)
class TopicSpec:
    """A topic as the stack wants it."""

    name: str
    partitions: int
    replication_factor: int
    config: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class TopicState:
    """A topic as the cluster has it."""

    name: str
    partitions: int
    replication_factor: int
    config: Mapping[str, str]


@dataclass
class EnsureResult:
    """What `ensure_topics` did: created, already there, existing ones whose partitions differ."""

    created: list[str] = field(default_factory=list)
    existing: list[str] = field(default_factory=list)
    mismatched: dict[str, tuple[int, int]] = field(default_factory=dict)  # name: (wanted, actual)


def _deleting(retention_ms: int) -> dict[str, str]:
    return {"cleanup.policy": "delete", "retention.ms": str(retention_ms)}


def topic_specs(
    topics: TopicSettings, registry: RegistryServerSettings | None = None
) -> list[TopicSpec]:
    """Every topic of the stack, with partitions, replication and retention from the settings."""
    rf = topics.replication_factor
    registry = registry or RegistryServerSettings()
    return [
        TopicSpec(topics.requests, topics.partitions, rf, _deleting(topics.retention_ms)),
        # The batch lane (docs/lanes.md): the same layout, its own topic so a flood of it queues
        # there and not ahead of real-time requests.
        TopicSpec(topics.requests_batch, topics.partitions, rf, _deleting(topics.retention_ms)),
        TopicSpec(topics.results, topics.partitions, rf, _deleting(topics.retention_ms)),
        # Replies to gateway replicas: each replica owns one partition; results there are only
        # a delivery path (the durable copy is in the results topic), so they expire quickly.
        TopicSpec(
            topics.replies, topics.reply_partitions, rf, _deleting(topics.reply_retention_ms)
        ),
        TopicSpec(topics.failed, topics.dlq_partitions, rf, _deleting(topics.dlq_retention_ms)),
        TopicSpec(topics.poison, topics.dlq_partitions, rf, _deleting(topics.dlq_retention_ms)),
        # Retry topics hold requests waiting out a delay: as many partitions as the dead-letter
        # topics, and kept as long, since a delay may outlast a worker outage.
        *(
            TopicSpec(topic, topics.dlq_partitions, rf, _deleting(topics.dlq_retention_ms))
            for topic in topics.retry_topics()
        ),
        # The lifecycle is event-sourced: its state is rebuilt by replaying the whole topic, so it
        # is never compacted (compaction would drop history) and never expires. One partition
        # keeps a single total order of events.
        TopicSpec(
            topics.lifecycle,
            1,
            rf,
            {"cleanup.policy": "delete", "retention.ms": "-1", "retention.bytes": "-1"},
        ),
        # Shadow comparisons are a side stream of a sampled share of requests, keyed by model: a
        # few partitions like the dead-letter topics, kept as long as requests and results.
        TopicSpec(topics.shadow, topics.dlq_partitions, rf, _deleting(topics.retention_ms)),
        # Breaker states: the latest per (model, version, worker) is all a reader needs, so the
        # topic is compacted; tombstones of stopped workers go after a day.
        TopicSpec(
            topics.breakers,
            1,
            rf,
            {"cleanup.policy": "compact", "delete.retention.ms": str(24 * 3600 * 1000)},
        ),
        # Operator actions are rare; one partition keeps them in the order they happened.
        TopicSpec(topics.audit, 1, rf, _deleting(topics.retention_ms)),
        # The registry's store, as Confluent's: one compacted partition (latest record per key).
        TopicSpec(registry.topic, 1, rf, {"cleanup.policy": "compact"}),
    ]


def ensure_topics(
    admin: AdminClient, specs: Iterable[TopicSpec], timeout: float = 30.0
) -> EnsureResult:
    """Create the missing topics; existing ones are left alone (only reported when they differ)."""
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import NewTopic  # type: ignore[attr-defined]

    result = EnsureResult()
    present = admin.list_topics(timeout=timeout).topics
    missing: list[TopicSpec] = []
    for spec in specs:
        if spec.name not in present:
            missing.append(spec)
            continue
        result.existing.append(spec.name)
        actual = len(present[spec.name].partitions)
        if actual != spec.partitions:
            result.mismatched[spec.name] = (spec.partitions, actual)
    if not missing:
        return result
    new = [
        NewTopic(
            s.name,
            num_partitions=s.partitions,
            replication_factor=s.replication_factor,
            config=dict(s.config),
        )
        for s in missing
    ]
    futures = admin.create_topics(new, operation_timeout=timeout, request_timeout=timeout)
    for name, future in futures.items():
        try:
            future.result()
        except KafkaException as exc:
            # Another process created it between our listing and our request: that is fine.
            if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise
            result.existing.append(name)
        else:
            result.created.append(name)
    return result


def describe_topics(
    admin: AdminClient, names: Iterable[str], timeout: float = 30.0
) -> dict[str, TopicState | None]:
    """Partitions, replication factor and key configs of each topic (None where it is missing)."""
    from confluent_kafka.admin import (  # type: ignore[attr-defined]
        ConfigResource,
        ResourceType,
    )

    present = admin.list_topics(timeout=timeout).topics
    states: dict[str, TopicState | None] = {}
    for name in names:
        meta = present.get(name)
        if meta is None or meta.error is not None:
            states[name] = None
            continue
        resource = ConfigResource(ResourceType.TOPIC, name)
        entries = admin.describe_configs([resource], request_timeout=timeout)[resource].result()
        replicas = [len(p.replicas) for p in meta.partitions.values()]
        states[name] = TopicState(
            name=name,
            partitions=len(meta.partitions),
            replication_factor=min(replicas, default=0),
            config={k: entries[k].value for k in KEY_CONFIGS if k in entries},
        )
    return states


def wait_healthy(probe: Callable[[float], str], wait_s: float) -> str:
    """Call `probe(timeout)` until it succeeds or `wait_s` has passed; one try when wait_s is 0."""
    deadline = time.monotonic() + wait_s
    while True:
        remaining = deadline - time.monotonic()
        try:
            return probe(min(max(remaining, 3.0), 5.0))
        except Exception:
            if time.monotonic() + 0.5 >= deadline:
                raise
        time.sleep(0.5)


def probe_kafka(settings: KafkaSettings, timeout: float) -> str:
    """Healthy when an AdminClient lists at least one broker."""

    # A fresh client per try (no reconnect backoff left from a failed try), and librdkafka's own
    # "connection refused" logs silenced: the caller reports the failure once, in its own words.
    admin = make_admin(settings, {"log_level": 0})
    brokers = admin.list_topics(timeout=timeout).brokers
    if not brokers:
        raise RuntimeError(f"no broker listed by {settings.bootstrap_servers}")
    return ", ".join(f"broker {b.id} at {b.host}:{b.port}" for b in brokers.values())


def probe_registry(settings: SchemaRegistrySettings, timeout: float) -> str:
    """Healthy when GET /_health answers 200 (tidegate's registry: its state is loaded), or GET /
    does where there is no /_health (other Confluent-compatible registries). Neither needs
    credentials: the stack makes the registry's keys only once it is healthy."""
    import httpx

    path = "/_health"
    response = httpx.get(f"{settings.url}{path}", timeout=timeout)
    if response.status_code == 404:
        path = "/"
        response = httpx.get(f"{settings.url}{path}", timeout=timeout)
    if response.status_code != 200:
        raise RuntimeError(f"GET {settings.url}{path} answered {response.status_code}")
    return f"{settings.url}, ready"


def probe_postgres(settings: PostgresSettings, timeout: float) -> str:
    """Healthy when the app's role logs in and runs a query in its database."""
    import psycopg

    with psycopg.connect(settings.conninfo(), connect_timeout=max(1, int(timeout))) as conn:
        row = conn.execute("SELECT current_user, current_database()").fetchone()
    if row is None:
        raise RuntimeError("SELECT returned no row")
    return f"{row[0]}@{settings.host}:{settings.port}/{row[1]}"


def probe_redis(settings: RedisSettings, timeout: float) -> str:
    """Healthy when Redis answers PING."""
    import redis

    password = settings.password.get_secret_value() if settings.password else None
    client = redis.Redis.from_url(
        settings.url, password=password, socket_timeout=timeout, socket_connect_timeout=timeout
    )
    try:
        if client.ping() is not True:
            raise RuntimeError("PING got no PONG")
    finally:
        client.close()
    return settings.url
