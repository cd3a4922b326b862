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
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import Future
from types import SimpleNamespace
from typing import Any, cast

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

from tests.support import eventually, unique
from tests.unit.agents import test_delivery as delivery
from tests.unit.agents.test_dataplane import until
from tidegate.agents import worker as worker_module
from tidegate.agents.dataplane import InferenceService
from tidegate.agents.delivery import Ack
from tidegate.agents.partition import PartitionPipeline
from tidegate.agents.worker import InferenceWorker
from tidegate.agents.worker_settings import WorkerSettings
from tidegate.core.errors import RegistryUnavailableError
from tidegate.core.kafka import make_consumer
from tidegate.core.settings import KafkaSettings, SchemaRegistrySettings, TopicSettings
from tidegate.core.tracing import TRACING_OFF, Tracing


def rid(partition: int, offset: int) -> str:
    return f"p{partition}-{offset}"


class Record(delivery.Message):
    """A consumed message; its value is the request id."""

    def __init__(self, topic: str, partition: int, offset: int) -> None:
        super().__init__(offset, rid(partition, offset).encode())
        self._topic, self._partition = topic, partition

    def topic(self) -> str:
        return self._topic

    def partition(self) -> int:
        return self._partition

    def error(self) -> KafkaError | None:
        return None


class WorkerPublisher(delivery.Publisher):
    """The pipeline tests' publisher plus what the worker calls; the acknowledgement of each
    result waits, by request id, until the test gives it. The sink releases a flush's offsets
    once every one of its results is acknowledged."""

    def __init__(self) -> None:
        super().__init__()
        self.acks: dict[str, Ack] = {}
        self.headers: dict[str, Any] = {}
        self.polls = 0
        self.flushes = 0

    def start(self) -> None:
        """No schema ids to resolve."""

    def reply_refusal(self, reply_to: Any) -> str | None:
        """Every `reply_to` is honoured here (test_delivery checks the real one)."""
        return None

    def poll(self, timeout: float = 0.0) -> int:
        self.polls += 1
        time.sleep(min(timeout, 0.002))  # as librdkafka's poll waits when nothing is due
        return 0

    def flush(self, timeout: float) -> int:
        self.flushes += 1
        return 0

    def result(
        self,
        value: bytes,
        key: bytes | None,
        reply_to: Any,
        ack: Ack,
        headers: Any = None,
        *,
        keyed: bool = True,
        reply_ack: Any = None,
    ) -> int:
        self.acks[value.decode()] = ack
        self.headers[value.decode()] = headers
        return 1

    def ack(self, *rids: str, err: KafkaError | None = None) -> None:
        for request_id in rids:
            self.acks.pop(request_id)(err, None)  # type: ignore[arg-type]

    def ack_all(self) -> None:
        self.ack(*list(self.acks))
        super().ack_all()

    def published(self, partition: int) -> list[str]:
        """Request ids of `partition`'s results, in publishing order."""
        ids = [str(r["request_id"]) for r in self.results]
        return [i for i in ids if i.startswith(f"p{partition}-")]


class FakeConsumer:
    """confluent-kafka's `Consumer`, as much of it as the worker uses, over an in-memory log."""

    def __init__(self, topic: str) -> None:
        self.topic = topic
        self.calls: list[tuple[Any, ...]] = []
        self.polls = 0
        self.closed = False
        self.fail_with: BaseException | None = None
        self._logs: dict[int, list[Record]] = {}
        self._next: dict[int, int] = {}
        self._assigned: list[int] = []
        self._paused: set[int] = set()
        self._rebalances: list[tuple[str, list[int], Future[None]]] = []
        self._callbacks: dict[str, Callable[[Any, list[TopicPartition]], None]] = {}
        self._cond = threading.Condition()

    # -- the test's side ---------------------------------------------------------------------

    def append(self, partition: int, count: int) -> None:
        with self._cond:
            log = self._logs.setdefault(partition, [])
            first = len(log)
            log.extend(Record(self.topic, partition, first + i) for i in range(count))
            self._cond.notify_all()

    def rebalance(self, kind: str, *partitions: int) -> Future[None]:
        """Run the `kind` ("assign", "revoke", "lost") callback in the next poll; the future is
        done once the callback returned and the assignment changed."""
        done: Future[None] = Future()
        with self._cond:
            self._rebalances.append((kind, list(partitions), done))
            self._cond.notify_all()
        return done

    def commits(self, *, asynchronous: bool | None = None) -> list[dict[int, int]]:
        return [
            dict(offsets)
            for name, offsets, is_async in (c for c in list(self.calls) if c[0] == "commit")
            if asynchronous is None or is_async == asynchronous
        ]

    def committed(self) -> dict[int, int]:
        """The latest position committed, per partition."""
        latest: dict[int, int] = {}
        for commit in self.commits():
            latest.update(commit)
        return latest

    def index(self, call: tuple[Any, ...]) -> int:
        return list(self.calls).index(call)

    # -- the worker's side (its consumer thread) ---------------------------------------------

    def subscribe(self, topics: list[str], **callbacks: Any) -> None:
        assert topics == [self.topic]
        self._callbacks = {name.removeprefix("on_"): cb for name, cb in callbacks.items()}

    def poll(self, timeout: float) -> Record | None:
        self.polls += 1
        if self.fail_with is not None:
            raise self.fail_with
        deadline = time.monotonic() + timeout
        while True:
            self._serve_rebalances()
            with self._cond:
                taken = self._take(1)
                if taken:
                    return taken[0]
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                if not self._rebalances:
                    self._cond.wait(left)

    def consume(self, num_messages: int, timeout: float) -> list[Record]:
        with self._cond:
            return self._take(num_messages)

    def commit(self, *, offsets: list[TopicPartition], asynchronous: bool) -> None:
        assert {tp.topic for tp in offsets} == {self.topic}
        self.calls.append(
            ("commit", tuple((tp.partition, tp.offset) for tp in offsets), asynchronous)
        )

    def assignment(self) -> list[TopicPartition]:
        with self._cond:
            return [TopicPartition(self.topic, p) for p in self._assigned]

    def pause(self, partitions: list[TopicPartition]) -> None:
        with self._cond:
            self._paused.update(tp.partition for tp in partitions)
        self.calls.append(("pause", sorted(tp.partition for tp in partitions)))

    def resume(self, partitions: list[TopicPartition]) -> None:
        with self._cond:
            self._paused.difference_update(tp.partition for tp in partitions)
            self._cond.notify_all()
        self.calls.append(("resume", sorted(tp.partition for tp in partitions)))

    def seek(self, position: TopicPartition) -> None:
        with self._cond:
            self._next[position.partition] = position.offset
        self.calls.append(("seek", position.partition, position.offset))

    def position(self, partitions: list[TopicPartition]) -> list[TopicPartition]:
        with self._cond:
            return [
                TopicPartition(self.topic, tp.partition, self._next[tp.partition])
                for tp in partitions
            ]

    def get_watermark_offsets(
        self, partition: TopicPartition, cached: bool = False
    ) -> tuple[int, int]:
        with self._cond:
            return 0, len(self._logs.get(partition.partition, []))

    def close(self) -> None:
        with self._cond:
            assigned = list(self._assigned)
        if assigned:  # librdkafka revokes what is left on close
            self.rebalance("revoke", *assigned)
            self._serve_rebalances()
        self.closed = True
        self.calls.append(("close",))

    def _take(self, count: int) -> list[Record]:
        taken: list[Record] = []
        for partition in sorted(self._assigned):
            log = self._logs.get(partition, [])
            while (
                partition not in self._paused
                and len(taken) < count
                and self._next[partition] < len(log)
            ):
                taken.append(log[self._next[partition]])
                self._next[partition] += 1
        return taken

    def _serve_rebalances(self) -> None:
        while True:
            with self._cond:
                if not self._rebalances:
                    return
                kind, partitions, done = self._rebalances.pop(0)
            self.calls.append((f"on_{kind}", partitions))
            try:
                self._callbacks[kind](self, [TopicPartition(self.topic, p) for p in partitions])
            except BaseException as exc:
                done.set_exception(exc)
                raise
            with self._cond:
                if kind == "assign":
                    self._assigned.extend(partitions)
                    for p in partitions:  # a new owner reads on from the group's commit
                        self._next[p] = self.committed().get(p, 0)
                else:
                    self._assigned = [p for p in self._assigned if p not in partitions]
                    self._paused.difference_update(partitions)
            self.calls.append(
                ({"assign": "assigned", "revoke": "revoked"}.get(kind, kind), partitions)
            )
            done.set_result(None)


class FlakyDecode:
    """`decode`, except that each value in `unreachable` fails once as if the registry were down."""

    def __init__(self, *unreachable: bytes) -> None:
        self.unreachable = set(unreachable)
        self.seen: list[bytes | None] = []

    def __call__(self, data: bytes | None, ctx: Any = None) -> dict[str, Any]:
        self.seen.append(data)
        if data in self.unreachable:
            self.unreachable.discard(data)
            raise RegistryUnavailableError("the schema registry is unreachable")
        return delivery.decode(data, ctx)


class Harness:
    """Builds workers whose publisher, decoder and (optionally) consumer are the fakes above."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.publisher = WorkerPublisher()
        self.consumer_args: tuple[Any, ...] = ()
        self.worker: InferenceWorker | None = None
        self.stopped = False
        self._monkeypatch = monkeypatch
        monkeypatch.setattr(worker_module, "make_producer", lambda *_: None)
        monkeypatch.setattr(worker_module, "Publisher", lambda *_: self.publisher)

    async def start(
        self,
        consumer: FakeConsumer | None = None,
        *,
        topic: str | None = None,
        kafka: KafkaSettings | None = None,
        group: str | None = None,
        decoder: Callable[..., Any] = delivery.decode,
        drain_timeout_s: float = 2.0,
        consumer_extra: dict[str, Any] | None = None,
        process: Callable[..., Any] = delivery.handler,
        tracing: Tracing = TRACING_OFF,
        **settings: Any,
    ) -> InferenceWorker:
        self._monkeypatch.setattr(worker_module, "AvroDecoder", lambda *_: decoder)
        if consumer is not None:

            def fake_consumer(*args: Any) -> FakeConsumer:
                self.consumer_args = args
                return consumer

            self._monkeypatch.setattr(worker_module, "make_consumer", fake_consumer)
        requests = consumer.topic if consumer is not None else topic
        assert requests is not None
        self.worker = InferenceWorker(
            cast(InferenceService, SimpleNamespace(process=process)),
            settings=WorkerSettings(
                **{
                    "group_id": group or unique("group"),
                    "worker_id": "w-test",
                    "max_batch_size": 8,
                    "metrics_port": 0,
                    **settings,
                }
            ),
            kafka=kafka or KafkaSettings(),
            topics=TopicSettings(requests=requests),
            registry=SchemaRegistrySettings(),
            drain_timeout_s=drain_timeout_s,
            poll_timeout_s=0.02,
            consumer_extra=consumer_extra,
            tracing=tracing,
        )
        await self.worker.start()
        return self.worker

    async def stop(self) -> None:
        """Stop the worker, acknowledging whatever it publishes meanwhile."""
        assert self.worker is not None
        self.stopped = True
        stopping = asyncio.ensure_future(self.worker.stop())
        while not stopping.done():
            self.publisher.ack_all()
            await asyncio.wait({stopping}, timeout=0.005)
        await stopping


@pytest.fixture
async def harness(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Harness]:
    built = Harness(monkeypatch)
    yield built
    if built.worker is not None and not built.stopped:
        await built.stop()


@pytest.fixture(scope="module")
def mock_kafka() -> Iterator[tuple[KafkaSettings, Producer]]:
    """librdkafka's mock cluster, alive as long as its producer; requests are produced with it."""
    producer = Producer({"test.mock.num.brokers": 1, "log_level": 4})
    brokers = producer.list_topics(timeout=10).brokers.values()
    yield KafkaSettings(bootstrap_servers=",".join(f"{b.host}:{b.port}" for b in brokers)), producer
    producer.flush(5)


async def rebalanced(consumer: FakeConsumer, kind: str, *partitions: int) -> None:
    await asyncio.wait_for(asyncio.wrap_future(consumer.rebalance(kind, *partitions)), 5)


async def fetch_turns(consumer: FakeConsumer, count: int = 5) -> None:
    """Let the fetch loop go round `count` more times (each round polls once)."""
    start = consumer.polls
    await until(lambda: consumer.polls >= start + count)


async def loop_turns(publisher: WorkerPublisher, count: int = 20) -> None:
    """Let the worker run a while: its delivery thread polls the publisher every round."""
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

    async def recording(tasks: Any, waits: Any) -> list[dict[str, Any]]:
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
