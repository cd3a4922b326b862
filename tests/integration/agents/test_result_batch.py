"""A flush's results through librdkafka's batch call against the real broker: keyless results
land on the one partition the publisher picked (confluent-kafka's `produce_batch` ignores a
message's own partition, so the call must name it), keyed ones on their key's partition, and
every message is acknowledged."""

from __future__ import annotations

from collections.abc import Callable

from confluent_kafka import KafkaError, Message

from tests.support import wait_for
from tidegate.agents.kafka_io.delivery import ResultBatch, ResultPublisher
from tidegate.core.kafka import make_producer
from tidegate.core.settings import KafkaSettings, TopicSettings


def test_keyless_results_land_on_the_named_partition_and_keyed_ones_by_key(
    kafka_settings: KafkaSettings, new_topic: Callable[..., str]
) -> None:
    topic = new_topic("w-batch-results", 8)
    producer = make_producer(kafka_settings)
    publisher = ResultPublisher(producer, None, TopicSettings(results=topic))  # type: ignore[arg-type]
    landed: dict[bytes, int] = {}
    failures: list[BaseException] = []

    def ack(err: KafkaError | None, msg: Message) -> None:
        assert err is None, err
        landed[msg.value() or b""] = int(msg.partition() or 0)

    # Keyed messages go where a single `produce` of the same key goes: the reference.
    reference: dict[bytes, int | None] = {}
    for key in (b"card-1", b"card-2", b"card-3"):
        producer.produce(
            topic,
            key=key,
            value=b"ref-" + key,
            on_delivery=lambda e, m: reference.__setitem__(m.key() or b"", m.partition()),
        )
    batch = ResultBatch(publisher, ack, failures.append)
    for i in range(6):
        batch.add(f"keyless-{i}".encode(), f"request-{i}".encode(), 5)
    for key in (b"card-1", b"card-2", b"card-3"):
        batch.add(b"keyed-" + key, key, None)
    batch.send()
    assert producer.flush(30) == 0
    wait_for(lambda: (len(landed) == 9 and len(reference) == 3) or None, what="acknowledgements")
    assert not failures
    assert {landed[f"keyless-{i}".encode()] for i in range(6)} == {5}
    for key in (b"card-1", b"card-2", b"card-3"):
        assert landed[b"keyed-" + key] == reference[key]
