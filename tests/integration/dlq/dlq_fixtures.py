"""The DLQ integration tests' set-up: a topic set of the test's own (requests, failed, poison),
its schemas registered (the `dlq_stack` fixture: a test module takes it as
`dlq_stack = dlq_fixtures.dlq_stack`), and helpers that write dead letters as workers do and read a
topic back whole."""

from __future__ import annotations

import contextlib
import struct
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pytest
from confluent_kafka import Message, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]
from confluent_kafka.schema_registry import SchemaRegistryClient

from tests.support import unique, wait_for
from tidegate.core.errors import ModelExecutionError, TidegateError
from tidegate.core.kafka import make_consumer, make_producer
from tidegate.core.settings import KafkaSettings, SchemaRegistrySettings, TopicSettings
from tidegate.dlq.envelopes import dead_letter, error_info, source_position
from tidegate.schemas.catalog import DEAD_LETTER_ENVELOPE, INFERENCE_REQUEST, load_schema
from tidegate.schemas.codec import AvroDecoder, AvroEncoder
from tidegate.schemas.registration import RegistryHttp, register_all

PARTITIONS = {"requests": 4, "failed": 4, "poison": 2}


@dataclass
class DlqStack:
    kafka: KafkaSettings
    topics: TopicSettings
    registry: SchemaRegistrySettings
    client: SchemaRegistryClient
    requests: AvroEncoder
    letters: AvroEncoder
    decode_request: AvroDecoder

    def request_bytes(self, rid: str, model: str, version: str | None = None) -> bytes:
        record = {
            "request_id": rid,
            "model": model,
            "model_version": version,
            "inputs": [
                {
                    "name": "features",
                    "datatype": "FP32",
                    "shape": [1, 4],
                    "data": struct.pack("<4f", 1, 2, 3, 4),
                    "parameters": {},
                }
            ],
            "created_at": datetime.now(UTC),
        }
        return self.requests.encode(
            record, self.requests.schema_id(f"{self.topics.requests}-value")
        )

    def envelope(
        self,
        *,
        exc: TidegateError,
        failed_at_ms: int,
        key: bytes | None,
        value: bytes | None,
        rid: str | None,
        model: str | None,
        details: dict[str, str] | None = None,
        offset: int = 0,
    ) -> dict[str, Any]:
        return dead_letter(
            source=source_position(self.topics.requests, offset % 4, offset),
            error=error_info(exc, details=details),
            key=key,
            value=value,
            headers=[("traceparent", b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")],
            timestamp_ms=failed_at_ms - 5,
            failed_at_ms=failed_at_ms,
            request_id=rid,
            model=model,
            worker_id="it",
        )

    def produce_letters(
        self, topic: str, letters: Sequence[tuple[dict[str, Any] | bytes, int]]
    ) -> None:
        """Envelopes (or raw bytes) keyed by their original key, each stamped with its
        `failed_at` as a worker's produce would be."""
        producer = make_producer(self.kafka, {"linger.ms": 20})
        schema_id = self.letters.schema_id(f"{topic}-value")
        for item, at_ms in letters:
            if isinstance(item, bytes):
                key, value = None, item
            else:
                key, value = item["original_key"], self.letters.encode(item, schema_id)
            while True:
                try:
                    producer.produce(topic, key=key, value=value, timestamp=at_ms)
                    break
                except BufferError:
                    producer.poll(0.1)
        assert producer.flush(60) == 0


def read_all(stack: DlqStack, topic: str, count: int, timeout: float = 60.0) -> list[Message]:
    """Every message of `topic` until `count` arrived (and nothing more within a moment)."""
    names = {stack.topics.requests: "requests", stack.topics.failed: "failed"}
    parts = PARTITIONS[names.get(topic, "poison")]
    consumer = make_consumer(stack.kafka, unique("dlq-it-reader"))
    consumer.assign([TopicPartition(topic, p, 0) for p in range(parts)])
    found: list[Message] = []

    def more() -> bool:
        found.extend(m for m in consumer.consume(1000, timeout=0.5) if m.error() is None)
        return len(found) >= count

    try:
        wait_for(more, timeout=timeout, interval=0, what=f"{count} messages on {topic}")
        more()
    finally:
        consumer.close()
    return found


def backlog(stack: DlqStack, count: int, models: tuple[str, ...] = ("fraud",)) -> dict[str, bytes]:
    """`count` dead letters of distinct requests on the failed topic: request id -> value."""
    now = int(time.time() * 1000)
    values: dict[str, bytes] = {}
    letters: list[tuple[dict[str, Any] | bytes, int]] = []
    for i in range(count):
        rid, model = f"b{i:05d}", models[i % len(models)]
        values[rid] = stack.request_bytes(rid, model)
        envelope = stack.envelope(
            exc=ModelExecutionError("the model failed"),
            failed_at_ms=now - count + i,
            key=f"card-{i % 50}".encode(),
            value=values[rid],
            rid=rid,
            model=model,
            offset=i,
        )
        letters.append((envelope, now - count + i))
    stack.produce_letters(stack.topics.failed, letters)
    return values


@pytest.fixture
def dlq_stack(
    admin: AdminClient, kafka_settings: KafkaSettings, registry_settings: SchemaRegistrySettings
) -> Iterator[DlqStack]:
    with dlq_stack_of(admin, kafka_settings, registry_settings) as stack:
        yield stack


@contextlib.contextmanager
def dlq_stack_of(
    admin: AdminClient, kafka_settings: KafkaSettings, registry_settings: SchemaRegistrySettings
) -> Iterator[DlqStack]:
    """The `dlq_stack` fixture's set-up, for a benchmark too; its topics deleted afterwards."""
    topics = TopicSettings(
        requests=unique("d-requests"),
        failed=unique("d-failed"),
        poison=unique("d-poison"),
        retry_prefix=unique("d-retry"),
    )
    names = {"requests": topics.requests, "failed": topics.failed, "poison": topics.poison}
    new = [
        NewTopic(n, num_partitions=PARTITIONS[k], replication_factor=1) for k, n in names.items()
    ]
    for future in admin.create_topics(new).values():
        future.result(timeout=30)
    subjects = {
        f"{topics.requests}-value": INFERENCE_REQUEST,
        f"{topics.failed}-value": DEAD_LETTER_ENVELOPE,
        f"{topics.poison}-value": DEAD_LETTER_ENVELOPE,
    }
    with RegistryHttp(registry_settings) as http:
        list(register_all(http, subjects, events=False))
    client = SchemaRegistryClient(registry_settings.client_config())
    try:
        yield DlqStack(
            kafka_settings,
            topics,
            registry_settings,
            client,
            AvroEncoder(client, load_schema(INFERENCE_REQUEST)),
            AvroEncoder(client, load_schema(DEAD_LETTER_ENVELOPE)),
            AvroDecoder(client, load_schema(INFERENCE_REQUEST)),
        )
    finally:
        for future in admin.delete_topics(list(names.values())).values():
            future.result(timeout=30)
