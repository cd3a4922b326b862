"""Recorded traffic for the replay and backtest tests: a real worker served `fraud` 1 on unique
topics, so there are requests, the results callers got, and a live group with committed offsets.

`recorded` (module-scoped) builds fraud 1 and 2 into the real artifact store (as `make models`
does; skipped when built), creates the topics and a PostgreSQL schema of its own, promotes
fraud 1 through the lifecycle log, publishes the requests and runs the worker as `tidegate worker`
assembles it until every result is out, then stops it (a graceful stop commits its offsets).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import psycopg
import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]
from confluent_kafka.schema_registry import SchemaRegistryClient
from psycopg import sql

from tests.support import unique, wait_for
from tidegate.agents.assembly import WorkerConfig, running_worker
from tidegate.agents.worker_settings import WorkerSettings
from tidegate.core.db import migrate
from tidegate.core.kafka import make_consumer, make_producer
from tidegate.core.settings import (
    KafkaSettings,
    PostgresSettings,
    SchemaRegistrySettings,
    TopicSettings,
)
from tidegate.lifecycle.domain import events as ev
from tidegate.lifecycle.domain.events import NewEvent
from tidegate.lifecycle.eventstore.lifecycle_log import LifecycleLog
from tidegate.lifecycle.lifecycle_settings import LifecycleSettings
from tidegate.models.model_settings import ModelSettings
from tidegate.models.store import LocalArtifactStore
from tidegate.schemas.catalog import (
    DEAD_LETTER_ENVELOPE,
    INFERENCE_REQUEST,
    INFERENCE_RESULT,
    load_schema,
    topic_subjects,
)
from tidegate.schemas.codec import AvroDecoder, AvroEncoder
from tidegate.schemas.registration import RegistryHttp, register_all

REPO = Path(__file__).resolve().parents[3]
PARTITIONS = 4
REQUESTS = 48


@dataclass
class Recorded:
    kafka: KafkaSettings
    topics: TopicSettings
    registry: SchemaRegistrySettings
    client: SchemaRegistryClient
    pg: PostgresSettings
    models: ModelSettings
    group: str
    """The live workers' group, with its committed offsets."""
    from_ms: int
    to_ms: int
    features: dict[str, npt.NDArray[np.float32]]
    """Request id to its input rows."""
    values: dict[str, bytes]
    """Request id to the request's bytes as produced."""

    def requests_decoder(self) -> AvroDecoder:
        return AvroDecoder(self.client, load_schema(INFERENCE_REQUEST))

    def results_decoder(self) -> AvroDecoder:
        return AvroDecoder(self.client, load_schema(INFERENCE_RESULT))

    def envelopes(self) -> AvroDecoder:
        return AvroDecoder(self.client, load_schema(DEAD_LETTER_ENVELOPE))

    def env(self, state_dir: Path) -> dict[str, str]:
        """The environment `tidegate replay` and `tidegate backtest` read their settings from."""
        return {
            "TIDEGATE_TOPICS_REQUESTS": self.topics.requests,
            "TIDEGATE_TOPICS_RESULTS": self.topics.results,
            "TIDEGATE_TOPICS_REPLIES": self.topics.replies,
            "TIDEGATE_TOPICS_FAILED": self.topics.failed,
            "TIDEGATE_TOPICS_POISON": self.topics.poison,
            "TIDEGATE_TOPICS_LIFECYCLE": self.topics.lifecycle,
            "TIDEGATE_TOPICS_SHADOW": self.topics.shadow,
            "TIDEGATE_TOPICS_PARTITIONS": str(PARTITIONS),
            "TIDEGATE_POSTGRES_DB_SCHEMA": self.pg.db_schema,
            "TIDEGATE_MODELS_STORE_DIR": str(self.models.store_dir),
            "TIDEGATE_REPLAY_STATE_DIR": str(state_dir),
            "TIDEGATE_REPLAY_STALL_TIMEOUT_S": "5",
        }

    def committed(self) -> list[tuple[int, int]]:
        """The live group's committed offsets on the requests topic."""
        consumer = make_consumer(self.kafka, self.group)
        try:
            asked = [TopicPartition(self.topics.requests, p) for p in range(PARTITIONS)]
            return [(tp.partition, tp.offset) for tp in consumer.committed(asked, timeout=15)]
        finally:
            consumer.close()

    def high_watermarks(self, topic: str) -> list[int]:
        consumer = make_consumer(self.kafka, unique("marks"))
        try:
            return [
                consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=15)[1]
                for p in range(PARTITIONS)
            ]
        finally:
            consumer.close()

    def read(self, topic: str, count: int, timeout: float = 60.0) -> list[dict[str, Any]]:
        """`count` results of `topic`, read from the start (fails if fewer arrive in time)."""
        return read_results(self.kafka, topic, self.results_decoder(), count, timeout)


def read_results(
    kafka: KafkaSettings, topic: str, decoder: AvroDecoder, count: int, timeout: float = 60.0
) -> list[dict[str, Any]]:
    consumer: Consumer = make_consumer(kafka, unique("reader"))
    consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
    records: list[dict[str, Any]] = []

    def enough() -> bool:
        for msg in consumer.consume(num_messages=500, timeout=0.2):
            if not msg.error():
                records.append(decoder(msg.value()))
        return len(records) >= count

    try:
        wait_for(enough, timeout=timeout, what=f"{count} records on {topic}")
    finally:
        consumer.close()
    return records


def create_topics(
    admin: AdminClient,
    registry: SchemaRegistrySettings,
    *names: str,
    schema: str = INFERENCE_RESULT,
) -> None:
    """Topics of `PARTITIONS` partitions with `schema` under `<name>-value`."""
    new = [NewTopic(n, num_partitions=PARTITIONS, replication_factor=1) for n in names]
    for future in admin.create_topics(new).values():
        future.result(timeout=30)
    with RegistryHttp(registry) as http:
        list(register_all(http, {f"{n}-value": schema for n in names}, events=False))


def fraud_request(rid: str, rows: npt.NDArray[np.float32]) -> dict[str, Any]:
    return {
        "request_id": rid,
        "model": "fraud",
        "routing_key": f"k{int(rid.rsplit('-', 1)[1]) % 16}",
        "inputs": [
            {
                "name": "features",
                "datatype": "FP32",
                "shape": list(rows.shape),
                "data": rows.astype("<f4").tobytes(),
                "parameters": {},
            }
        ],
        "created_at": datetime.now(UTC),
    }


def _registered(models: ModelSettings, *versions: str) -> list[ev.Payload]:
    store = LocalArtifactStore(models)
    out: list[ev.Payload] = []
    for version in versions:
        manifest = asyncio.run(store.manifest("fraud", version))
        uri = f"file://{store.package_dir('fraud', version)}"
        signature = manifest.signature.model_dump_json()
        out += [
            ev.ModelRegistered(
                version, "onnx", uri, dict(manifest.files), signature_json=signature
            ),
            ev.ArtifactValidated(version),
        ]
    return out


async def _serve(recorded: Recorded, count: int) -> None:
    config = WorkerConfig(
        worker=WorkerSettings(group_id=recorded.group, worker_id="it", metrics_port=0),
        kafka=recorded.kafka,
        topics=recorded.topics,
        models=recorded.models,
        registry=recorded.registry,
        postgres=recorded.pg,
    )
    async with running_worker(config):
        await asyncio.to_thread(recorded.read, recorded.topics.results, count, 120.0)


@pytest.fixture(scope="module")
def recorded(packages: Path) -> Iterator[Recorded]:
    """fraud 1 served REQUESTS requests (1 to 6 rows each) on topics of this module's own."""
    kafka, registry = KafkaSettings(), SchemaRegistrySettings()
    topics = TopicSettings(
        requests=unique("rp-requests"),
        results=unique("rp-results"),
        replies=unique("rp-replies"),
        failed=unique("rp-failed"),
        poison=unique("rp-poison"),
        lifecycle=unique("rp-lifecycle"),
        shadow=unique("rp-shadow"),
        partitions=PARTITIONS,
    )
    names = [
        topics.requests,
        topics.results,
        topics.replies,
        topics.failed,
        topics.poison,
        topics.lifecycle,
        topics.shadow,
    ]
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap_servers})
    new = [NewTopic(n, num_partitions=PARTITIONS, replication_factor=1) for n in names]
    for future in admin.create_topics(new).values():
        future.result(timeout=30)
    with RegistryHttp(registry) as http:
        list(register_all(http, topic_subjects(topics)))
    pg = PostgresSettings(db_schema=unique("rp").replace("-", "_"))
    migrate(pg)
    client = SchemaRegistryClient(registry.client_config())
    models = ModelSettings(store_dir=REPO / "var" / "models")
    rng = np.random.default_rng(11)
    features = {
        f"rq-{i:03d}": rng.standard_normal((1 + i % 6, 64)).astype(np.float32)
        for i in range(REQUESTS)
    }
    recorded = Recorded(
        kafka, topics, registry, client, pg, models, unique("rp-live"), 0, 0, features, {}
    )
    log = LifecycleLog.from_settings(pg, LifecycleSettings(), kafka, topics, registry, publish=True)

    events = [*_registered(models, "1", "2"), ev.Promoted("1")]

    async def promote() -> None:
        async with log as opened:
            await opened.append(
                "fraud", [NewEvent(p, actor="it") for p in events], expected_version=None
            )

    asyncio.run(promote())
    encoder = AvroEncoder(client, load_schema(INFERENCE_REQUEST))
    schema_id = encoder.schema_id(f"{topics.requests}-value")
    recorded.from_ms = int(time.time() * 1000) - 1
    producer = make_producer(kafka)
    for rid, rows in features.items():
        request = fraud_request(rid, rows)
        value = encoder.encode(request, schema_id)
        recorded.values[rid] = value
        producer.produce(topics.requests, key=request["routing_key"], value=value)
    assert producer.flush(30) == 0
    recorded.to_ms = int(time.time() * 1000) + 1
    asyncio.run(_serve(recorded, REQUESTS))
    yield recorded
    for future in admin.delete_topics(names).values():
        future.result(timeout=30)
    with psycopg.connect(pg.conninfo(), autocommit=True, connect_timeout=10) as conn:
        conn.execute(
            sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(pg.db_schema))
        )


def onnx_probabilities(
    models: ModelSettings, version: str, rows: npt.NDArray[np.float32]
) -> npt.NDArray[np.float32]:
    """fraud `version` run directly with an onnxruntime InferenceSession, none of our code."""
    import onnxruntime as ort

    package = asyncio.run(LocalArtifactStore(models).fetch("fraud", version))
    session = ort.InferenceSession(
        str(package.path(package.manifest.entrypoint)), providers=["CPUExecutionProvider"]
    )
    (probabilities,) = session.run(["probabilities"], {"features": rows})
    return np.asarray(probabilities, dtype=np.float32)


def iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat()
