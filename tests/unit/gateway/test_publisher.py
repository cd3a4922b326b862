"""The gateway's publisher without a broker: the record size limit, and how it learns that Kafka
is unreachable and back (readiness, and the 503 at once)."""

from __future__ import annotations

import asyncio
import json
import threading
from typing import Any, cast

import pytest
from confluent_kafka import KafkaError, Producer

from tidegate.clients.producer import PublishError, RecordTooLargeError, TidegateProducer
from tidegate.core.settings import KafkaSettings, SchemaRegistrySettings, TopicSettings
from tidegate.gateway.gateway_settings import GatewaySettings
from tidegate.gateway.roundtrip.request_publisher import (
    KafkaRequestPublisher,
    producer_options,
    record_limit,
)
from tidegate.schemas.records import RequestRecord


def publisher() -> KafkaRequestPublisher:
    return KafkaRequestPublisher(KafkaSettings(), TopicSettings(), SchemaRegistrySettings())


def request(request_id: str) -> RequestRecord:
    """A minimal request (the fake producer below does not look into it)."""
    return {"request_id": request_id, "model": "m", "inputs": [], "created_at": 0}


def stats(*states: str) -> str:
    brokers = {f"127.0.0.1:9092/{i}": {"state": state} for i, state in enumerate(states)}
    return json.dumps({"brokers": brokers})


def test_the_topic_lowers_the_limit_with_room_for_the_batch() -> None:
    assert record_limit(1_000_000, None) == 1_000_000
    # Kafka's default max.message.bytes leaves the producer's default alone.
    assert record_limit(1_000_000, 1_048_588) == 1_000_000
    small = record_limit(1_000_000, 100_000)
    assert 95_000 < small < 100_000


def test_unreachable_on_all_brokers_down_and_back_once_a_broker_is_up() -> None:
    pub = publisher()
    pub._connected = True
    pub._on_error(KafkaError(KafkaError._TRANSPORT))
    assert pub.connected, "one broker's connection failing is not an outage"
    pub._on_error(KafkaError(KafkaError._ALL_BROKERS_DOWN))
    assert not pub.connected
    with pytest.raises(PublishError, match="no Kafka broker is reachable"):
        pub.check()
    pub._on_stats(stats("DOWN", "CONNECT"))
    assert not pub.connected
    pub._on_stats(stats("DOWN", "UP"))
    assert pub.connected
    pub.check()


async def test_a_failed_delivery_marks_kafka_unreachable_but_a_large_record_does_not() -> None:
    pub = publisher()
    pub._connected = True
    loop = asyncio.get_running_loop()
    too_large: asyncio.Future[None] = loop.create_future()
    pub._resolve(too_large, RecordTooLargeError(None, 1000))
    assert pub.connected
    assert isinstance(too_large.exception(), RecordTooLargeError)
    timed_out: asyncio.Future[None] = loop.create_future()
    pub._resolve(timed_out, PublishError("Local: Message timed out"))
    assert not pub.connected
    assert isinstance(timed_out.exception(), PublishError)
    delivered: asyncio.Future[None] = loop.create_future()
    pub._resolve(delivered, None)
    assert pub.connected


class _Encoder:
    def __init__(self, size: int) -> None:
        self.size = size

    def encode(self, record: Any, schema_id: int) -> bytes:
        return b"\0" * self.size


@pytest.mark.parametrize(("size", "refused"), [(1_500, False), (2_100, True)])
def test_a_record_over_the_limit_is_refused_before_it_is_enqueued(size: int, refused: bool) -> None:
    extra = {"message.max.bytes": 2_000, "batch.size": 2_000}
    producer = TidegateProducer(producer_extra=extra)
    # Enqueueing needs no broker: librdkafka checks sizes when a message is produced.
    local = Producer({"bootstrap.servers": "127.0.0.1:1", "log_level": 0, **extra})
    producer._producer = local
    producer._encoder = _Encoder(size)  # type: ignore[assignment]
    # A fake encoder sizes the record: only the fields the producer itself reads are needed.
    record = cast(RequestRecord, {"request_id": "r-1", "routing_key": None})
    if not refused:
        # No broker to ask for the partition count (a keyless record's sticky partition): the
        # lookup would wait out its 5 s timeout.
        producer.partition_count = lambda topic, timeout=0.0: None  # type: ignore[method-assign]
        producer.publish_record(record)
        assert len(local) >= 1, "enqueued"
        return
    with pytest.raises(RecordTooLargeError) as exc:
        producer.publish_record(record)
    assert (exc.value.size, exc.value.limit) == (size + len(b"r-1"), 2_000)
    assert "2000 bytes" in str(exc.value)


def test_the_producer_lingers_as_configured() -> None:
    """Keyless calls share a sticky partition; the linger is what lets a few of them share one
    ProduceRequest (decision 019): 20 ms unless configured otherwise."""
    assert producer_options(GatewaySettings(), 1000)["linger.ms"] == 20.0
    options = producer_options(GatewaySettings(publish_linger_ms=3, publish_timeout_s=2), 5000)
    assert options["linger.ms"] == 3
    assert options["message.timeout.ms"] == 2000
    assert options["batch.size"] == options["message.max.bytes"] == 5000


class _Producer:
    """Takes `publish_record` calls; each one's delivery report is sent by the test."""

    def __init__(self) -> None:
        self.reports: list[Any] = []

    def publish_record(self, record: Any, on_delivery: Any, lane: Any = None) -> None:
        self.reports.append(on_delivery)


def on_thread(report: Any, *args: Any) -> None:
    thread = threading.Thread(target=report, args=args)
    thread.start()
    thread.join()


async def test_an_acknowledged_send_wakes_nothing_and_a_failed_one_ends_its_call() -> None:
    pub = publisher()
    producer = _Producer()
    pub._producer = producer  # type: ignore[assignment]
    pub._connected = True
    failures: list[Exception] = []
    ok = pub.send(request("a"), "realtime", failures.append)
    bad = pub.send(request("b"), "realtime", failures.append)
    loop = asyncio.get_running_loop()
    woken: list[object] = []
    threadsafe = loop.call_soon_threadsafe

    def counted(*args: Any, **kwargs: Any) -> Any:
        woken.append(args[0])
        return threadsafe(*args, **kwargs)

    loop.call_soon_threadsafe = counted  # type: ignore[method-assign,assignment]
    try:
        # Delivery reports come on the producer's thread.
        on_thread(producer.reports[0], "a", None)
        assert ok.acked
        assert woken == [], "an acknowledgement is a flag: the loop is not woken for it"
        on_thread(producer.reports[1], "b", RuntimeError("Local: Message timed out"))
        await asyncio.sleep(0)
    finally:
        loop.call_soon_threadsafe = threadsafe  # type: ignore[method-assign]
    assert len(woken) == 1
    assert not bad.acked
    assert isinstance(bad.error, PublishError)
    assert failures == [bad.error]
    assert not pub.connected, "a failed delivery marks Kafka unreachable"
