"""The consumer thread's cycle: lag from real positions, pause and resume, seeks, commits."""

from __future__ import annotations

import time

import pytest
from confluent_kafka import TopicPartition
from prometheus_client import REGISTRY

from tests.support import unique
from tests.unit.agents.worker_support import FakeConsumer
from tidegate.agents.kafka_io import consumer_cycle
from tidegate.agents.kafka_io.consumer_cycle import ConsumerCycle


def lag(topic: str, partition: int) -> float | None:
    return REGISTRY.get_sample_value(
        "tidegate_worker_consumer_lag", {"topic": topic, "partition": str(partition)}
    )


def assigned(topic: str, *partitions: int) -> FakeConsumer:
    consumer = FakeConsumer(topic)
    consumer.subscribe([topic], on_assign=lambda *_: None)
    consumer.rebalance("assign", *partitions)
    consumer.poll(0)  # runs the assignment
    return consumer


def test_the_lag_gauge_is_the_high_watermark_minus_the_position() -> None:
    topic = unique("requests")
    consumer = assigned(topic, 0, 1)
    consumer.append(0, 10)
    consumer.append(1, 3)
    cycle = ConsumerCycle(consumer, poll_timeout_s=0.0, group_metadata=False)  # type: ignore[arg-type]
    taken = cycle.run([], False, [], room=4)  # reads 4 of partition 0 (the fake takes in order)
    assert len(taken) == 4
    cycle._lag_at = 0.0  # the next cycle refreshes the gauge
    cycle.run([], False, [], room=1)
    # Refreshed before that cycle's poll: 4 of 10 read.
    assert lag(topic, 0) == 6.0
    assert lag(topic, 1) == 3.0
    assert lag(topic, 2) is None, "a partition this worker does not hold has no lag here"


def test_lag_stays_unset_until_a_refresh_ran() -> None:
    topic = unique("requests")
    consumer = assigned(topic, 0)
    consumer.append(0, 5)
    cycle = ConsumerCycle(consumer, poll_timeout_s=0.0, group_metadata=False)  # type: ignore[arg-type]
    cycle._lag_at = float("inf")
    cycle.run([], False, [], room=1)
    assert lag(topic, 0) is None


def test_pause_resume_seek_and_commit_reach_the_consumer() -> None:
    topic = unique("requests")
    consumer = assigned(topic, 0)
    consumer.append(0, 5)
    cycle = ConsumerCycle(consumer, poll_timeout_s=0.0, group_metadata=False)  # type: ignore[arg-type]
    cycle.run([TopicPartition(topic, 0, 2)], True, [TopicPartition(topic, 0, 1)], room=10)
    assert ("pause", [0]) in consumer.calls
    assert ("seek", 0, 1) in consumer.calls
    assert consumer.committed() == {0: 2}
    assert cycle.paused
    taken = cycle.run([], False, [], room=10)
    assert ("resume", [0]) in consumer.calls
    assert [m.offset() for m in taken] == [1, 2, 3, 4], "not read from the seek"
    assert consumer_cycle._LAG_EVERY_S > 0


def test_the_fetch_window_counts_from_when_the_last_batch_went(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen: list[float | None] = []

    def ready(*_args: object, since: float | None = None) -> list[object]:
        seen.append(since)
        return []

    monkeypatch.setattr(consumer_cycle, "consume_ready", ready)
    consumer = assigned(unique("requests"), 0)
    cycle = ConsumerCycle(
        consumer,  # type: ignore[arg-type]
        poll_timeout_s=0.0,
        group_metadata=False,
        fetch_window_s=0.010,
    )
    before = time.monotonic()
    cycle.run([], False, [], room=10)
    after = time.monotonic()
    cycle.run([], False, [], room=10)
    handed = seen[1]
    assert handed is not None
    assert before <= handed <= after, "the window did not start from the previous hand-over"
