"""The exactly-once sink against a fake transactional producer: records inside a transaction,
offsets committed with it, nothing produced while a commit runs, abortable and fatal failures."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from tests.unit.agents.delivery_support import TOPICS, request
from tidegate.agents.kafka_io.offsets import OffsetTracker
from tidegate.agents.kafka_io.sinks import SinkEntry, TransactionalSink
from tidegate.agents.tasks.inference_task import InferenceTask
from tidegate.schemas.records import ResultRecord


class TxnProducer:
    """The transactional part of confluent-kafka's Producer; `commit_gate` holds commits."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.commit_gate = threading.Event()
        self.commit_gate.set()
        self.fail_commit: KafkaException | None = None
        self.in_transaction = False
        self.refuse_batch: int | None = None

    def begin_transaction(self) -> None:
        assert not self.in_transaction
        self.in_transaction = True
        self.calls.append(("begin",))

    def produce(self, topic: str, **kwargs: Any) -> None:
        assert self.in_transaction, "produced outside a transaction"
        self.calls.append(("produce", topic, kwargs["value"]))

    def produce_batch(self, topic: str, messages: list[dict[str, Any]], **_: Any) -> int:
        assert self.in_transaction, "produced outside a transaction"
        if self.refuse_batch is not None:
            for m in messages:
                m["_error"] = KafkaError(self.refuse_batch)
            return 0
        self.calls.extend(("produce", topic, m["value"]) for m in messages)
        return len(messages)

    def send_offsets_to_transaction(
        self, offsets: list[TopicPartition], meta: Any, _t: float
    ) -> None:
        self.calls.append(("offsets", [(tp.partition, tp.offset) for tp in offsets], meta))

    def commit_transaction(self, _timeout: float) -> None:
        self.commit_gate.wait(5)
        if self.fail_commit is not None:
            raise self.fail_commit
        self.in_transaction = False
        self.calls.append(("commit",))

    def abort_transaction(self, _timeout: float) -> None:
        self.in_transaction = False
        self.calls.append(("abort",))


class Publisher:
    topics = TOPICS

    def __init__(self, producer: TxnProducer) -> None:
        self.producer = producer

    def encode_result(self, result: ResultRecord) -> bytes:
        return str(result["request_id"]).encode()

    def result(
        self,
        value: bytes,
        key: bytes | None,
        reply_to: Any,
        ack: Any,
        headers: Any = None,
        *,
        keyed: bool = True,
        reply_ack: Any = None,
        batch: Any = None,
    ) -> int:
        assert ack is None, "exactly-once needs no acknowledgement per message"
        if batch is not None:
            batch.add(value, key, None)
        else:
            self.producer.produce(TOPICS.results, key=key, value=value)
        return 1

    def dead_letter(self, topic: str, envelope: Any, key: bytes | None, ack: Any) -> None:
        self.producer.produce(topic, key=key, value=b"letter")


class Harness:
    def __init__(self) -> None:
        self.producer = TxnProducer()
        self.tracker = OffsetTracker()
        self.fatal: list[BaseException] = []
        self.committed: list[list[TopicPartition]] = []
        self.aborted = 0
        self.sink = TransactionalSink(
            Publisher(self.producer),  # type: ignore[arg-type]
            worker_id="w",
            on_fatal=self.fatal.append,
            positions=self.positions,
            group_metadata=lambda: "meta",
            on_committed=self.committed.append,
            on_aborted=self._aborted,
        )

    def positions(self) -> list[TopicPartition]:
        position = self.tracker.position
        return [] if position is None else [TopicPartition("requests", 2, position)]

    def _aborted(self) -> None:
        self.aborted += 1

    def add(self, offset: int) -> None:
        self.tracker.consumed(offset)
        task = InferenceTask(request(f"r{offset}"))
        result: ResultRecord = {
            "request_id": f"r{offset}",
            "model": "fraud",
            "status": "OK",
            "completed_at": 0,
        }
        self.sink.add(SinkEntry(self.tracker, offset, b"k", result=result, task=task))
        self.tracker.done(offset)  # the processing token, as a partition hands the result over

    def produced(self) -> list[bytes]:
        return [c[2] for c in self.producer.calls if c[0] == "produce"]


async def test_results_and_their_offsets_commit_in_one_transaction() -> None:
    h = Harness()
    h.add(0)
    h.add(1)
    h.sink.flush()
    assert h.produced() == [b"r0", b"r1"]
    assert h.tracker.position == 2, "a produced result is done at once: the commit covers it"
    assert await h.sink.commit() is True
    kinds = [c[0] for c in h.producer.calls]
    assert kinds == ["begin", "produce", "produce", "offsets", "commit"]
    assert h.producer.calls[3][1:] == ([(2, 2)], "meta")
    assert [[(tp.partition, tp.offset) for tp in c] for c in h.committed] == [[(2, 2)]]
    assert await h.sink.commit() is False, "an empty transaction was committed"


async def test_nothing_is_produced_while_a_commit_runs() -> None:
    h = Harness()
    h.add(0)
    h.sink.flush()
    h.producer.commit_gate.clear()
    committing = asyncio.ensure_future(h.sink.commit())
    await asyncio.sleep(0.05)
    h.add(1)
    h.sink.flush()
    assert h.produced() == [b"r0"], "produced into a transaction being committed"
    assert h.tracker.position == 1, "r1 counted as done before it was produced"
    h.producer.commit_gate.set()
    assert await asyncio.wait_for(committing, 5) is True
    assert h.produced() == [b"r0", b"r1"], "what waited did not open the next transaction"
    assert [c[0] for c in h.producer.calls][-2:] == ["begin", "produce"]


async def test_an_abortable_commit_failure_aborts_and_rewinds() -> None:
    h = Harness()
    h.add(0)
    h.sink.flush()
    h.producer.fail_commit = KafkaException(
        KafkaError(KafkaError.ILLEGAL_GENERATION, txn_requires_abort=True)
    )
    assert await h.sink.commit() is False
    assert h.producer.calls[-1] == ("abort",)
    assert h.aborted == 1
    assert h.committed == []
    assert h.fatal == []
    h.producer.fail_commit = None
    h.add(1)
    h.sink.flush()
    assert [c[0] for c in h.producer.calls][-2:] == ["begin", "produce"], "no new transaction"


async def test_a_fatal_commit_failure_fails_the_worker() -> None:
    h = Harness()
    h.add(0)
    h.sink.flush()
    h.producer.fail_commit = KafkaException(KafkaError(KafkaError._FENCED, fatal=True))
    assert await h.sink.commit() is False
    assert len(h.fatal) == 1
    assert h.aborted == 0
    assert ("abort",) not in h.producer.calls


async def test_a_batch_librdkafka_refused_fails_the_worker_and_releases_nothing() -> None:
    h = Harness()
    h.producer.refuse_batch = KafkaError.INVALID_MSG
    h.add(0)
    h.sink.flush()
    assert len(h.fatal) == 1
    assert h.tracker.position is None, "a refused result's offset must not be committed"
    assert await h.sink.commit() is False
    assert ("commit",) not in h.producer.calls
    h.producer.refuse_batch = None
    h.add(1)
    h.sink.flush()
    assert h.produced() == [], "nothing is produced after a refused batch"


async def test_entries_of_a_closed_partition_are_never_produced() -> None:
    h = Harness()
    h.add(0)
    h.tracker.closed = True
    h.sink.flush()
    assert h.produced() == []
    await h.sink.abort()
    assert h.produced() == []


@pytest.mark.parametrize("delivery", ["at-least-once", "exactly-once"])
def test_the_delivery_mode_is_a_setting(delivery: str) -> None:
    from tidegate.agents.worker_settings import WorkerSettings

    assert WorkerSettings(delivery=delivery).delivery == delivery
    with pytest.raises(ValueError, match="delivery"):
        WorkerSettings(delivery="at-most-once")


async def test_a_reply_refused_for_good_is_counted_and_a_transient_failure_stays_fatal() -> None:
    from confluent_kafka import KafkaError

    from tidegate.agents import worker_metrics
    from tidegate.agents.kafka_io.sinks import _Produced

    loop = asyncio.get_running_loop()
    tracker = OffsetTracker()
    tracker.consumed(0)
    entry = SinkEntry(tracker, 0, None)  # the sink's token is the consumed one here
    fatal: list[BaseException] = []
    produced = _Produced([entry], loop, fatal.append)
    refused = worker_metrics.REPLIES_UNDELIVERED.labels("_UNKNOWN_PARTITION")
    before = refused._value.get()
    produced.ack(None, None)  # the result
    produced.reply_ack(KafkaError(KafkaError._UNKNOWN_PARTITION), None)  # its reply
    produced.arm(2)
    await asyncio.sleep(0.01)
    assert fatal == []
    assert refused._value.get() == before + 1
    assert tracker.committable() == 1, "the result was delivered: its offset is done"

    outage = _Produced([], loop, fatal.append)
    outage.reply_ack(KafkaError(KafkaError._MSG_TIMED_OUT), None)
    await asyncio.sleep(0.01)
    assert len(fatal) == 1, "an outage redoes the batch, so the reply is sent after all"
