"""Test doubles shared by the integration tests of the gateway and the producer client: a fake
worker that answers requests from a real Kafka topic, and registration of their subjects."""

from __future__ import annotations

import threading
import time
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, TopicPartition
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.serialization import MessageField, SerializationContext

from tests.support import unique
from tests.unit.gateway_harness import compute
from tidegate.core.kafka import make_consumer, make_producer
from tidegate.core.settings import KafkaSettings, SchemaRegistrySettings, TopicSettings
from tidegate.schemas.catalog import INFERENCE_REQUEST, INFERENCE_RESULT, load_schema
from tidegate.schemas.codec import AvroDecoder, AvroEncoder
from tidegate.schemas.registration import RegistryHttp, register_all
from tidegate.schemas.requests import SUBMISSION_HEADER, request_key

__all__ = ["FakeWorker", "register_subjects"]


def register_subjects(registry: SchemaRegistrySettings, topics: TopicSettings) -> None:
    """Register the request and result schemas under the test's own topics."""
    subjects = {
        f"{topics.requests}-value": INFERENCE_REQUEST,
        f"{topics.results}-value": INFERENCE_RESULT,
    }
    with RegistryHttp(registry) as http:
        list(register_all(http, subjects))


class FakeWorker:
    """Answers requests from a requests topic, in a thread, like the worker agents would."""

    def __init__(
        self, kafka: KafkaSettings, topics: TopicSettings, registry: SchemaRegistrySettings
    ) -> None:
        self._kafka = kafka
        self._topics = topics
        client = SchemaRegistryClient(registry.client_config())
        self._decoder = AvroDecoder(client, load_schema(INFERENCE_REQUEST))
        self._encoder = AvroEncoder(client, load_schema(INFERENCE_RESULT))
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="fake-worker", daemon=True)
        self.seen: list[dict[str, Any]] = []
        # When each request was answered (time.monotonic()), by request id.
        self.answered: dict[str, float] = {}

    def start(self) -> FakeWorker:
        self._schema_id = self._encoder.schema_id(f"{self._topics.results}-value")
        self._producer = make_producer(self._kafka)
        # Assigned, not subscribed: the topic is new, and no group join delays the first read.
        self._consumer = make_consumer(self._kafka, unique("fake-worker"))
        topic = self._topics.requests
        meta = self._consumer.list_topics(topic, timeout=10).topics[topic]
        self._consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in meta.partitions])
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        self._thread.join(timeout=10)
        self._producer.flush(10)
        self._consumer.close()

    def _run(self) -> None:
        ctx = SerializationContext(self._topics.requests, MessageField.VALUE)
        due: list[tuple[float, dict[str, Any]]] = []
        while not self._stopping.is_set():
            for msg in self._consumer.consume(100, 0.02):
                if msg.error() is not None:
                    continue
                request = self._decoder(msg.value(), ctx)
                self.seen.append(request)
                delay = float(request["parameters"].get("fake_delay_s") or 0.0)
                due.append((time.monotonic() + delay, request))
            now = time.monotonic()
            for entry in [entry for entry in due if entry[0] <= now]:
                due.remove(entry)
                self._answer(entry[1])
            self._producer.poll(0)

    def _answer(self, request: dict[str, Any]) -> None:
        self.answered[str(request["request_id"])] = time.monotonic()
        value = self._encoder.encode(compute(request), self._schema_id)
        key = request_key(request)
        self._producer.produce(self._topics.results, key=key, value=value)
        reply_to = request.get("reply_to")
        if reply_to:
            # As a worker does: the reply carries its submission's nonce back.
            nonce = reply_to.get("nonce")
            headers: list[tuple[str, str | bytes | None]] | None = (
                [(SUBMISSION_HEADER, str(nonce).encode())] if nonce else None
            )
            self._producer.produce(
                reply_to["topic"],
                partition=reply_to["partition"],
                key=key,
                value=value,
                headers=headers,
            )
