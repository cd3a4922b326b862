"""A gateway replica publishing to a broker of the test's own, and the calls it refuses while that
broker is down: the edge-faults test's and `python -m tests.bench kafka_down`'s."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from tests.integration.gateway.gateway_fixtures import GatewayServer, fraud_body
from tests.integration.own_broker import Broker
from tests.support import unique, wait_for
from tidegate.core.settings import KafkaSettings, SchemaRegistrySettings, TopicSettings
from tidegate.gateway.auth.auth_settings import AuthSettings
from tidegate.gateway.gateway_services import GatewayConfig, GatewayServices, kafka_services
from tidegate.gateway.gateway_settings import GatewaySettings
from tidegate.gateway.roundtrip.request_publisher import KafkaRequestPublisher

__all__ = [
    "ASYNC",
    "INFER",
    "PUBLISH_TIMEOUT_S",
    "calls_while_kafka_is_down",
    "config_of",
    "publishing_to",
]


INFER = "/v2/models/fraud/infer"


ASYNC = {"Prefer": "respond-async"}


def config_of(
    kafka: KafkaSettings, topics: TopicSettings, registry: SchemaRegistrySettings, **gateway: Any
) -> GatewayConfig:
    return GatewayConfig(
        gateway=GatewaySettings(replica_id=unique("replica"), admin=False, **gateway),
        kafka=kafka,
        topics=topics,
        registry=registry,
        auth=AuthSettings(enabled=False),  # not about authentication (test_auth.py is)
    )


def publishing_to(kafka: KafkaSettings) -> Callable[[GatewayConfig], GatewayServices]:
    """The real services, with the publisher configured from the gateway's settings and
    publishing to `kafka`."""

    def build(config: GatewayConfig) -> GatewayServices:
        services = kafka_services(config)
        services.publisher = KafkaRequestPublisher(
            kafka, config.topics, config.registry, gateway=config.gateway
        )
        return services

    return build


PUBLISH_TIMEOUT_S = 3.0


def calls_while_kafka_is_down(server: GatewayServer, broker: Broker) -> tuple[float, list[float]]:
    """Kill `broker`, the one `server` publishes to; once its readiness says so, 200 calls (every
    fourth asynchronous), each refused 503 PUBLISH_FAILED: how long readiness took to notice, and
    each call's latency. `python -m tests.bench kafka_down` runs it too, for the latencies' bar."""
    broker.kill()
    killed = time.monotonic()
    wait_for(
        lambda: server.http.get("/v2/health/ready").status_code == 503,
        timeout=10,
        interval=0.02,
        what="readiness to see Kafka gone",
    )
    noticed_s = time.monotonic() - killed
    latencies: list[float] = []
    for i in range(200):
        headers = {"Request-Timeout": "5", **(ASYNC if i % 4 == 3 else {})}
        sent = time.perf_counter()
        resp = server.http.post(INFER, json=fraud_body(id=unique("down")), headers=headers)
        latencies.append(time.perf_counter() - sent)
        assert resp.status_code == 503, resp.text
        assert resp.headers["retry-after"] == "1"
        problem = resp.json()
        assert (problem["code"], problem["retriable"]) == ("PUBLISH_FAILED", True), problem
    return noticed_s, latencies
