"""The local Kafka's secure listeners as `make up` starts them (infra/kafka-tls.sh): the settings of
each env file in var/kafka/tls, checked to reach a broker that answers on them."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.integration.workers import ROOT
from tidegate.core.kafka import make_admin
from tidegate.core.settings import KafkaSettings, read_env_file

__all__ = ["TLS", "listener"]

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
