"""The worker's Kafka hot path, driven through `start`, `stop`, `wait` and the rebalance callbacks.

Most tests swap confluent-kafka's `Consumer` for `FakeConsumer`: a log per partition that runs the
rebalances a test schedules inside `poll()`, on the worker's consumer thread, as librdkafka does
(`close()` revokes what is still assigned, as librdkafka's does), and records every commit, pause,
resume, seek and close. One test runs the real consumer against librdkafka's mock cluster, to see
the commits land in Kafka. Nothing is produced: the publisher holds each result's acknowledgement
until the test gives it, and a request's value is its id (`tests.unit.agents.test_delivery`'s
`decode`), `p<partition>-<offset>` here.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from prometheus_client import REGISTRY

from tests.support import eventually, unique
from tests.unit.agents import delivery_support as delivery
from tests.unit.agents.dataplane_support import until
from tests.unit.agents.worker_support import (
    FakeConsumer,
    Harness,
    WorkerPublisher,
    rebalanced,
    rid,
)
from tidegate.agents import worker as worker_module
from tidegate.agents.kafka_io.partition import PartitionPipeline
from tidegate.core.errors import RegistryUnavailableError
from tidegate.core.kafka import make_consumer
from tidegate.core.settings import KafkaSettings
from tidegate.schemas.records import RequestRecord, ResultRecord


class FlakyDecode:
    """`decode`, except that each value in `unreachable` fails once as if the registry were down."""

    def __init__(self, *unreachable: bytes) -> None:
        self.unreachable = set(unreachable)
        self.seen: list[bytes | None] = []

    def __call__(self, data: bytes | None, ctx: Any = None) -> RequestRecord:
        self.seen.append(data)
        if data in self.unreachable:
            self.unreachable.discard(data)
            raise RegistryUnavailableError("the schema registry is unreachable")
        return delivery.decode(data, ctx)


@pytest.fixture(scope="module")
def mock_kafka() -> Iterator[tuple[KafkaSettings, Producer]]:
    """librdkafka's mock cluster, alive as long as its producer; requests are produced with it."""
    producer = Producer({"test.mock.num.brokers": 1, "log_level": 4})
    brokers = producer.list_topics(timeout=10).brokers.values()
    yield KafkaSettings(bootstrap_servers=",".join(f"{b.host}:{b.port}" for b in brokers)), producer
    producer.flush(5)


async def fetch_turns(consumer: FakeConsumer, count: int = 5) -> None:
    """Let the fetch loop go round `count` more times (each round polls once)."""
    start = consumer.polls
    await until(lambda: consumer.polls >= start + count)


async def loop_turns(publisher: WorkerPublisher, count: int = 20) -> None:
    """Let the worker run a while: it polls the publisher for reports while any is due."""
    start = publisher.polls
    await until(lambda: publisher.polls >= start + count)


# -- commits -------------------------------------------------------------------------------------


async def test_the_commit_waits_for_every_result_of_a_batch_and_moves_on_after_it(
    harness: Harness,
) -> None:
    consumer = FakeConsumer(unique("requests"))
    await harness.start(consumer)
    publisher = harness.publisher
    await rebalanced(consumer, "assign", 0)
    consumer.append(0, 5)  # one poll, one batch, one flush
    await until(lambda: len(publisher.acks) == 5)
    await rebalanced(consumer, "assign", 1)  # incremental: partition 0 carries on as it was
    consumer.append(1, 3)
    await until(lambda: len(publisher.acks) == 8)
    await fetch_turns(consumer)
    assert consumer.commits() == [], "committed before Kafka acknowledged anything"

    publisher.ack("p0-0", "p0-1", "p0-3", "p0-4", "p1-0", "p1-1", "p1-2")
    await until(lambda: consumer.committed().get(1) == 3)
    await fetch_turns(consumer)
    assert consumer.committed() == {1: 3}, "p0-2 is not delivered: nothing of its batch commits"

    publisher.ack("p0-2")
    await until(lambda: consumer.committed().get(0) == 5)
    await fetch_turns(consumer)
    assert [c[0] for c in consumer.commits() if 0 in c] == [5]
    assert [c[1] for c in consumer.commits() if 1 in c] == [3], "an unmoved position was resent"


async def test_one_batch_mixes_the_requests_of_many_partitions_and_each_keeps_its_order(
    harness: Harness,
) -> None:
    consumer = FakeConsumer(unique("requests"))
    batches: list[list[str]] = []

    async def recording(tasks: Any, waits: Any) -> list[ResultRecord]:
        batches.append([task.request_id for task in tasks])
        return await delivery.handler(tasks, waits)

    for partition in range(4):
        consumer.append(partition, 2)
    await harness.start(consumer, process=recording, max_batch_size=32)
    publisher = harness.publisher
    await rebalanced(consumer, "assign", 0, 1, 2, 3)
    await until(lambda: len(publisher.results) == 8)
    assert len(batches[0]) == 8, (
        f"the first poll's 4 partitions were not batched together: {batches}"
    )
    for partition in range(4):
        assert publisher.published(partition) == [rid(partition, 0), rid(partition, 1)]
    publisher.ack_all()
    await until(lambda: consumer.committed() == {p: 2 for p in range(4)})


async def test_each_polls_kafka_times_are_observed_once_the_poll_is_handed_out(
    harness: Harness,
) -> None:
    def observed() -> float:
        return REGISTRY.get_sample_value("tidegate_worker_queue_seconds_count") or 0.0

    before = observed()
    consumer = FakeConsumer(unique("requests"))
    for partition in range(3):
        consumer.append(partition, 2)
    await harness.start(consumer, max_batch_size=32)
    await rebalanced(consumer, "assign", 0, 1, 2)
    await until(lambda: len(harness.publisher.results) == 6)
    assert observed() - before == 6


@pytest.mark.slow  # librdkafka's mock cluster holds the first join for seconds
async def test_on_a_mock_cluster_kafka_gets_the_delivered_prefix_and_stop_commits_the_rest(
    harness: Harness, mock_kafka: tuple[KafkaSettings, Producer]
) -> None:
    kafka, producer = mock_kafka
    topic, group = unique("requests"), unique("group")
    for partition, count in ((0, 4), (1, 2)):
        for offset in range(count):
            producer.produce(topic, value=rid(partition, offset).encode(), partition=partition)
    assert producer.flush(10) == 0
    reader: Consumer = make_consumer(kafka, group)

    async def committed(probe: Callable[[dict[int, int]], bool]) -> dict[int, int]:
        """What the group committed in Kafka, once `probe` accepts it."""
        wanted = [TopicPartition(topic, 0), TopicPartition(topic, 1)]

        async def read() -> dict[int, int] | None:
            tps = await asyncio.to_thread(reader.committed, wanted, timeout=5)
            got = {tp.partition: tp.offset for tp in tps if tp.offset >= 0}
            return got if probe(got) else None

        return await eventually(read, timeout=10, interval=0.05, what="the commit in Kafka")

    try:
        # librdkafka's mock cluster holds the first join ~3 s and expires a member silent that
        # long meanwhile (a real broker does neither): a session longer than the 2 s default.
        worker = await harness.start(topic=topic, kafka=kafka, group=group, session_timeout_ms=6000)
        publisher = harness.publisher
        await until(lambda: len(publisher.acks) == 6, 20)  # the mock's first join takes 3 s
        publisher.ack("p0-0", "p0-2", "p0-3", "p1-0", "p1-1")
        publisher.ack("p0-1")
        await committed(lambda got: got == {0: 4, 1: 2})

        producer.produce(topic, value=b"p1-2", partition=1)
        assert producer.flush(10) == 0
        await until(lambda: "p1-2" in publisher.acks)
        harness.stopped = True
        stopping = asyncio.ensure_future(worker.stop())
        await loop_turns(publisher)
        assert not stopping.done(), "stop() did not wait for the undelivered result"
        publisher.ack("p1-2")
        await asyncio.wait_for(stopping, 10)
        assert await committed(lambda _: True) == {0: 4, 1: 3}
        await asyncio.wait_for(worker.wait(), 1)
    finally:
        reader.close()


# -- back-pressure ---------------------------------------------------------------------------------


async def test_consumption_pauses_at_max_in_flight_and_resumes_once_half_of_it_finished(
    harness: Harness,
) -> None:
    consumer = FakeConsumer(unique("requests"))
    await harness.start(consumer, max_in_flight=4)
    publisher = harness.publisher
    await rebalanced(consumer, "assign", 0)
    consumer.append(0, 10)
    await until(lambda: ("pause", [0]) in consumer.calls)
    await fetch_turns(consumer)
    assert list(publisher.acks) == ["p0-0", "p0-1", "p0-2", "p0-3"], "read past max_in_flight"

    publisher.ack("p0-0", "p0-1", "p0-2")  # the batch is not released: 4 unfinished, paused
    await fetch_turns(consumer)
    assert not [c for c in consumer.calls if c[0] == "resume"]
    assert len(publisher.results) == 4

    publisher.ack("p0-3")  # 0 unfinished: consumption resumes, up to the limit again
    await until(lambda: len(publisher.results) == 8)
    assert ("resume", [0]) in consumer.calls
    await fetch_turns(consumer)
    assert len(publisher.results) == 8, "read past max_in_flight after resuming"

    while len(publisher.results) < 10:
        publisher.ack_all()
        await fetch_turns(consumer, 1)
    assert publisher.published(0) == [rid(0, i) for i in range(10)]


# -- rebalances ------------------------------------------------------------------------------------


async def test_a_revoked_partition_is_drained_and_its_delivered_prefix_committed_before_it_goes(
    harness: Harness,
) -> None:
    consumer = FakeConsumer(unique("requests"))
    await harness.start(consumer, drain_timeout_s=10.0)
    publisher = harness.publisher
    await rebalanced(consumer, "assign", 0, 1)
    consumer.append(0, 3)
    consumer.append(1, 1)
    await until(lambda: len(publisher.acks) == 4)
    publisher.ack("p0-0", "p1-0")

    revoked = consumer.rebalance("revoke", 0)
    await until(lambda: ("on_revoke", [0]) in consumer.calls)
    await loop_turns(publisher)
    assert not revoked.done(), "partition 0 was given up with results in flight"
    assert consumer.commits(asynchronous=False) == []
    publisher.ack("p0-1", "p0-2")
    await asyncio.wait_for(asyncio.wrap_future(revoked), 5)
    assert consumer.commits(asynchronous=False) == [{0: 3}]
    assert consumer.index(("commit", ((0, 3),), False)) < consumer.index(("revoked", [0]))

    consumer.append(1, 1)  # the partition kept is served as before
    await until(lambda: "p1-1" in publisher.acks)
    publisher.ack("p1-1")
    await until(lambda: consumer.committed().get(1) == 2)
    assert all(c.get(0, 0) <= 3 for c in consumer.commits())


async def test_a_revoke_waits_at_most_the_drain_timeout_and_the_next_owner_redoes_the_rest(
    harness: Harness,
) -> None:
    consumer = FakeConsumer(unique("requests"))
    await harness.start(consumer, drain_timeout_s=0.2)
    publisher = harness.publisher
    await rebalanced(consumer, "assign", 0)
    consumer.append(0, 3)
    await until(lambda: len(publisher.acks) == 3)
    publisher.ack("p0-0", "p0-2")

    started = time.monotonic()
    await rebalanced(consumer, "revoke", 0)
    assert time.monotonic() - started >= 0.2
    assert consumer.commits() == [], "committed with p0-1 of the batch undelivered"
    publisher.ack("p0-1")  # acknowledged after all, too late: harmless, and not committed
    await fetch_turns(consumer)
    assert consumer.committed() == {}

    await rebalanced(consumer, "assign", 0)  # back, as to the next owner: it reads from 0
    await until(lambda: len(publisher.published(0)) == 6)
    assert publisher.published(0) == ["p0-0", "p0-1", "p0-2"] * 2
    publisher.ack_all()
    await until(lambda: consumer.committed() == {0: 3})


async def test_lost_partitions_are_dropped_at_once_and_never_committed(harness: Harness) -> None:
    consumer = FakeConsumer(unique("requests"))
    await harness.start(consumer, drain_timeout_s=30.0)
    publisher = harness.publisher
    await rebalanced(consumer, "assign", 0)
    consumer.append(0, 2)
    await until(lambda: len(publisher.acks) == 2)
    publisher.ack("p0-1")

    await rebalanced(consumer, "lost", 0)  # within 5 s: no waiting for p0-0
    publisher.ack("p0-0")  # delivered after all, but the partition is someone else's now
    await fetch_turns(consumer)
    assert consumer.commits() == []


# -- stopping and failing --------------------------------------------------------------------------


async def test_stop_drains_every_partition_commits_what_was_delivered_and_closes(
    harness: Harness,
) -> None:
    consumer = FakeConsumer(unique("requests"))
    worker = await harness.start(consumer, drain_timeout_s=10.0)
    publisher = harness.publisher
    await rebalanced(consumer, "assign", 0, 1)
    consumer.append(0, 2)
    consumer.append(1, 1)
    await until(lambda: len(publisher.acks) == 3)
    publisher.ack("p0-0")

    harness.stopped = True
    stopping = asyncio.ensure_future(worker.stop())
    await loop_turns(publisher)
    assert not stopping.done(), "stop() did not wait for the undelivered results"
    assert not consumer.closed
    publisher.ack("p0-1", "p1-0")
    await asyncio.wait_for(stopping, 5)
    assert consumer.closed
    final = consumer.commits(asynchronous=False)
    assert final
    assert final[0] == {0: 2, 1: 1}
    assert consumer.index(("commit", ((0, 2), (1, 1)), False)) < consumer.index(("close",))
    assert publisher.flushes == 1
    await asyncio.wait_for(worker.wait(), 1)  # a clean stop: returns, raises nothing


async def test_stop_gives_up_after_the_drain_timeout_and_commits_only_the_delivered_prefix(
    harness: Harness,
) -> None:
    consumer = FakeConsumer(unique("requests"))
    worker = await harness.start(consumer, drain_timeout_s=0.1)
    publisher = harness.publisher
    await rebalanced(consumer, "assign", 0)
    consumer.append(0, 3)
    await until(lambda: len(publisher.acks) == 3)
    publisher.ack("p0-0", "p0-2")

    harness.stopped = True
    await asyncio.wait_for(worker.stop(), 5)
    assert consumer.closed
    assert consumer.commits() == [], "committed a batch with the undelivered p0-1"
    await asyncio.wait_for(worker.wait(), 1)


async def test_stop_takes_no_longer_than_one_drain_timeout(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Counted, not timed: a stop that drained again on the revoke its close triggers would take
    # two drain timeouts.
    drains: list[tuple[int, float, bool]] = []
    drain = PartitionPipeline.drain

    async def counted(self: PartitionPipeline, within_s: float) -> bool:
        done = await drain(self, within_s)
        drains.append((self.partition, within_s, done))
        return done

    monkeypatch.setattr(PartitionPipeline, "drain", counted)
    consumer = FakeConsumer(unique("requests"))
    worker = await harness.start(consumer, drain_timeout_s=0.05)
    await rebalanced(consumer, "assign", 0)
    consumer.append(0, 1)
    await until(lambda: len(harness.publisher.acks) == 1)

    harness.stopped = True
    await asyncio.wait_for(worker.stop(), 5)
    assert drains == [(0, 0.05, False)], "one drain, which ran out: the result is undelivered"


async def test_a_result_kafka_did_not_take_fails_the_worker_and_its_offset_stays_uncommitted(
    harness: Harness,
) -> None:
    consumer = FakeConsumer(unique("requests"))
    worker = await harness.start(consumer, drain_timeout_s=0.1)
    publisher = harness.publisher
    await rebalanced(consumer, "assign", 0)
    consumer.append(0, 3)
    await until(lambda: len(publisher.acks) == 3)
    publisher.ack("p0-0", "p0-2")
    publisher.ack("p0-1", err=KafkaError(KafkaError._MSG_TIMED_OUT))

    with pytest.raises(KafkaException) as failure:
        await asyncio.wait_for(worker.wait(), 5)
    assert failure.value.args[0].code() == KafkaError._MSG_TIMED_OUT
    await harness.stop()
    assert consumer.commits() == [], "committed a batch with the undelivered p0-1"
    with pytest.raises(KafkaException):
        await worker.wait()  # still failed after the stop


async def test_a_failure_in_the_fetch_loop_fails_the_worker(harness: Harness) -> None:
    consumer = FakeConsumer(unique("requests"))
    worker = await harness.start(consumer)
    await rebalanced(consumer, "assign", 0)
    consumer.fail_with = KafkaException(KafkaError(KafkaError._FATAL, "fenced", fatal=True))
    with pytest.raises(KafkaException):
        await asyncio.wait_for(worker.wait(), 1)


async def test_delivery_reports_are_served_on_the_event_loop_while_any_is_due(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A thread of their own took the GIL once per report and woke the loop once per flush.
    consumer = FakeConsumer(unique("requests"))
    await harness.start(consumer)
    publisher = harness.publisher
    loop_thread = threading.get_ident()
    served_on: set[int] = set()

    def poll(timeout: float = 0.0) -> int:
        # As librdkafka's poll does: the reports that arrived are served on the calling thread.
        if publisher.acks:
            served_on.add(threading.get_ident())
        served = len(publisher.acks)
        publisher.ack_all()
        return served

    monkeypatch.setattr(publisher, "poll", poll)
    await rebalanced(consumer, "assign", 0)
    consumer.append(0, 5)
    await until(lambda: consumer.committed() == {0: 5})
    assert served_on == {loop_thread}


# -- reading ---------------------------------------------------------------------------------------


async def test_a_message_that_cannot_be_decoded_yet_is_read_again_before_anything_behind_it(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(worker_module, "_RETRY_DECODE_S", 0.01)
    consumer = FakeConsumer(unique("requests"))
    decode = FlakyDecode(b"p0-1")
    await harness.start(consumer, decoder=decode)
    publisher = harness.publisher
    consumer.append(0, 3)
    consumer.append(1, 1)
    await rebalanced(consumer, "assign", 0, 1)  # the first batch holds all four
    await until(lambda: len(publisher.results) == 4)
    assert decode.seen == [b"p0-0", b"p0-1", b"p1-0", b"p0-1", b"p0-2"]
    assert ("seek", 0, 1) in consumer.calls
    assert publisher.published(0) == ["p0-0", "p0-1", "p0-2"]
    assert publisher.published(1) == ["p1-0"]
    publisher.ack_all()
    await until(lambda: consumer.committed() == {0: 3, 1: 1})


async def test_the_consumer_is_cooperative_and_configured_from_the_worker_settings(
    harness: Harness,
) -> None:
    consumer = FakeConsumer(unique("requests"))
    group = unique("group")
    await harness.start(
        consumer, group=group, session_timeout_ms=4321, consumer_extra={"fetch.wait.max.ms": 7}
    )
    kafka, group_id, extra = harness.consumer_args
    assert isinstance(kafka, KafkaSettings)
    assert group_id == group
    assert extra["partition.assignment.strategy"] == "cooperative-sticky"
    assert extra["session.timeout.ms"] == 4321
    assert extra["fetch.wait.max.ms"] == 7
    assert extra["client.id"] == f"{kafka.client_id}-w-test"
