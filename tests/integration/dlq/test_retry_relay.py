"""The retry relay against the real Kafka: a partition waits for its head to be due while
another one flows, and a request Kafka refuses to take back is dead-lettered, not lost."""

from __future__ import annotations

import time
from typing import Any

from confluent_kafka import TopicPartition
from confluent_kafka.schema_registry import SchemaRegistryClient

from tests.integration.workers import Reader, Stack
from tests.support import unique, wait_for
from tidegate.core.errors import ModelUnavailableError
from tidegate.core.kafka import make_consumer, make_producer
from tidegate.dlq.envelopes import dead_letter, error_info, source_position
from tidegate.dlq.redelivery import read_lineage
from tidegate.dlq.retry_relay import RetryRelay
from tidegate.schemas.catalog import DEAD_LETTER_ENVELOPE, load_schema
from tidegate.schemas.codec import AvroEncoder


def waiting(stack: Stack, name: str, partition: int, due_ms: int) -> dict[str, Any]:
    now = int(time.time() * 1000)
    return dead_letter(
        source=source_position(stack.topics.requests, partition, 7),
        error=error_info(ModelUnavailableError("down")),
        key=name.encode(),
        value=f"request {name}".encode(),
        headers=[("traceparent", b"00-abc")],
        timestamp_ms=now,
        failed_at_ms=now,
        request_id=name,
        model="tiny",
        retry_at_ms=due_ms,
    )


def write(stack: Stack, envelopes: list[tuple[int, dict[str, Any]]]) -> None:
    """(retry partition, envelope) onto retry level 1."""
    topic = stack.topics.retry_topic(1)
    client = SchemaRegistryClient(stack.registry.client_config())
    encoder = AvroEncoder(client, load_schema(DEAD_LETTER_ENVELOPE))
    schema_id = encoder.schema_id(f"{topic}-value")
    producer = make_producer(stack.kafka)
    for partition, envelope in envelopes:
        value = encoder.encode(envelope, schema_id)
        producer.produce(topic, key=envelope["original_key"], value=value, partition=partition)
    assert producer.flush(30) == 0


class Requests:
    """Raw records on the requests topic."""

    def __init__(self, stack: Stack) -> None:
        self.consumer = make_consumer(stack.kafka, unique("relay-reader"))
        self.consumer.assign([TopicPartition(stack.topics.requests, p, 0) for p in range(4)])
        self.seen: list[Any] = []

    def poll(self) -> list[Any]:
        self.seen += [m for m in self.consumer.consume(100, 0.2) if not m.error()]
        return self.seen


def test_a_partition_waits_for_its_head_while_another_flows(stack: Stack) -> None:
    now = int(time.time() * 1000)
    write(
        stack,
        [
            (0, waiting(stack, "later", 1, now + 4000)),
            (0, waiting(stack, "behind-later", 1, now)),  # due, but behind its head
            (1, waiting(stack, "now", 2, now)),
        ],
    )
    relay = RetryRelay(
        stack.kafka,
        stack.topics,
        SchemaRegistryClient(stack.registry.client_config()),
        group_id=unique("relay"),
    )
    requests = Requests(stack)
    relay.start()
    try:
        wait_for(lambda: len(requests.poll()) >= 1, timeout=30, what="the due request")
        first = requests.seen[0]
        assert first.key() == b"now"
        assert first.partition() == 2  # back to the partition it was read from
        assert first.value() == b"request now"
        lineage = read_lineage(first.headers())
        assert lineage is not None
        assert lineage.attempt == 2
        assert [s["kind"] for s in lineage.history] == ["retry"]
        assert ("traceparent", b"00-abc") in first.headers()
        wait_for(lambda: len(requests.poll()) >= 3, timeout=30, what="the waiting partition")
        keys = [m.key() for m in requests.seen]
        assert keys[1:] == [b"later", b"behind-later"]  # in order, the head first
        waited = requests.seen[1].timestamp()[1] - now
        assert waited >= 3500, f"the head went {waited} ms after it failed, before it was due"
    finally:
        relay.stop()
        requests.consumer.close()
    assert relay.failed is None


def test_a_request_kafka_refuses_back_is_dead_lettered(stack: Stack) -> None:
    now = int(time.time() * 1000)
    # Its partition does not exist (the requests topic has 4): Kafka refuses the republish.
    write(stack, [(0, waiting(stack, "nowhere", 99, now)), (0, waiting(stack, "fine", 0, now))])
    failed = Reader(stack, stack.topics.failed)
    requests = Requests(stack)
    relay = RetryRelay(
        stack.kafka,
        stack.topics,
        SchemaRegistryClient(stack.registry.client_config()),
        group_id=unique("relay"),
    )
    relay.start()
    try:
        (letter,) = failed.until(1, timeout=30)
        wait_for(lambda: len(requests.poll()) >= 1, timeout=30, what="the other request")
    finally:
        relay.stop()
        requests.consumer.close()
        failed.close()
    assert letter["request_id"] == "nowhere"
    assert [m.key() for m in requests.seen] == [b"fine"]
    assert relay.failed is None
    assert relay.relayed == 1


def test_a_request_kafka_refuses_at_once_is_dead_lettered(stack: Stack) -> None:
    """Once the relay's producer knows the requests topic (it relayed a request there), a
    partition that is not there is refused by `produce` itself, not on delivery."""
    now = int(time.time() * 1000)
    failed = Reader(stack, stack.topics.failed)
    requests = Requests(stack)
    relay = RetryRelay(
        stack.kafka,
        stack.topics,
        SchemaRegistryClient(stack.registry.client_config()),
        group_id=unique("relay"),
    )
    relay.start()
    try:
        write(stack, [(0, waiting(stack, "first", 0, now))])
        wait_for(lambda: len(requests.poll()) >= 1, timeout=30, what="the first request")
        write(stack, [(0, waiting(stack, "nowhere", 99, now))])
        (letter,) = failed.until(1, timeout=30)
    finally:
        relay.stop()
        requests.consumer.close()
        failed.close()
    assert letter["request_id"] == "nowhere"
    assert relay.failed is None
    assert relay.relayed == 1
