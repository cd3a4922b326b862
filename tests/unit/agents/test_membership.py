"""How the worker joins its group: the options of each protocol (which librdkafka must accept),
the KIP-848 group config written at start, and a refused session timeout failing the worker."""

from __future__ import annotations

from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException
from pydantic import ValidationError

from tidegate.agents.kafka_io import membership
from tidegate.agents.kafka_io.membership import check_membership, consumer_options, prepare_group
from tidegate.agents.worker_settings import WorkerSettings
from tidegate.core.errors import ConfigurationError
from tidegate.core.kafka import consumer_config
from tidegate.core.settings import KafkaSettings


def settings(**values: Any) -> WorkerSettings:
    return WorkerSettings(group_id="g", worker_id="w", **values)


def test_the_classic_protocol_sends_the_session_and_heartbeat_and_is_cooperative() -> None:
    options = consumer_options(settings(session_timeout_ms=2500, heartbeat_interval_ms=400))
    assert options == {
        "group.protocol": "classic",
        "partition.assignment.strategy": "cooperative-sticky",
        "session.timeout.ms": 2500,
        "heartbeat.interval.ms": 400,
    }


def test_kip848_leaves_session_heartbeat_and_assignor_to_the_group() -> None:
    assert consumer_options(settings(group_protocol="consumer")) == {"group.protocol": "consumer"}


@pytest.mark.parametrize("protocol", ["classic", "consumer"])
def test_librdkafka_accepts_the_options_of_each_protocol(protocol: str) -> None:
    conf = consumer_config(
        KafkaSettings(), "g", consumer_options(settings(group_protocol=protocol))
    )
    Consumer(conf).close()  # raises KafkaException on an option the protocol refuses


def test_librdkafka_refuses_the_classic_options_under_kip848() -> None:
    conf = consumer_config(KafkaSettings(), "g", {"group.protocol": "consumer"})
    with pytest.raises(KafkaException, match=r"session\.timeout\.ms"):
        Consumer({**conf, "session.timeout.ms": 2000})


def test_the_heartbeat_must_be_shorter_than_the_session() -> None:
    with pytest.raises(ValidationError, match="heartbeat_interval_ms"):
        settings(session_timeout_ms=2000, heartbeat_interval_ms=2000)


def test_the_defaults_move_a_dead_workers_partitions_within_3_s() -> None:
    defaults = settings()
    assert defaults.session_timeout_ms <= 2000
    assert defaults.heartbeat_interval_ms * 4 <= defaults.session_timeout_ms


class Recorded:
    def __init__(self, error: Exception | None = None) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.error = error

    def __call__(self, *args: Any) -> None:
        self.calls.append(args)
        if self.error is not None:
            raise self.error


def test_a_kip848_worker_writes_its_session_into_the_group_config(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    admin, recorded = object(), Recorded()
    monkeypatch.setattr(membership, "make_admin", lambda _kafka: admin)
    monkeypatch.setattr(membership, "set_group_timeouts", recorded)
    prepare_group(KafkaSettings(), settings(group_protocol="consumer", session_timeout_ms=3000))
    assert recorded.calls == [(admin, "g", 3000, 500)]


def test_a_classic_worker_touches_no_group_config(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_admin(_kafka: KafkaSettings) -> None:
        raise AssertionError("a classic worker needs no admin client")

    monkeypatch.setattr(membership, "make_admin", no_admin)
    prepare_group(KafkaSettings(), settings(group_protocol="classic"))


def test_a_refused_group_config_is_logged_and_the_worker_goes_on(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    refused = KafkaException(KafkaError(KafkaError.GROUP_AUTHORIZATION_FAILED))
    monkeypatch.setattr(membership, "make_admin", lambda _kafka: object())
    monkeypatch.setattr(membership, "set_group_timeouts", Recorded(refused))
    prepare_group(KafkaSettings(), settings(group_protocol="consumer"))
    assert "cannot set the session timeout of group g" in caplog.text


def test_a_session_timeout_the_brokers_refuse_fails_the_worker() -> None:
    with pytest.raises(ConfigurationError, match="session_timeout_ms=2000"):
        check_membership(KafkaError(KafkaError.INVALID_SESSION_TIMEOUT), settings())
    check_membership(KafkaError(KafkaError._TRANSPORT), settings())  # others are only logged
