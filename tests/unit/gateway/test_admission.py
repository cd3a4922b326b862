"""Load shedding, the reply router and the publisher's readiness, without servers."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from confluent_kafka import KafkaError

from tests.unit.gateway_harness import MemoryStore
from tidegate.core.errors import OverloadedError
from tidegate.core.settings import KafkaSettings, SchemaRegistrySettings, TopicSettings
from tidegate.gateway.admission import Admission
from tidegate.gateway.publisher import KafkaPublisher
from tidegate.gateway.replies import ReplyRouter


def test_admission_sheds_past_the_limit() -> None:
    admission = Admission(2)
    admission.admit("a")
    admission.admit("b")
    with pytest.raises(OverloadedError):
        admission.admit("c")
    admission.release("a")
    admission.admit("c")
    assert admission.in_flight == 2


def test_asynchronous_slots_expire(monkeypatch: pytest.MonkeyPatch) -> None:
    admission = Admission(1)
    admission.admit("async", ttl_s=5)
    with pytest.raises(OverloadedError):
        admission.check()
    later = time.monotonic() + 6
    monkeypatch.setattr(time, "monotonic", lambda: later)
    admission.check()
    assert admission.in_flight == 0


async def test_router_resolves_waiters_and_stores_every_result() -> None:
    store = MemoryStore()
    router = ReplyRouter(store)
    admission = Admission(10)
    router.listeners.append(admission.on_result)
    admission.admit("mine", ttl_s=60)
    future = router.expect("mine")
    router.deliver({"request_id": "mine"}, b"raw-1")
    router.deliver({"request_id": "late"}, b"raw-2")
    assert (await future)["request_id"] == "mine"
    await router.drain()
    assert store.requests["mine"].result == b"raw-1"
    assert store.requests["late"].result == b"raw-2"
    assert admission.in_flight == 0


async def test_router_forget_cancels() -> None:
    router = ReplyRouter(MemoryStore())
    future: asyncio.Future[dict[str, Any]] = router.expect("x")
    router.forget("x")
    assert future.cancelled()
    assert not router.is_waiting("x")


def test_publisher_not_connected_once_all_brokers_are_down() -> None:
    publisher = KafkaPublisher(KafkaSettings(), TopicSettings(), SchemaRegistrySettings())
    publisher._connected = True
    publisher._on_error(KafkaError(KafkaError._TRANSPORT))
    assert publisher.connected
    publisher._on_error(KafkaError(KafkaError._ALL_BROKERS_DOWN))
    assert not publisher.connected
