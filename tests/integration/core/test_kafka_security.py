"""The pipeline over the local Kafka's SASL_SSL listener, and its mutual-TLS listener, as `make up`
starts them (infra/kafka-tls.sh: SCRAM-SHA-512 user `tidegate`, certificates of the stack's own CA,
settings in var/kafka/tls/*.env).

The worker, its lifecycle feed, the producer of the requests and the reader of the results all get
settings whose only bootstrap server is the secure port, so the pipeline cannot fall back to
PLAINTEXT; only the topics are made through the PLAINTEXT admin of the shared fixtures. The
refusals are checked by what matters: nothing a refused client sends is delivered.
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np
import pytest
from confluent_kafka import KafkaError, TopicPartition
from pydantic import SecretStr

from tests.integration.kafka_listeners import delivery, listener
from tests.integration.workers import (
    Reader,
    Stack,
    in_thread,
    publish,
    request,
    running,
    tiny_softmax,
)
from tests.support import unique, wait_for
from tidegate.core.kafka import make_consumer, make_producer
from tidegate.core.settings import KafkaSettings
from tidegate.models.model_settings import ModelSettings


@pytest.fixture(scope="module")
def sasl_ssl() -> KafkaSettings:
    return listener("sasl-ssl")


@pytest.fixture(scope="module")
def mtls() -> KafkaSettings:
    return listener("mtls")


async def test_the_pipeline_runs_over_sasl_ssl(
    stack: Stack, models: ModelSettings, sasl_ssl: KafkaSettings, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    secure = replace(stack, kafka=sasl_ssl)
    rng = np.random.default_rng(11)
    rows = rng.normal(0, 2, size=(24, 4)).astype(np.float32)
    results = Reader(secure, secure.topics.results)
    async with running(secure, models):
        publish(
            secure,
            [
                request(f"tls{i}", f"k{i % 6}", [float(v) for v in row])
                for i, row in enumerate(rows)
            ],
        )
        got = await in_thread(results.until, len(rows), 60.0)
    results.close()
    by_id = {r["request_id"]: r for r in got}
    assert set(by_id) == {f"tls{i}" for i in range(len(rows))}
    for i, row in enumerate(rows):
        served = by_id[f"tls{i}"]
        assert (served["status"], served["model_version"]) == ("OK", "1")
        probabilities = struct.unpack("<2f", served["outputs"][0]["data"])
        np.testing.assert_allclose(probabilities, tiny_softmax("1", row[None])[0], atol=1e-6)
    assert sasl_ssl.sasl_password is not None
    assert sasl_ssl.sasl_password.get_secret_value() not in caplog.text, "the password was logged"


def refused(settings: KafkaSettings, topic: str) -> list[KafkaError]:
    """Produces one message with `settings`: asserts it is not delivered, returns the client's
    errors."""
    errors: list[KafkaError] = []
    outcome = delivery(settings, topic, errors=errors, timeout_ms=5000)
    assert outcome is not None, "a client that should have been refused wrote to Kafka"
    return errors


def round_trip(settings: KafkaSettings, topic: str) -> None:
    """Produces one message with `settings` and reads it back with them."""
    value = unique("v").encode()
    producer = make_producer(settings)
    producer.produce(topic, value=value)
    assert producer.flush(30) == 0
    consumer = make_consumer(settings, unique("tls-reader"))
    consumer.assign([TopicPartition(topic, 0, 0)])
    try:
        msg = wait_for(lambda: consumer.poll(0.5), timeout=30, what="the message back")
    finally:
        consumer.close()
    assert msg.error() is None
    assert msg.value() == value


def test_a_wrong_scram_password_is_refused(
    sasl_ssl: KafkaSettings, new_topic: Callable[..., str]
) -> None:
    topic = new_topic("tls-scram")
    round_trip(sasl_ssl, topic)
    wrong = sasl_ssl.model_copy(update={"sasl_password": SecretStr("not-the-password")})
    errors = refused(wrong, topic)
    assert any(e.code() == KafkaError._AUTHENTICATION for e in errors), errors


def test_mtls_needs_the_client_certificate(
    mtls: KafkaSettings, new_topic: Callable[..., str]
) -> None:
    topic = new_topic("tls-mtls")
    round_trip(mtls, topic)
    anonymous: dict[str, Any] = {
        "ssl_certificate_location": None,
        "ssl_key_location": None,
        "ssl_key_password": None,
    }
    errors = refused(mtls.model_copy(update=anonymous), topic)
    # TLS 1.3: the broker's alert ("bad certificate") arrives after the handshake, as a receive.
    assert any("certificate" in e.str() for e in errors), errors


def test_the_brokers_certificate_is_checked(
    sasl_ssl: KafkaSettings, new_topic: Callable[..., str]
) -> None:
    # Without the stack's CA the broker's certificate is one of an unknown issuer.
    topic = new_topic("tls-ca")
    errors = refused(sasl_ssl.model_copy(update={"ssl_ca_location": None}), topic)
    assert any(e.code() == KafkaError._SSL for e in errors), errors
