"""Admission from measured load against the real Kafka: a gateway in front of a slow fake worker
sheds at once (503, Retry-After, a problem body) a call whose budget the workers' backlog exceeds,
still admits one whose budget covers it, and admits again once the backlog drains.

The backlog is produced straight to Kafka, as a producer application would: the gateway sees it
only through its lag probe (the workers' group's committed offsets against the topic's end), not
through calls of its own. The gateway is served with `GatewayHttpProtocol`, as `tidegate gateway`
serves it, so the refusals are the protocol's.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from confluent_kafka import OFFSET_BEGINNING, TopicPartition
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.serialization import MessageField, SerializationContext

from tests.integration.fakes import FakeWorker
from tests.integration.gateway.gateway_fixtures import GatewayServer, ProtocolGateway, fraud_body
from tests.support import unique, wait_for
from tidegate.core.kafka import make_consumer, make_producer
from tidegate.core.settings import KafkaSettings, SchemaRegistrySettings, TopicSettings
from tidegate.gateway.admission.admission_settings import AdmissionSettings
from tidegate.gateway.auth.auth_settings import AuthSettings
from tidegate.gateway.gateway_services import GatewayConfig
from tidegate.gateway.gateway_settings import GatewaySettings
from tidegate.schemas.catalog import INFERENCE_REQUEST, load_schema
from tidegate.schemas.codec import AvroEncoder
from tidegate.schemas.requests import build_request, request_key
from tidegate.schemas.tensors import from_numpy

SERVICE_S = 0.02  # the slow worker serves 50 requests/s
BACKLOG = 400  # 8 s of its work


class SlowWorker(FakeWorker):
    """Serves one request at a time, `SERVICE_S` each, as a member of `group` that commits each
    request's offset once answered (as the workers do, so the gateway's probe sees its lag)."""

    def __init__(
        self,
        kafka: KafkaSettings,
        topics: TopicSettings,
        registry: SchemaRegistrySettings,
        group: str,
    ) -> None:
        super().__init__(kafka, topics, registry)
        self._group = group

    def start(self) -> SlowWorker:
        self._schema_id = self._encoder.schema_id(f"{self._topics.results}-value")
        self._producer = make_producer(self._kafka)
        self._consumer = make_consumer(self._kafka, self._group)
        topic = self._topics.requests
        meta = self._consumer.list_topics(topic, timeout=10).topics[topic]
        self._consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in meta.partitions])
        self._thread.start()
        return self

    def _run(self) -> None:
        ctx = SerializationContext(self._topics.requests, MessageField.VALUE)
        while not self._stopping.is_set():
            for msg in self._consumer.consume(1, 0.02):
                if msg.error() is not None:
                    continue
                request = self._decoder(msg.value(), ctx)
                self.seen.append(request)
                time.sleep(SERVICE_S)  # the model's compute, one request at a time
                self._answer(request)
                # A message read without error always has its topic, partition and offset.
                offset = int(msg.offset() or 0) + 1
                done = TopicPartition(str(msg.topic()), int(msg.partition() or 0), offset)
                self._consumer.commit(offsets=[done], asynchronous=True)
            self._producer.poll(0)


@pytest.fixture
def group() -> str:
    return unique("it-overload-workers")


@pytest.fixture
def worker(
    kafka_settings: KafkaSettings,
    topics: TopicSettings,
    registry_settings: SchemaRegistrySettings,
    group: str,
) -> Iterator[SlowWorker]:
    slow = SlowWorker(kafka_settings, topics, registry_settings, group).start()
    yield slow
    slow.stop()


@pytest.fixture
def gateway(
    kafka_settings: KafkaSettings,
    topics: TopicSettings,
    registry_settings: SchemaRegistrySettings,
    lifecycle: None,
    group: str,
) -> Iterator[ProtocolGateway]:
    config = GatewayConfig(
        gateway=GatewaySettings(replica_id=unique("replica")),
        kafka=kafka_settings,
        topics=topics,
        registry=registry_settings,
        auth=AuthSettings(enabled=False),  # not about authentication (test_auth.py is)
        admission=AdmissionSettings(worker_group=group, probe_interval_s=0.2, lag_floor=20),
    )
    server = ProtocolGateway(config)
    server.start()
    yield server
    server.stop()


def produce_backlog(
    kafka: KafkaSettings, topics: TopicSettings, registry: SchemaRegistrySettings, count: int
) -> None:
    """`count` requests straight to Kafka, as a producer application sends them."""
    encoder = AvroEncoder(
        SchemaRegistryClient(registry.client_config()), load_schema(INFERENCE_REQUEST)
    )
    ctx = SerializationContext(topics.requests, MessageField.VALUE)
    producer = make_producer(kafka)
    features = from_numpy("features", np.ones((1, 4), dtype=np.float32))
    for i in range(count):
        record = build_request("fraud", [features], request_id=unique(f"direct-{i}"))
        producer.produce(topics.requests, key=request_key(record), value=encoder(record, ctx))
        producer.poll(0)
    producer.flush(30)


def timed_call(gateway: GatewayServer, timeout_s: float) -> tuple[Any, float]:
    started = time.perf_counter()
    response = gateway.http.post(
        "/v2/models/fraud/infer",
        json=fraud_body(),
        headers={"Request-Timeout": str(timeout_s)},
    )
    return response, time.perf_counter() - started


def test_a_backlog_past_the_budget_is_shed_at_once_and_admitted_again_once_drained(
    gateway: ProtocolGateway,
    worker: SlowWorker,
    kafka_settings: KafkaSettings,
    topics: TopicSettings,
    registry_settings: SchemaRegistrySettings,
) -> None:
    # Served while the workers are idle: the probe learns their group and sees no backlog.
    ok, _ = timed_call(gateway, 5)
    assert ok.status_code == 200, ok.text

    produce_backlog(kafka_settings, topics, registry_settings, BACKLOG)

    def shed() -> tuple[Any, float] | None:
        response, elapsed = timed_call(gateway, 1)
        # Until the probe sees the backlog a call is admitted, and served or timed out behind it.
        assert response.status_code in (200, 503, 504), response.text
        return (response, elapsed) if response.status_code == 503 else None

    wait_for(shed, timeout=10, interval=0.05, what="a 503 for the backlog")
    # The backlog is seconds deep now: every such call is refused, at once, by the protocol.
    refused, elapsed = timed_call(gateway, 1)
    assert refused.status_code == 503, refused.text
    # Before its 1 s budget ran out: it never waited in the backlog. (How fast a refusal is, the
    # p99 under 5 ms, is `python -m tests.bench overload`'s bar.)
    assert elapsed < 1.0, f"refused after {elapsed * 1000:.0f} ms, not at once"
    assert refused.headers["content-type"] == "application/problem+json"
    problem = refused.json()
    assert problem["code"] == "OVERLOADED"
    assert problem["retriable"] is True
    assert "estimated queueing delay" in problem["detail"]
    assert int(refused.headers["retry-after"]) >= 2
    assert problem["retry_after_s"] == int(refused.headers["retry-after"])

    # A caller whose budget covers the backlog is admitted, and served once its turn comes.
    patient = threading.Thread(target=lambda: results.append(timed_call(gateway, 60)[0]))
    results: list[Any] = []
    patient.start()

    def admitted() -> Any:
        response, _ = timed_call(gateway, 1)
        assert response.status_code in (200, 503, 504), response.text  # 503, 504: not drained yet
        return response if response.status_code == 200 else None

    wait_for(admitted, timeout=60, interval=0.2, what="a call admitted once the backlog drained")
    patient.join(60)
    assert len(results) == 1
    assert results[0].status_code == 200, results[0].text
    assert len(worker.seen) >= BACKLOG
