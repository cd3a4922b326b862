"""A worker over fakes: a consumer whose rebalances the test drives, a publisher whose
acknowledgements it gives, and the harness that assembles them with a fake inference service."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from types import SimpleNamespace
from typing import Any, cast

import pytest
from confluent_kafka import KafkaError, TopicPartition

from tests.support import unique
from tests.unit.agents import delivery_support as delivery
from tidegate.agents import worker as worker_module
from tidegate.agents.inference.inference_service import InferenceService
from tidegate.agents.kafka_io import worker_producers
from tidegate.agents.kafka_io.delivery import Ack
from tidegate.agents.worker import InferenceWorker
from tidegate.agents.worker_settings import WorkerSettings
from tidegate.core.settings import KafkaSettings, SchemaRegistrySettings, TopicSettings
from tidegate.core.tracing import TRACING_OFF, Tracing

__all__ = ["FakeConsumer", "Harness", "Record", "WorkerPublisher", "rebalanced", "rid"]


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

    def outstanding(self) -> int:
        """The results whose acknowledgement the test has not given yet."""
        return len(self.acks)

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
        batch: Any = None,
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


class Harness:
    """Builds workers whose publisher, decoder and (optionally) consumer are the fakes above."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.publisher = WorkerPublisher()
        self.consumer_args: tuple[Any, ...] = ()
        self.worker: InferenceWorker | None = None
        self.stopped = False
        self._monkeypatch = monkeypatch
        monkeypatch.setattr(worker_module, "worker_producer", lambda *_: None)
        monkeypatch.setattr(worker_producers, "make_producer", lambda *_: None)
        monkeypatch.setattr(worker_module, "ResultPublisher", lambda *_: self.publisher)

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


async def rebalanced(consumer: FakeConsumer, kind: str, *partitions: int) -> None:
    await asyncio.wait_for(asyncio.wrap_future(consumer.rebalance(kind, *partitions)), 5)
