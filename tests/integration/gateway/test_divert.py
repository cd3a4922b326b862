"""The gateway in front of the real Kafka and Redis: while the workers report every servable
version of a model open (on a breaker-state topic of the test's own), calls go to the model's
declared fallback, marked, or are refused at once when the caller allows none; once the states
clear, calls reach the model again. A prediction cached in Redis answers a call without
publishing it."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any

import numpy as np
import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient
from redis import Redis

from tests.integration.fakes import FakeWorker
from tests.integration.gateway.gateway_fixtures import (
    GatewayServer,
    ProtocolGateway,
    fraud_body,
    gateway_topics,
    served,
)
from tests.support import unique, wait_for
from tests.unit.gateway_harness import FRAUD
from tidegate.agents.breakers.breaker_board import BreakerPublisher
from tidegate.core.cache_settings import PredictionCacheSettings
from tidegate.core.settings import (
    KafkaSettings,
    PostgresSettings,
    RedisSettings,
    SchemaRegistrySettings,
    TopicSettings,
)
from tidegate.gateway.admission.admission_settings import AdmissionSettings
from tidegate.gateway.auth.auth_settings import AuthSettings
from tidegate.gateway.gateway_services import GatewayConfig
from tidegate.gateway.gateway_settings import GatewaySettings
from tidegate.lifecycle.domain import events as ev
from tidegate.lifecycle.domain.events import NewEvent
from tidegate.lifecycle.eventstore.lifecycle_log import LifecycleLog
from tidegate.lifecycle.lifecycle_settings import LifecycleSettings
from tidegate.schemas.catalog import BREAKER_STATE
from tidegate.schemas.prediction_keys import encode_outputs, prediction_key
from tidegate.schemas.registration import RegistryHttp, register_all
from tidegate.schemas.requests import FALLBACK_OF
from tidegate.schemas.tensors import from_numpy


@pytest.fixture
def topics(
    new_topic: Callable[..., str], registry_settings: SchemaRegistrySettings
) -> TopicSettings:
    """The gateway fixtures' topics, and a breaker-state topic of this test's own."""
    base = gateway_topics(new_topic, registry_settings)
    settings = base.model_copy(update={"breakers": new_topic("it-gw-breakers", 1)})
    with RegistryHttp(registry_settings) as http:
        list(register_all(http, {f"{settings.breakers}-value": BREAKER_STATE}))
    return settings


@pytest.fixture
def with_fallback(
    lifecycle: None,
    kafka_settings: KafkaSettings,
    topics: TopicSettings,
    registry_settings: SchemaRegistrySettings,
    pg_settings: PostgresSettings,
) -> None:
    """fraud-lite 7 (primary, fraud's signature), declared as fraud's fallback."""

    async def append() -> None:
        log = LifecycleLog.from_settings(
            pg_settings,
            LifecycleSettings(),
            kafka_settings,
            topics,
            registry_settings,
            publish=True,
        )
        async with log:
            lite = served("7", primary="7", signature=FRAUD)
            await log.append(
                "fraud-lite", [NewEvent(p, actor="it") for p in lite], expected_version=0
            )
            fraud_events = len(served("1", "2", primary="1", signature=FRAUD))
            declared = NewEvent(ev.FallbackSet("fraud-lite", reason="same signature"), actor="it")
            await log.append("fraud", [declared], expected_version=fraud_events)

    asyncio.run(append())


def config(
    kafka: KafkaSettings, topics: TopicSettings, registry: SchemaRegistrySettings, **extra: Any
) -> GatewayConfig:
    return GatewayConfig(
        gateway=GatewaySettings(replica_id=unique("replica")),
        kafka=kafka,
        topics=topics,
        registry=registry,
        auth=AuthSettings(enabled=False),  # not about authentication (test_auth.py is)
        **extra,
    )


@pytest.fixture
def gateway(
    kafka_settings: KafkaSettings,
    topics: TopicSettings,
    registry_settings: SchemaRegistrySettings,
    with_fallback: None,
) -> Iterator[GatewayServer]:
    server = GatewayServer(config(kafka_settings, topics, registry_settings)).start()
    yield server
    server.stop()


def breaker_record(version: str, state: str, open_for_s: float) -> dict[str, Any]:
    now = datetime.now(UTC)
    until = datetime.fromtimestamp(now.timestamp() + open_for_s, UTC) if state == "open" else None
    return {
        "model": "fraud",
        "version": version,
        "worker_id": "w-it",
        "state": state,
        "changed_at": now,
        "open_until": until,
        "trips": 1,
        "calls": 20,
        "failures": 20,
        "reason": "forced by the test",
    }


def test_open_breakers_send_calls_to_the_fallback_or_refuse_them_at_once(
    gateway: GatewayServer,
    worker: FakeWorker,
    kafka_settings: KafkaSettings,
    topics: TopicSettings,
    registry_settings: SchemaRegistrySettings,
) -> None:
    before = gateway.http.post("/v2/models/fraud/infer", json=fraud_body())
    assert before.status_code == 200, before.text
    assert before.json()["model_name"] == "fraud"

    publisher = BreakerPublisher(
        kafka_settings, topics, SchemaRegistryClient(registry_settings.client_config())
    )
    assert publisher.prepare()
    try:
        for version in ("1", "2"):  # every servable version
            publisher(f"fraud/{version}/w-it", breaker_record(version, "open", 60))
        publisher.close()

        def diverted() -> dict[str, Any] | None:
            resp = gateway.http.post("/v2/models/fraud/infer", json=fraud_body())
            assert resp.status_code == 200, resp.text
            body: dict[str, Any] = resp.json()
            return body if body["model_name"] == "fraud-lite" else None

        wait_for(diverted, timeout=20, what="a call answered by the fallback")
        # Marked for the worker, whose result then names the rule (tests/unit/agents/
        # test_inference_service.py; this fake worker does not route).
        assert worker.seen[-1]["model"] == "fraud-lite"
        assert worker.seen[-1]["parameters"][FALLBACK_OF] == "breaker-open@fraud"

        # No fallback allowed: refused at once, with the breakers' reopening time.
        seen = len(worker.seen)
        started = time.perf_counter()
        refused = gateway.http.post(
            "/v2/models/fraud/infer", json=fraud_body(parameters={"fallback": False})
        )
        elapsed = time.perf_counter() - started
        assert refused.status_code == 503, refused.text
        assert refused.json()["code"] == "UNAVAILABLE"
        assert 50 <= int(refused.headers["retry-after"]) <= 60
        assert elapsed < 0.5, f"refused after {elapsed * 1000:.0f} ms"
        assert len(worker.seen) == seen  # nothing was published

        # The workers' breakers close: calls reach the model again.
        publisher = BreakerPublisher(
            kafka_settings, topics, SchemaRegistryClient(registry_settings.client_config())
        )
        assert publisher.prepare()
        publisher("fraud/1/w-it", breaker_record("1", "closed", 0))
        publisher.close()

        def primary() -> bool:
            # The fallback answers until the gateway sees the state: never a failure.
            resp = gateway.http.post("/v2/models/fraud/infer", json=fraud_body())
            assert resp.status_code == 200, resp.text
            return bool(resp.json()["model_name"] == "fraud")

        wait_for(primary, timeout=20, what="calls served by fraud again")
    finally:
        publisher.close()


def test_a_cached_prediction_answers_without_publishing(
    kafka_settings: KafkaSettings,
    topics: TopicSettings,
    registry_settings: SchemaRegistrySettings,
    lifecycle: None,
    worker: FakeWorker,
) -> None:
    prefix = unique("it-gw-cache") + ":"
    cache = PredictionCacheSettings(models=frozenset({"echo"}), key_prefix=prefix)
    server = GatewayServer(config(kafka_settings, topics, registry_settings, cache=cache)).start()
    body = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": ["hi"]}]}
    redis = Redis.from_url(RedisSettings().url)
    key: str | None = None
    try:
        first = server.http.post("/v2/models/echo/infer", json=body)
        assert first.status_code == 200, first.text
        assert "parameters" not in first.json()  # computed, not cached
        published = len(worker.seen)
        record = worker.seen[-1]
        # Echo 1 is echo's one servable version: the gateway knows it before any worker does.
        key = prediction_key(
            prefix, "echo", "1", record["inputs"], (), record["parameters"], tenant=record["tenant"]
        )
        out = from_numpy("echo", np.array(["CACHED"], dtype=object))
        redis.set(key, encode_outputs([out]), px=60_000)
        hit = server.http.post("/v2/models/echo/infer", json=body)
        assert hit.status_code == 200, hit.text
        answer = hit.json()
        assert answer["outputs"][0]["data"] == ["CACHED"]
        assert answer["parameters"] == {"cached": True}
        assert answer["model_version"] == "1"
        assert len(worker.seen) == published  # never reached Kafka
    finally:
        if key is not None:
            redis.delete(key)
        redis.close()
        server.stop()


def test_a_call_over_its_models_limit_goes_to_the_fallback_past_the_protocol(
    kafka_settings: KafkaSettings,
    topics: TopicSettings,
    registry_settings: SchemaRegistrySettings,
    with_fallback: None,
    worker: FakeWorker,
) -> None:
    # fraud takes 2 calls at a time here; the protocol would refuse a third before the app
    # reads it, but fraud declares a fallback, so the call goes through to be diverted.
    admission = AdmissionSettings(probe=False, initial_limit=2, min_limit=1)
    server = ProtocolGateway(
        config(kafka_settings, topics, registry_settings, admission=admission)
    ).start()
    slow = fraud_body(parameters={"fake_delay_s": 3.0})
    try:
        with ThreadPoolExecutor(2) as pool:
            held = [
                pool.submit(server.http.post, "/v2/models/fraud/infer", json=slow) for _ in "ab"
            ]
            wait_for(lambda: len(worker.seen) >= 2, timeout=10, what="2 slow calls in flight")
            third = server.http.post("/v2/models/fraud/infer", json=fraud_body())
            assert third.status_code == 200, third.text
            assert third.json()["model_name"] == "fraud-lite"
            assert worker.seen[-1]["parameters"][FALLBACK_OF] == "overloaded@fraud"
            # A caller who allows no fallback is refused by admission, with its reason.
            refused = server.http.post(
                "/v2/models/fraud/infer", json=fraud_body(parameters={"fallback": False})
            )
            assert refused.status_code == 503, refused.text
            assert refused.json()["code"] == "OVERLOADED"
            assert [f.result().status_code for f in held] == [200, 200]
    finally:
        server.stop()
