"""The worker integration tests' shared set-up: a tiny two-version ONNX model in a temporary
artifact store, unique topics and a PostgreSQL schema per test, lifecycle events appended through
`LifecycleLog` (tiny 1 registered, validated and promoted), and helpers to publish requests, read
results and run the worker as `tidegate worker` assembles it."""

from __future__ import annotations

import asyncio
import os
import signal
import struct
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]
from confluent_kafka.schema_registry import SchemaRegistryClient

from tests.support import unique, wait_for
from tidegate.agents.assembly import RunningWorker, WorkerConfig, running_worker
from tidegate.agents.inference.loaded import ModelLoader
from tidegate.agents.worker_settings import WorkerSettings
from tidegate.core.db import make_pool
from tidegate.core.kafka import make_consumer, make_producer
from tidegate.core.settings import (
    KafkaSettings,
    PostgresSettings,
    SchemaRegistrySettings,
    TopicSettings,
)
from tidegate.core.tracing import Tracing
from tidegate.dlq.failure_settings import FailureSettings
from tidegate.lifecycle.domain import events as ev
from tidegate.lifecycle.domain.events import NewEvent
from tidegate.lifecycle.eventstore.event_codec import LifecycleCodec
from tidegate.lifecycle.eventstore.lifecycle_log import LifecycleLog
from tidegate.lifecycle.eventstore.outbox import OutboxRelay
from tidegate.lifecycle.lifecycle_settings import LifecycleSettings
from tidegate.models.manifest import Manifest
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
from tidegate.schemas.signature import Signature, TensorSpec

ROOT = Path(__file__).resolve().parents[2]
SIGNATURE = Signature(
    inputs=(TensorSpec(name="features", datatype="FP32", shape=(-1, 4)),),
    outputs=(TensorSpec(name="probabilities", datatype="FP32", shape=(-1, 2)),),
)


TINY_WEIGHTS = {
    "1": [[1, -1], [0.5, 0], [0, 0.5], [-1, 1]],
    "2": [[1, -1], [0, 0.5], [0.5, 0], [-1, 1.5]],  # agrees with 1 on most rows, not all
}


def build_tiny_model(store_dir: Path) -> ModelSettings:
    """Put `tiny` versions 1 and 2 (softmax(x @ W), two W) into a fresh store."""
    settings = ModelSettings(store_dir=store_dir / "store")
    for version, weights in TINY_WEIGHTS.items():
        store_classifier(settings, store_dir / f"source-{version}", "tiny", version, weights)
    return settings


def store_classifier(
    settings: ModelSettings, source: Path, name: str, version: str, *weights: Any
) -> None:
    """Store an ONNX classifier of `SIGNATURE`: softmax(x @ W1 @ W2 ...), one MatMul per
    weight matrix (`source` is where its package is written first)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    names = [f"W{i}" for i in range(len(weights))]
    steps = ["features", *(f"h{i}" for i in range(len(weights) - 1)), "logits"]
    graph = helper.make_graph(
        [
            *(
                helper.make_node("MatMul", [a, w], [b])
                for a, w, b in zip(steps[:-1], names, steps[1:], strict=True)
            ),
            helper.make_node("Softmax", ["logits"], ["probabilities"], axis=1),
        ],
        name,
        [helper.make_tensor_value_info("features", TensorProto.FLOAT, [None, 4])],
        [helper.make_tensor_value_info("probabilities", TensorProto.FLOAT, [None, 2])],
        [
            numpy_helper.from_array(np.asarray(w, dtype=np.float32), n)
            for w, n in zip(weights, names, strict=True)
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    source.mkdir(parents=True)
    onnx.save(model, str(source / "model.onnx"))
    manifest = Manifest(
        name=name,
        version=version,
        runtime="onnx",
        entrypoint="model.onnx",
        files={"model.onnx": ""},
        signature=SIGNATURE,
        task="classifier",
    )
    asyncio.run(LocalArtifactStore(settings).put(source, manifest))


def tiny_softmax(version: str, features: npt.NDArray[Any]) -> npt.NDArray[np.float64]:
    """What `tiny` `version` computes, directly."""
    logits = features.astype(np.float64) @ np.array(TINY_WEIGHTS[version], dtype=np.float64)
    exp = np.exp(logits - logits.max(axis=1, keepdims=True))
    probabilities: npt.NDArray[np.float64] = exp / exp.sum(axis=1, keepdims=True)
    return probabilities


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> ModelSettings:
    return build_tiny_model(tmp_path_factory.mktemp("models"))


def registered(models: ModelSettings, *versions: str) -> list[ev.Payload]:
    """ModelRegistered (with the signature, as `tidegate models register` writes it, so a gateway
    can check requests) and ArtifactValidated of each stored version of `tiny`."""
    store = LocalArtifactStore(models)
    out: list[ev.Payload] = []
    for version in versions:
        files = asyncio.run(store.manifest("tiny", version)).files
        uri = f"file://{store.package_dir('tiny', version)}"
        out += [
            ev.ModelRegistered(
                version, "onnx", uri, dict(files), signature_json=SIGNATURE.model_dump_json()
            ),
            ev.ArtifactValidated(version),
        ]
    return out


@dataclass
class Stack:
    kafka: KafkaSettings
    topics: TopicSettings
    registry: SchemaRegistrySettings
    pg: PostgresSettings
    group: str
    encoder: AvroEncoder
    results: AvroDecoder
    letters: AvroDecoder

    def env(self, models: ModelSettings, **extra: str) -> dict[str, str]:
        return {
            **os.environ,
            "TIDEGATE_TOPICS_REQUESTS": self.topics.requests,
            "TIDEGATE_TOPICS_REQUESTS_BATCH": self.topics.requests_batch,
            "TIDEGATE_TOPICS_RESULTS": self.topics.results,
            "TIDEGATE_TOPICS_FAILED": self.topics.failed,
            "TIDEGATE_TOPICS_POISON": self.topics.poison,
            "TIDEGATE_TOPICS_LIFECYCLE": self.topics.lifecycle,
            "TIDEGATE_TOPICS_SHADOW": self.topics.shadow,
            "TIDEGATE_TOPICS_BREAKERS": self.topics.breakers,
            "TIDEGATE_TOPICS_RETRY_PREFIX": self.topics.retry_prefix,
            "TIDEGATE_POSTGRES_DB_SCHEMA": self.pg.db_schema,
            "TIDEGATE_WORKER_GROUP_ID": self.group,
            "TIDEGATE_WORKER_METRICS_PORT": "0",
            "TIDEGATE_MODELS_STORE_DIR": str(models.store_dir),
            "PYTHONPATH": str(ROOT),
            **extra,
        }

    def log(self) -> LifecycleLog:
        # The test stands in for the controller, whose relay would publish these appends.
        return LifecycleLog.from_settings(
            self.pg, LifecycleSettings(), self.kafka, self.topics, self.registry, publish=True
        )

    async def append(self, *payloads: ev.Payload, model: str = "tiny") -> None:
        """Append lifecycle events as an operator would (they reach the topic on return)."""
        async with self.log() as log:
            await log.append(
                model, [NewEvent(p, actor="it") for p in payloads], expected_version=None
            )

    async def history(self, model: str = "tiny") -> list[ev.Payload]:
        async with self.log() as log:
            return [e.payload for e in await log.read(model)]


@pytest.fixture
def stack(
    admin: AdminClient,
    kafka_settings: KafkaSettings,
    pg_settings: PostgresSettings,
    models: ModelSettings,
    registry_settings: SchemaRegistrySettings,
) -> Iterator[Stack]:
    topics = TopicSettings(
        requests=unique("w-requests"),
        requests_batch=unique("w-requests-batch"),
        results=unique("w-results"),
        replies=unique("w-replies"),
        failed=unique("w-failed"),
        poison=unique("w-poison"),
        lifecycle=unique("w-lifecycle"),
        shadow=unique("w-shadow"),
        breakers=unique("w-breakers"),
        retry_prefix=unique("w-retry"),
    )
    names = [
        *topics.retry_topics(),
        topics.requests,
        topics.requests_batch,
        topics.results,
        topics.replies,
        topics.failed,
        topics.poison,
        topics.lifecycle,
        topics.shadow,
        topics.breakers,
    ]
    new = [NewTopic(n, num_partitions=4, replication_factor=1) for n in names]
    for future in admin.create_topics(new).values():
        future.result(timeout=30)
    registry = registry_settings  # the local stack's, unless a test module names another
    with RegistryHttp(registry) as http:
        list(register_all(http, topic_subjects(topics)))
    client = SchemaRegistryClient(registry.client_config())
    built = Stack(
        kafka_settings,
        topics,
        registry,
        pg_settings,
        unique("w-group"),
        AvroEncoder(client, load_schema(INFERENCE_REQUEST)),
        AvroDecoder(client, load_schema(INFERENCE_RESULT)),
        AvroDecoder(client, load_schema(DEAD_LETTER_ENVELOPE)),
    )
    # tiny 1 serves; 2 is validated and takes no traffic until a test gives it some.
    asyncio.run(built.append(*registered(models, "1", "2"), ev.Promoted("1")))
    yield built
    for future in admin.delete_topics(names).values():
        future.result(timeout=30)


def request(
    rid: str, key: str, features: list[float] | None = None, **extra: Any
) -> dict[str, Any]:
    values = features if features is not None else [1.0, 2.0, 3.0, 4.0]
    return {
        "request_id": rid,
        "model": "tiny",
        "routing_key": key,
        "inputs": [
            {
                "name": "features",
                "datatype": "FP32",
                "shape": [1, 4],
                "data": struct.pack("<4f", *values),
                "parameters": {},
            }
        ],
        "created_at": datetime.now(UTC),
        **extra,
    }


def publish(stack: Stack, items: Sequence[dict[str, Any] | tuple[str, bytes]]) -> None:
    """Requests are encoded; (key, bytes) pairs go out as they are."""
    producer = make_producer(stack.kafka)
    schema_id = stack.encoder.schema_id(f"{stack.topics.requests}-value")
    for item in items:
        if isinstance(item, tuple):
            key, value = item
        else:
            key, value = item["routing_key"], stack.encoder.encode(item, schema_id)
        producer.produce(stack.topics.requests, key=key, value=value)
    assert producer.flush(30) == 0


class Waves:
    """Waves of 40 keyed requests (16 keys), published as a producer would; every id is kept."""

    def __init__(self, stack: Stack) -> None:
        self.stack = stack
        self.ids: list[str] = []

    def send(self) -> None:
        batch = [request(f"w{len(self.ids) // 40:03d}-{i}", f"k{i % 16}") for i in range(40)]
        self.ids.extend(b["request_id"] for b in batch)
        publish(self.stack, batch)


def start_worker(stack: Stack, models: ModelSettings, **env: str) -> subprocess.Popen[bytes]:
    """`tidegate worker --processes 1` (the worker in the process itself) on the stack, with
    `env` added; its log in the models folder."""
    code = "import typer; from tidegate.cli.serve_worker import worker; typer.run(worker)"
    log = (models.store_dir.parent / f"{unique('worker')}.log").open("wb")
    return subprocess.Popen(
        [sys.executable, "-c", code, "--processes", "1"],
        env=stack.env(models, **env),
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=log,
    )


def tidegate(
    stack: Stack, models: ModelSettings, *args: str, code: int = 0
) -> subprocess.CompletedProcess[str]:
    """`tidegate ARGS` on the stack's topics and schema, as an operator runs it; it must exit
    with `code`."""
    done = subprocess.run(
        [sys.executable, "-m", "tidegate.cli", "--as", "it", *args],
        env=stack.env(models),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == code, done.stdout + done.stderr
    return done


def records_in(stack: Stack, topic: str) -> int:
    """How many records `topic` (of the stack's 4 partitions) holds: its end offsets' sum."""
    consumer = make_consumer(stack.kafka, unique("w-ends"))
    try:
        return sum(
            consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
            for p in range(4)
        )
    finally:
        consumer.close()


def stop_workers(*procs: subprocess.Popen[bytes]) -> None:
    """SIGTERM every worker process still running, then wait for each (SIGKILL after 60 s)."""
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()


class Reader:
    """Reads a topic from the beginning of every partition."""

    def __init__(self, stack: Stack, topic: str) -> None:
        self.consumer: Consumer = make_consumer(stack.kafka, unique("w-reader"))
        self.consumer.assign([TopicPartition(topic, p, 0) for p in range(4)])
        self.records: list[tuple[Any, int]] = []
        self._decode = (
            stack.letters
            if topic in (stack.topics.failed, stack.topics.poison, *stack.topics.retry_topics())
            else stack.results
        )

    def poll(self) -> list[tuple[Any, int]]:
        for msg in self.consumer.consume(num_messages=500, timeout=0.2):
            if not msg.error():
                self.records.append((self._decode(msg.value()), msg.partition() or 0))
        return self.records

    def until(self, count: int, timeout: float = 60.0) -> list[Any]:
        wait_for(lambda: len(self.poll()) >= count, timeout=timeout, what=f"{count} records")
        return [r for r, _ in self.records]

    def close(self) -> None:
        self.consumer.close()


@asynccontextmanager
async def running(
    stack: Stack,
    models: ModelSettings,
    loader: ModelLoader | None = None,
    tracing: Tracing | None = None,
    failure: FailureSettings | None = None,
    relay: bool = True,
    **settings: Any,
) -> AsyncIterator[RunningWorker]:
    """The worker as `tidegate worker` assembles it (with an optional fake model loader, and
    tracing and a failure policy of the test's own), and the controller's outbox relay unless
    `relay=False` (a test that runs the controller itself)."""
    config = WorkerConfig(
        worker=WorkerSettings(
            group_id=stack.group, metrics_port=0, **{"worker_id": "it", **settings}
        ),
        kafka=stack.kafka,
        topics=stack.topics,
        models=models,
        registry=stack.registry,
        postgres=stack.pg,
        failure=failure or FailureSettings(crash_guard=False),
    )
    async with AsyncExitStack() as resources:
        if relay:
            await resources.enter_async_context(controller_relay(stack))
        yield await resources.enter_async_context(
            running_worker(config, loader=loader, tracing=tracing)
        )


@asynccontextmanager
async def controller_relay(stack: Stack) -> AsyncIterator[OutboxRelay]:
    """The controller's outbox relay on the stack's schema: a worker publishes none of its
    reports itself (only the controller writes the lifecycle topic), so a test that runs no
    controller runs its relay."""
    lc = LifecycleSettings()
    pool = make_pool(stack.pg, lc)
    await pool.open(wait=True, timeout=30)
    codec = LifecycleCodec(SchemaRegistryClient(stack.registry.client_config()), stack.topics)
    relay = OutboxRelay(
        pool, stack.kafka, stack.topics.lifecycle, codec.encode, poll_s=lc.outbox_poll_s
    )
    try:
        await relay.start()
        yield relay
    finally:
        try:
            await relay.stop()
        finally:
            await pool.close()


async def in_thread(fn: Any, *args: Any) -> Any:
    return await asyncio.to_thread(fn, *args)
