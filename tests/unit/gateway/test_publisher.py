"""The gateway's publisher without a broker: the record size limit, how it learns that Kafka
is unreachable and back (readiness, and the 503 at once), and the publish window."""

from __future__ import annotations

import asyncio
import json
import threading
import time
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


def publisher(linger_ms: float = 20.0) -> KafkaRequestPublisher:
    return KafkaRequestPublisher(
        KafkaSettings(),
        TopicSettings(),
        SchemaRegistrySettings(),
        gateway=GatewaySettings(publish_linger_ms=linger_ms),
    )


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


def test_librdkafka_lingers_only_for_a_windows_enqueueing() -> None:
    """The publish window holds requests for `publish_linger_ms` (decision 019); librdkafka
    lingers 2 ms more, so that one window's requests, enqueued one by one, share a
    ProduceRequest, and not at all when no linger is asked for."""
    assert producer_options(GatewaySettings(), 1000)["linger.ms"] == 2.0
    assert producer_options(GatewaySettings(publish_linger_ms=0), 1000)["linger.ms"] == 0
    options = producer_options(GatewaySettings(publish_linger_ms=1, publish_timeout_s=2), 5000)
    assert options["linger.ms"] == 1
    assert options["message.timeout.ms"] == 2000
    assert options["batch.size"] == options["message.max.bytes"] == 5000


class _Producer:
    """Takes `publish_record` calls; each one's delivery report is sent by the test. A record
    whose id starts with "big" is refused as over the limit, as the real producer refuses it."""

    def __init__(self) -> None:
        self.reports: list[Any] = []
        self.enqueued: list[tuple[str, float, bool]] = []  # request id, when, whether it polled
        self.stopped = False

    def publish_record(
        self, record: Any, on_delivery: Any, lane: Any = None, *, poll: bool = True
    ) -> None:
        if record["request_id"].startswith("big"):
            raise RecordTooLargeError(2_000, 1_000)
        self.enqueued.append((record["request_id"], time.monotonic(), poll))
        self.reports.append(on_delivery)

    def stop(self) -> None:
        self.stopped = True


def started(linger_ms: float = 20.0) -> tuple[KafkaRequestPublisher, _Producer]:
    pub = publisher(linger_ms)
    producer = _Producer()
    pub._producer = producer  # type: ignore[assignment]
    pub._connected = True
    return pub, producer


async def flushed(producer: _Producer, count: int, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while len(producer.enqueued) < count:
        assert time.monotonic() < deadline, f"{producer.enqueued} after {timeout_s}s"
        await asyncio.sleep(0.005)


async def test_one_windows_requests_are_enqueued_together_once_it_ends() -> None:
    """A request waits out the window, then all that came meanwhile are encoded and enqueued
    in one pass, in their order, without a poll each (the polling thread serves reports)."""
    pub, producer = started(linger_ms=100)
    failures: list[Exception] = []
    began = time.monotonic()
    pub.send(request("a"), "realtime", failures.append)
    acked = pub.submit(request("b"))
    pub.send(request("c"), "realtime", failures.append)
    await asyncio.sleep(0)
    assert producer.enqueued == [], "held for the window"
    await flushed(producer, 3)
    assert [rid for rid, _, _ in producer.enqueued] == ["a", "b", "c"]
    times = [at for _, at, _ in producer.enqueued]
    assert times[0] - began >= 0.09, "not before the window ends"
    assert times[-1] - times[0] < 0.05, "in one pass"
    assert not any(polled for _, _, polled in producer.enqueued)
    assert not acked.done()
    assert failures == []
    pub.send(request("d"), "realtime", failures.append)
    await flushed(producer, 4)
    assert producer.enqueued[3][1] - times[-1] >= 0.09, "the next window starts with its request"


async def test_a_request_refused_at_the_flush_fails_its_own_call_alone() -> None:
    """A record over the limit fails only its call, with the same error (a 413) that the call
    would have had at once, and says nothing about Kafka's health."""
    pub, producer = started(linger_ms=5)
    failures: list[Exception] = []
    ok = pub.send(request("ok-1"), "realtime", failures.append)
    big = pub.send(request("big-1"), "realtime", failures.append)
    big_ack = pub.submit(request("big-2"))
    pub.send(request("ok-2"), "realtime", failures.append)
    await flushed(producer, 2)
    assert [rid for rid, _, _ in producer.enqueued] == ["ok-1", "ok-2"]
    assert isinstance(big.error, RecordTooLargeError)
    assert failures == [big.error]
    with pytest.raises(RecordTooLargeError):
        await big_ack
    assert ok.error is None
    assert pub.connected


async def test_stop_enqueues_what_the_window_holds_before_the_producer_stops() -> None:
    pub, producer = started(linger_ms=1000)
    pub.send(request("a"), "realtime", lambda _error: None)
    await pub.stop()
    assert [rid for rid, _, _ in producer.enqueued] == ["a"]
    assert producer.stopped


def on_thread(report: Any, *args: Any) -> None:
    thread = threading.Thread(target=report, args=args)
    thread.start()
    thread.join()


async def test_an_acknowledged_send_wakes_nothing_and_a_failed_one_ends_its_call() -> None:
    pub, producer = started(linger_ms=1)
    failures: list[Exception] = []
    ok = pub.send(request("a"), "realtime", failures.append)
    bad = pub.send(request("b"), "realtime", failures.append)
    await flushed(producer, 2)
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
