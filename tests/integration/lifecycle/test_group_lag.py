"""The controller's view of the workers' lag: every partition of the topic, held or not, from the
group's committed offsets and the partitions' end offsets on the real broker."""

from __future__ import annotations

from collections.abc import Callable

from confluent_kafka import Consumer, TopicPartition
from prometheus_client import REGISTRY

from tests.support import unique, wait_for
from tidegate.core.kafka import make_consumer, make_producer
from tidegate.core.settings import KafkaSettings
from tidegate.lifecycle.control.group_lag import GroupLag


def exported(group: str, topic: str, partition: int) -> float | None:
    labels = {"group": group, "topic": topic, "partition": str(partition)}
    return REGISTRY.get_sample_value("tidegate_group_lag", labels)


def unassigned(group: str, topic: str) -> float | None:
    labels = {"group": group, "topic": topic}
    return REGISTRY.get_sample_value("tidegate_group_unassigned_partitions", labels)


def test_lag_covers_every_partition_and_counts_the_ones_no_member_holds(
    kafka_settings: KafkaSettings, new_topic: Callable[..., str]
) -> None:
    topic = new_topic("lag", partitions=4)
    group = unique("lag-group")
    producer = make_producer(kafka_settings)
    for partition, count in ((0, 10), (1, 5)):
        for i in range(count):
            producer.produce(topic, value=f"{i}".encode(), partition=partition)
    assert producer.flush(10) == 0
    committer: Consumer = make_consumer(kafka_settings, group)
    committer.commit(offsets=[TopicPartition(topic, 0, 4)], asynchronous=False)
    committer.close()

    lag = GroupLag(kafka_settings, group, topic, every_s=60)
    assert lag.refresh() == {0: 6, 1: 5, 2: 0, 3: 0}, "not end minus commit (or earliest)"
    assert [exported(group, topic, p) for p in range(4)] == [6.0, 5.0, 0.0, 0.0]
    assert unassigned(group, topic) == 4.0, "an empty group holds no partition"

    member: Consumer = make_consumer(kafka_settings, group)
    try:
        member.subscribe([topic])
        wait_for(
            lambda: member.poll(0.2) is not None or bool(member.assignment()),
            what="the member's assignment",
        )
        wait_for(
            lambda: lag.refresh() is not None and unassigned(group, topic) == 0.0,
            what="every partition held",
        )
    finally:
        member.close()
