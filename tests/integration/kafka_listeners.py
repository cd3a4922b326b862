"""The local Kafka's secure listeners as `make up` starts them (infra/kafka-tls.sh): the settings of
each env file in var/kafka/tls, checked to reach a broker that answers on them."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from confluent_kafka import KafkaError

from tests.integration.workers import ROOT
from tests.support import wait_for
from tidegate.core.kafka import make_admin, make_producer
from tidegate.core.settings import KafkaSettings, read_env_file

__all__ = ["TLS", "delivery", "listener"]

TLS = Path(os.environ.get("TIDEGATE_STACK_VAR", ROOT / "var")) / "kafka" / "tls"
PREFIX = "TIDEGATE_KAFKA_"


def listener(name: str) -> KafkaSettings:
    """The settings of var/kafka/tls/NAME.env, checked to reach a broker that answers on them."""
    path = TLS / f"{name}.env"
    if not path.exists():
        pytest.fail(f"no {path}: start the stack with its secure listeners (`make up`)")
    settings = KafkaSettings.model_validate(read_env_file(path, PREFIX))
    try:
        make_admin(settings).list_topics(timeout=15)
    except Exception as exc:
        pytest.fail(
            f"{settings.bootstrap_servers} ({name}) does not answer ({exc}); a broker started "
            "before the secure listeners existed needs `make down && make up`"
        )
    return settings


def delivery(
    settings: KafkaSettings,
    topic: str,
    partition: int = 0,
    *,
    errors: list[KafkaError] | None = None,
    timeout_ms: int = 10_000,
) -> KafkaError | None:
    """Produces one record with `settings`: None when the broker took it, else its error. The
    client's own errors (a failed handshake, say) go to `errors` when given."""
    outcome: list[KafkaError | None] = []
    config: dict[str, object] = {"message.timeout.ms": timeout_ms}
    if errors is not None:
        config["error_cb"] = errors.append
    producer = make_producer(settings, config)
    producer.produce(
        topic,
        key=b"k",
        value=b"x",
        partition=partition,
        on_delivery=lambda e, _m: outcome.append(e),
    )
    wait_for(lambda: producer.poll(0.2) >= 0 and outcome, timeout=30, what="a delivery report")
    return outcome[0]
