"""Reading a topic in the tests, with the real Kafka."""

from __future__ import annotations

from collections import defaultdict

from confluent_kafka import OFFSET_BEGINNING, Message, TopicPartition

from tests.support import unique, wait_for
from tidegate.core.kafka import make_consumer
from tidegate.core.settings import KafkaSettings

__all__ = ["read_topic"]


def read_topic(kafka: KafkaSettings, topic: str, timeout: float = 30.0) -> list[Message]:
    """Every message the topic holds now (up to each partition's end as it stands when called),
    partition by partition in offset order. Reading to the ends, not until some record shows up,
    is what lets a test say that a record is absent."""
    consumer = make_consumer(kafka, unique("topic-reader"))
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        ends = {
            p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
            for p in partitions
        }
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
        read: dict[int, list[Message]] = defaultdict(list)
        pending = {p for p, end in ends.items() if end > 0}

        def drain() -> bool:
            msg = consumer.poll(0.5)
            if msg is not None and msg.error() is None:
                partition, offset = msg.partition(), msg.offset()
                assert partition is not None
                assert offset is not None
                read[partition].append(msg)
                if offset + 1 >= ends[partition]:
                    pending.discard(partition)
            return not pending

        wait_for(drain, timeout=timeout, interval=0, what=f"the messages of {topic}")
        return [m for p in sorted(read) for m in read[p]]
    finally:
        consumer.close()
