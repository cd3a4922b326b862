"""The gateway's edge under faults, against the real Kafka, Redis, registry and PostgreSQL.

* `Request-Timeout` is the request's deadline: a call answered 504 while no worker runs is, once
  the real worker (tests/integration/workers.py, the tiny ONNX model) reaches it, answered
  DEADLINE_EXCEEDED rather than computed late, and that answer is what `/v2/requests/{id}` shows.
* A 4 MB tensor fits the body limit but not a Kafka message: 413 naming the limit, before
  anything is published; a requests topic with a smaller `max.message.bytes` lowers the limit.
* An asynchronous call retried with the same id is published once.
* Kafka down: the gateway's producer points at a broker of this test's own (infra/stack.sh, a
  temporary folder, free ports), which is SIGKILLed and started again; the shared broker is
  never touched. Meanwhile calls get 503 without waiting for the publish timeout, and once the
  broker is back they succeed again with no restart of the gateway. (`python -m tests.bench
  kafka_down` holds those 503s to a p99 under 50 ms.)
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from confluent_kafka import OFFSET_BEGINNING, TopicPartition
from confluent_kafka.admin import (  # type: ignore[attr-defined]  # not re-exported
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewTopic,
    ResourceType,
)

from tests.integration.fakes import FakeWorker
from tests.integration.gateway.edge_support import (
    ASYNC,
    INFER,
    PUBLISH_TIMEOUT_S,
    calls_while_kafka_is_down,
    config_of,
    publishing_to,
)
from tests.integration.gateway.gateway_fixtures import GatewayServer, fraud_body
from tests.integration.own_broker import Broker
from tests.integration.workers import Stack, running
from tests.support import retry_later, unique, wait_for
from tidegate.core.kafka import make_admin, make_consumer, make_producer
from tidegate.core.settings import KafkaSettings, SchemaRegistrySettings, TopicSettings
from tidegate.models.model_settings import ModelSettings

REPO = Path(__file__).resolve().parents[3]
STACK = ["bash", str(REPO / "infra" / "stack.sh")]


@pytest.fixture
def gateway(
    kafka_settings: KafkaSettings,
    topics: TopicSettings,
    registry_settings: SchemaRegistrySettings,
    lifecycle: None,
) -> Iterator[Callable[..., GatewayServer]]:
    started: list[GatewayServer] = []

    def start(kafka: KafkaSettings | None = None, **gateway: Any) -> GatewayServer:
        config = config_of(kafka_settings, topics, registry_settings, **gateway)
        server = GatewayServer(config, publishing_to(kafka or kafka_settings))
        started.append(server)
        # A broker of the test's own may still be loading its coordinators on a loaded CI host;
        # the replica starts serving once its publisher and reply feed are through.
        return server.start(ready_timeout_s=90)

    yield start
    for server in started:
        server.stop()


def published(kafka: KafkaSettings, topic: str) -> int:
    """Records in `topic` (every partition's high watermark: nothing is ever deleted there)."""
    admin = make_admin(kafka)
    partitions = admin.list_topics(topic, timeout=10).topics[topic].partitions
    consumer = make_consumer(kafka, unique("count"))
    try:
        return sum(
            consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
            for p in partitions
        )
    finally:
        consumer.close()


# -- deadlines -------------------------------------------------------------------------------


async def test_a_504_request_is_answered_deadline_exceeded_not_computed_late(
    stack: Stack, models: ModelSettings
) -> None:
    config = config_of(stack.kafka, stack.topics, stack.registry)
    server = GatewayServer(config, publishing_to(stack.kafka))
    await asyncio.to_thread(server.start)
    late, fresh = unique("late"), unique("fresh")

    def body(request_id: str) -> dict[str, Any]:
        tensor = {"name": "features", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}
        return {"id": request_id, "inputs": [tensor]}

    def post(request_id: str, timeout: str) -> httpx.Response:
        headers = {"Request-Timeout": timeout}
        return server.http.post("/v2/models/tiny/infer", json=body(request_id), headers=headers)

    try:
        # No worker runs: the call ends at its timeout, which is also its request's deadline.
        started = time.monotonic()
        timed_out = await asyncio.to_thread(post, late, "1")
        assert timed_out.status_code == 504, timed_out.text
        assert time.monotonic() - started < 5
        problem = timed_out.json()
        assert "DEADLINE_EXCEEDED" in problem["detail"], problem
        assert timed_out.headers["location"] == f"/v2/requests/{late}"
        async with running(stack, models):
            # The worker finds it past its deadline and answers so, without computing it.
            def answered() -> httpx.Response | None:
                resp = server.http.get(f"/v2/requests/{late}")
                return resp if resp.status_code != 202 else None

            fetched = await asyncio.to_thread(
                wait_for, answered, timeout=90, what=f"the answer to {late}"
            )
            assert fetched.status_code == 504, fetched.text
            assert fetched.json()["result_status"] == "DEADLINE_EXCEEDED"
            assert "deadline passed" in fetched.json()["detail"]
            # A request within its deadline is computed as ever.
            computed = await asyncio.to_thread(post, fresh, "60")
            assert computed.status_code == 200, computed.text
    finally:
        await asyncio.to_thread(server.stop)


# -- large payloads --------------------------------------------------------------------------


def binary_call(rows: int) -> tuple[bytes, dict[str, str]]:
    """A binary-extension call for fraud with `rows` x 4 FP32 features."""
    raw = np.zeros((rows, 4), dtype=np.float32).tobytes()
    tensor = {
        "name": "features",
        "datatype": "FP32",
        "shape": [rows, 4],
        "parameters": {"binary_data_size": len(raw)},
    }
    head = json.dumps({"inputs": [tensor]}).encode()
    headers = {
        "Inference-Header-Content-Length": str(len(head)),
        "Content-Type": "application/octet-stream",
    }
    return head + raw, headers


def test_a_4mb_tensor_gets_413_naming_the_kafka_limit(
    gateway: Callable[..., GatewayServer], kafka_settings: KafkaSettings, topics: TopicSettings
) -> None:
    server = gateway()
    body, headers = binary_call(262_144)  # 4 MiB of FP32
    resp = server.http.post(INFER, content=body, headers=headers)
    assert resp.status_code == 413, resp.text
    problem = resp.json()
    assert problem["code"] == "RECORD_TOO_LARGE"
    assert problem["max_bytes"] == 1_000_000
    assert "1000000 bytes" in problem["detail"]
    assert problem["retriable"] is False
    assert published(kafka_settings, topics.requests) == 0


def test_the_requests_topics_smaller_limit_is_the_gateways(
    gateway: Callable[..., GatewayServer],
    admin: AdminClient,
    kafka_settings: KafkaSettings,
    topics: TopicSettings,
    worker: FakeWorker,
) -> None:
    entry = ConfigEntry("max.message.bytes", "200000", incremental_operation=AlterConfigOpType.SET)
    resource = ConfigResource(ResourceType.TOPIC, topics.requests, incremental_configs=[entry])
    admin.incremental_alter_configs([resource])[resource].result(timeout=30)
    # The broker applies the change as it replays the cluster's metadata, a moment after the
    # controller accepted it: the gateway reads the limit when it starts.
    described = ConfigResource(ResourceType.TOPIC, topics.requests)
    wait_for(
        lambda: admin.describe_configs([described])[described]
        .result(timeout=10)["max.message.bytes"]
        .value
        == "200000",
        what="the topic's new max.message.bytes on the broker",
    )
    server = gateway()
    body, headers = binary_call(16_384)  # 256 KiB: under 1 MB, over the topic's 200 kB
    resp = server.http.post(INFER, content=body, headers=headers)
    assert resp.status_code == 413, resp.text
    limit = resp.json()["max_bytes"]
    assert 190_000 < limit < 200_000
    small, headers = binary_call(1_000)
    assert server.http.post(INFER, content=small, headers=headers).status_code == 200


# -- asynchronous calls: accepted once ---------------------------------------------------------


def test_an_async_retry_with_the_same_id_is_published_once(
    gateway: Callable[..., GatewayServer], kafka_settings: KafkaSettings, topics: TopicSettings
) -> None:
    server = gateway()
    request_id = unique("once")
    body = fraud_body(id=request_id)
    first = server.http.post(INFER, json=body, headers=ASYNC)
    again = server.http.post(INFER, json=body, headers=ASYNC)
    assert (first.status_code, again.status_code) == (202, 202), again.text
    assert again.headers["location"] == f"/v2/requests/{request_id}"
    # A 202 comes only once Kafka has the request: a second publish would be there already.
    assert published(kafka_settings, topics.requests) == 1


# -- Kafka down ------------------------------------------------------------------------------


class BridgeWorker(FakeWorker):
    """The fake worker, reading requests from the test's own broker and answering on the shared
    one, where the gateway's replies are."""

    def __init__(self, requests_from: KafkaSettings, *args: Any) -> None:
        super().__init__(*args)
        self._requests_from = requests_from

    def start(self) -> BridgeWorker:
        self._schema_id = self._encoder.schema_id(f"{self._topics.results}-value")
        self._producer = make_producer(self._kafka)
        self._consumer = make_consumer(self._requests_from, unique("bridge-worker"))
        topic = self._topics.requests
        self._consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        self._thread.start()
        return self


def p99(values: list[float]) -> float:
    return float(np.percentile(values, 99))


# The broker's start and restart (180 s each at most) and the gateway's (90 s): past the default.
@pytest.mark.timeout(600)
def test_kafka_down_is_503_at_once_and_recovery_needs_no_restart(
    gateway: Callable[..., GatewayServer],
    broker: Broker,
    kafka_settings: KafkaSettings,
    topics: TopicSettings,
    registry_settings: SchemaRegistrySettings,
) -> None:
    own = make_admin(broker.settings)
    new = NewTopic(topics.requests, num_partitions=1, replication_factor=1)
    own.create_topics([new])[topics.requests].result(timeout=30)
    bridge = BridgeWorker(broker.settings, kafka_settings, topics, registry_settings).start()
    try:
        server = gateway(kafka=broker.settings, publish_timeout_s=PUBLISH_TIMEOUT_S)
        assert server.http.post(INFER, json=fraud_body()).status_code == 200

        noticed_s, latencies = calls_while_kafka_is_down(server, broker)
        # Refused at once: none waited for the publish timeout (p99 < 50 ms is the bench's bar).
        slowest = max(latencies)
        assert slowest < PUBLISH_TIMEOUT_S, f"a 503 after {slowest:.2f} s: it waited to publish"

        broker.stack("up")
        up = time.monotonic()

        def answered() -> bool:
            # Refused as retriable (PUBLISH_FAILED) until the producer reaches the broker again.
            resp = server.http.post(INFER, json=fraud_body())
            if retry_later(resp):
                return False
            assert resp.status_code == 200, resp.text
            return True

        wait_for(answered, timeout=60, interval=0.2, what="calls to succeed again")
        recovered_s = time.monotonic() - up
        async_again = server.http.post(INFER, json=fraud_body(), headers=ASYNC)
        assert async_again.status_code == 202, async_again.text
        assert server.http.get("/v2/health/ready").status_code == 200
        print(
            f"Kafka down noticed in {noticed_s * 1000:.0f} ms; 503s p50 "
            f"{np.percentile(latencies, 50) * 1000:.1f} ms, p99 {p99(latencies) * 1000:.1f} ms, "
            f"max {max(latencies) * 1000:.1f} ms; calls succeed {recovered_s:.1f} s after "
            "`stack.sh up` returned"
        )
    finally:
        bridge.stop()
