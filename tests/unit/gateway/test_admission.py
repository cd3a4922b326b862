"""Load shedding and the publisher's readiness, without servers."""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError

from tidegate.core.errors import OverloadedError
from tidegate.core.settings import KafkaSettings, SchemaRegistrySettings, TopicSettings
from tidegate.gateway.admission.admission_control import Admission
from tidegate.gateway.admission.admission_settings import AdmissionSettings
from tidegate.gateway.roundtrip.request_publisher import KafkaRequestPublisher


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_admission_sheds_past_the_limit() -> None:
    admission = Admission(2)
    admission.admit("a")
    admission.admit("b")
    with pytest.raises(OverloadedError):
        admission.admit("c")
    admission.release("a")
    admission.admit("c")
    assert admission.in_flight == 2


def test_asynchronous_slots_expire() -> None:
    clock = Clock()
    admission = Admission(1, AdmissionSettings(probe=False), clock=clock)
    admission.admit("async", ttl_s=5)
    with pytest.raises(OverloadedError):
        admission.check()
    clock.now += 6
    admission.check()
    assert admission.in_flight == 0


def test_publisher_not_connected_once_all_brokers_are_down() -> None:
    publisher = KafkaRequestPublisher(KafkaSettings(), TopicSettings(), SchemaRegistrySettings())
    publisher._connected = True
    publisher._on_error(KafkaError(KafkaError._TRANSPORT))
    assert publisher.connected
    publisher._on_error(KafkaError(KafkaError._ALL_BROKERS_DOWN))
    assert not publisher.connected
