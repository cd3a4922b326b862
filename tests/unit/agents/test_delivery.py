"""A partition's pipeline and the at-least-once sink without Kafka: delivery order, poison pills,
dead letters, per-batch acknowledgements, commits."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

from confluent_kafka import KafkaError, KafkaException

from tests.unit.agents.dataplane_support import error_of, until
from tests.unit.agents.delivery_support import TOPICS, Message, Publisher, decode, handler
from tidegate.agents.inference.batching import KeyedBatcher
from tidegate.agents.kafka_io.failures import default_router
from tidegate.agents.kafka_io.offsets import OffsetTracker
from tidegate.agents.kafka_io.partition import PartitionPipeline, Slot, hand_over
from tidegate.agents.kafka_io.sinks import AckedSink
from tidegate.agents.tasks.decoding import RequestDecoder
from tidegate.core.errors import ModelExecutionError, WireFormatError
from tidegate.core.sticky import StickyPartitions
from tidegate.dlq.envelopes import dead_letter, error_info
from tidegate.schemas.records import ReplyToRecord


class Lane:
    """One partition wired as the worker wires it: its requests batched by model (4 at most),
    each finished batch handed over and the at-least-once sink flushed once."""

    def __init__(self, publisher: Publisher) -> None:
        self.fatal: list[BaseException] = []
        self.sink = AckedSink(
            publisher,  # type: ignore[arg-type]
            worker_id="w",
            on_fatal=self.fatal.append,
        )
        self.pipe = PartitionPipeline(
            "requests",
            2,
            decoder=RequestDecoder(decode),
            sink=self.sink,
            failures=default_router(TOPICS, "w"),
        )
        self.batcher: KeyedBatcher[Slot, dict[str, Any]] = KeyedBatcher(
            self._compute, self._delivered, max_batch_size=4
        )
        self.flushes = 0

    @property
    def tracker(self) -> OffsetTracker:
        return self.pipe.tracker

    def accept(self, msg: Message) -> None:
        slot = self.pipe.accept(msg)
        if slot is not None:
            self.batcher.submit(slot.task.model, slot)
        self.sink.flush()

    async def _compute(self, slots: Sequence[Slot], waits: Sequence[float]) -> list[Any]:
        return await handler([slot.task for slot in slots], waits)

    def _delivered(self, slots: Sequence[Slot], outcome: Any) -> None:
        hand_over(slots, outcome, worker_id="w")
        self.flushes += 1
        self.sink.flush()

    async def close(self) -> None:
        self.pipe.close()
        await self.batcher.stop()


async def test_results_go_out_in_offset_order_and_commit_waits_for_every_ack_of_a_batch() -> None:
    publisher = Publisher()
    lane = Lane(publisher)
    for offset in range(10):
        lane.accept(Message(offset, f"r{offset}".encode()))
    await until(lambda: len(publisher.results) == 10)
    assert [r["request_id"] for r in publisher.results] == [f"r{i}" for i in range(10)]
    assert lane.flushes == 3, "not one flush per batch of 4"
    assert lane.tracker.committable() is None, "committed before Kafka acknowledged"
    acks = publisher.pending
    for ack in acks[4:8]:  # the whole second batch
        ack(None, None)  # type: ignore[arg-type]
    await asyncio.sleep(0.01)
    assert lane.tracker.committable() is None, "the first batch is not acknowledged yet"
    for ack in acks[:3]:
        ack(None, None)  # type: ignore[arg-type]
    await asyncio.sleep(0.01)
    assert lane.tracker.committable() is None, "one result of the first batch is still out"
    acks[3](None, None)  # type: ignore[arg-type]
    await until(lambda: lane.tracker.position == 8)
    assert await lane.pipe.drain(0.05) is False
    for ack in acks[8:]:
        ack(None, None)  # type: ignore[arg-type]
    assert await lane.pipe.drain(1.0) is True
    assert lane.tracker.committable() == 10
    await lane.close()


async def test_a_failed_acknowledgement_is_fatal_and_its_batch_is_never_released() -> None:
    publisher = Publisher()
    lane = Lane(publisher)
    lane.accept(Message(0, b"r0"))
    await until(lambda: len(publisher.pending) == 1)
    publisher.pending[0](KafkaError(KafkaError._MSG_TIMED_OUT), None)  # type: ignore[arg-type]
    await until(lambda: bool(lane.fatal))
    assert isinstance(lane.fatal[0], KafkaException)
    assert lane.tracker.position is None
    await lane.close()


async def test_poison_is_quarantined_with_its_reason_and_the_next_message_is_served() -> None:
    publisher = Publisher()
    lane = Lane(publisher)
    lane.accept(Message(0, b"\x21garbage!"))
    lane.accept(Message(1, b"unknown-id"))
    lane.accept(Message(2, b"after"))
    await until(lambda: len(publisher.results) == 1)
    assert publisher.results[0]["request_id"] == "after"
    (topic, first), (_, second) = publisher.letters
    assert topic == TOPICS.poison
    assert first["error"]["code"] == "WIRE_FORMAT"
    assert first["error"]["error_class"] == "WireFormatError"
    assert "magic byte" in first["error"]["message"]
    assert first["original_value"] == b"\x21garbage!"
    assert first["original_headers"] == [{"key": "trace", "value": b"abc"}]
    assert first["source"] == {"topic": "requests", "partition": 2, "offset": 0}
    assert first["request_id"] is None
    assert second["error"]["code"] == "UNKNOWN_SCHEMA"
    publisher.ack_all()
    await until(lambda: lane.tracker.position == 3)
    await lane.close()


async def test_a_tensor_not_fitting_its_shape_is_poison_and_answered_invalid() -> None:
    publisher = Publisher()
    lane = Lane(publisher)
    lane.accept(Message(0, b"short:r-bad"))
    lane.accept(Message(1, b"r-good"))
    await until(lambda: len(publisher.results) == 2)
    bad, good = publisher.results
    assert bad["status"] == "INVALID"
    assert error_of(bad)["field"] == "features"
    assert good["status"] == "OK"
    ((topic, envelope),) = publisher.letters
    assert topic == TOPICS.poison
    assert envelope["request_id"] == "r-bad"
    assert envelope["error"]["code"] == "INVALID_INPUT"
    assert envelope["error"]["details"] == {"stage": "decode"}
    await lane.close()


async def test_a_failed_request_gets_an_error_result_and_a_dead_letter() -> None:
    publisher = Publisher()
    lane = Lane(publisher)
    lane.accept(Message(7, b"fail-1"))
    await until(lambda: len(publisher.letters) == 1)
    assert publisher.results[0]["status"] == "ERROR"
    ((topic, envelope),) = publisher.letters
    assert topic == TOPICS.failed
    # Deliveries, not the model runs bisection took: this was the request's first delivery.
    assert envelope["attempt"] == 1
    assert envelope["first_failed_at"] == envelope["failed_at"]
    assert envelope["error"]["code"] == "MODEL_ERROR"
    assert envelope["original_value"] == b"fail-1"
    assert envelope["model"] == "fraud"
    assert envelope["worker_id"] == "w"
    assert len(publisher.pending) == 2
    publisher.ack_all()
    await until(lambda: lane.tracker.position == 8)
    await lane.close()


async def test_a_batch_failing_as_a_whole_answers_every_member_with_the_error() -> None:
    publisher = Publisher()
    lane = Lane(publisher)
    slots = [lane.pipe.accept(Message(offset, f"r{offset}".encode())) for offset in range(3)]
    hand_over([s for s in slots if s is not None], ModelExecutionError("gone"), worker_id="w")
    lane.sink.flush()
    assert [r["status"] for r in publisher.results] == ["ERROR"] * 3
    assert [topic for topic, _ in publisher.letters] == [TOPICS.failed] * 3
    await lane.close()


def test_the_tracker_commits_only_the_done_prefix() -> None:
    tracker = OffsetTracker()
    for offset in (5, 6, 9):  # gaps: compacted or transaction markers
        tracker.consumed(offset)
    tracker.expect(6, 2)
    tracker.done(9)
    tracker.done(6)
    assert tracker.committable() is None
    tracker.done(5)
    assert tracker.committable() == 6
    assert tracker.committable() is None
    tracker.done(6)
    tracker.done(6)
    assert tracker.committable() == 10
    assert tracker.in_flight == 0


def test_envelopes_carry_the_error_tree() -> None:
    info = error_info(WireFormatError("bad frame"))
    assert info == {
        "code": "WIRE_FORMAT",
        "message": "bad frame",
        "error_class": "WireFormatError",
        "retriable": False,
        "field": None,
        "details": {},
    }
    assert error_info(ValueError("x"))["code"] == "INTERNAL"
    envelope = dead_letter(
        source={"topic": "t", "partition": 0, "offset": 1},
        error=info,
        key=None,
        value=b"v",
        headers=None,
        timestamp_ms=None,
        failed_at_ms=10,
    )
    assert envelope["first_failed_at"] == 10
    assert envelope["attempt"] == 1


async def test_closing_abandons_what_is_not_delivered() -> None:
    publisher = Publisher()
    lane = Lane(publisher)
    slot = lane.pipe.accept(Message(0, b"r0"))
    assert slot is not None
    lane.pipe.close()
    hand_over(
        [slot],
        [{"request_id": "r0", "model": "fraud", "status": "OK", "completed_at": 0}],
        worker_id="w",
    )
    lane.sink.flush()
    assert publisher.results == [], "a result of a closed partition was published"
    assert lane.tracker.committable() is None
    await lane.close()


class _FullProducer:
    """A producer whose local queue is always full."""

    def __init__(self) -> None:
        self.attempts = 0

    def produce(self, *_args: Any, **_kwargs: Any) -> None:
        self.attempts += 1
        raise BufferError("queue full")

    def poll(self, _timeout: float) -> int:
        raise AssertionError("a shadow comparison must never wait for room in the queue")


def _offline_publisher(producer: Any) -> Any:
    """A `ResultPublisher` over `producer`, with a registry it never needs to reach."""
    from confluent_kafka.schema_registry import SchemaRegistryClient

    from tidegate.agents.kafka_io.delivery import ResultPublisher

    return ResultPublisher(producer, SchemaRegistryClient({"url": "http://127.0.0.1:9"}), TOPICS)


def test_a_full_producer_queue_drops_a_shadow_comparison_at_once() -> None:
    from datetime import UTC, datetime

    from tidegate.agents import worker_metrics as metrics

    producer = _FullProducer()
    publisher = _offline_publisher(producer)
    publisher._ids[TOPICS.shadow] = 1
    comparison = {
        "model": "fraud", "primary_version": "1", "candidate_version": "2", "request_id": "r",
        "kind": "classifier", "rows": 1, "agree_rows": 1, "abs_diff_sum": 0.0, "values": 2,
        "cosine_sum": None, "primary_ms": 1.0, "candidate_ms": 1.0, "candidate_error": None,
        "worker_id": "w", "compared_at": datetime.now(UTC),
    }  # fmt: skip
    dropped = metrics.SHADOW_SKIPPED.labels("fraud", "2", "queue-full")
    before = dropped._value.get()
    assert publisher.shadow(comparison) is False
    assert producer.attempts == 1
    assert dropped._value.get() == before + 1


class RecordingProducer:
    """A confluent Producer's `produce` and `list_topics`, recording each produce's partition."""

    def __init__(self, partitions: int) -> None:
        self.partitions = partitions
        self.produced: list[tuple[str, bytes | None, int | None]] = []
        self.headers: list[tuple[str, Any]] = []

    def list_topics(self, topic: str, timeout: float) -> Any:
        meta = SimpleNamespace(error=None, partitions=dict.fromkeys(range(self.partitions)))
        return SimpleNamespace(topics={topic: meta})

    def produce(self, topic: str, **kwargs: Any) -> None:
        self.produced.append((topic, kwargs.get("key"), kwargs.get("partition")))
        self.headers.append((topic, kwargs.get("headers")))


class FixedIds:
    def schema_id(self, subject: str) -> int:
        return 1


def test_results_without_a_routing_key_share_a_sticky_partition() -> None:
    """librdkafka sends one ProduceRequest per partition: a batch's keyless results go to one
    partition; a keyed result is left to the key's hash (no partition named), so per-key order
    holds. The reply goes to the partition the request named either way."""
    from tidegate.agents.kafka_io.delivery import ResultPublisher as RealPublisher

    producer = RecordingProducer(32)
    publisher = RealPublisher(producer, None, TOPICS)  # type: ignore[arg-type]
    for encoder in (publisher._results, publisher._letters, publisher._shadow):
        encoder.schema_id = FixedIds().schema_id  # type: ignore[method-assign]
    publisher.start()
    # A stopped clock: the test, not the host's speed, decides that all fall in one window.
    publisher._sticky = StickyPartitions(0.01, clock=lambda: 1.0)
    reply: ReplyToRecord = {"topic": "replies", "partition": 5}
    for i in range(20):
        publisher.result(b"v", f"r-{i}".encode(), reply, None, keyed=False)
    publisher.result(b"v", b"card-1", None, None, keyed=True)
    results = [(k, p) for t, k, p in producer.produced if t == TOPICS.results]
    keyless = {p for k, p in results if k != b"card-1"}
    assert len(keyless) == 1
    assert keyless.pop() in range(32)
    assert dict(results)[b"card-1"] is None
    assert {p for t, _, p in producer.produced if t == "replies"} == {5}


def started_publisher(producer: RecordingProducer) -> Any:
    from tidegate.agents.kafka_io.delivery import ResultPublisher as RealPublisher

    publisher = RealPublisher(producer, None, TOPICS)  # type: ignore[arg-type]
    for encoder in (publisher._results, publisher._letters, publisher._shadow):
        encoder.schema_id = FixedIds().schema_id  # type: ignore[method-assign]
    publisher.start()
    return publisher


def test_a_reply_goes_only_to_a_partition_of_the_replies_topic() -> None:
    publisher = started_publisher(RecordingProducer(8))
    replies = TOPICS.replies
    assert publisher.reply_refusal(None) is None
    assert publisher.reply_refusal({"topic": replies, "partition": 7, "nonce": "n"}) is None
    refusals = {
        "_schemas": {"topic": "_schemas", "partition": 0},
        "results": {"topic": TOPICS.results, "partition": 0},
        "no partition": {"topic": replies, "partition": None},
        "negative": {"topic": replies, "partition": -1},
        "too far": {"topic": replies, "partition": 8},
    }
    for case, reply_to in refusals.items():
        assert publisher.reply_refusal(reply_to) is not None, case
    assert "8 partitions" in publisher.reply_refusal(refusals["too far"])


def test_the_reply_alone_carries_its_submissions_nonce() -> None:
    producer = RecordingProducer(8)
    publisher = started_publisher(producer)
    trace = [("traceparent", b"00-abc")]
    reply = {"topic": TOPICS.replies, "partition": 2, "nonce": "n-1"}
    publisher.result(b"v", b"k", reply, None, trace)
    sent = dict(producer.headers)
    assert sent[TOPICS.results] == trace
    assert sent[TOPICS.replies] == [*trace, ("tidegate-submission", b"n-1")]


class _QueueFreedByPolls:
    """A producer whose local queue is full until delivery reports are served (`poll`), as
    librdkafka's is: messages leave its count only once their report was served."""

    def __init__(self) -> None:
        self.polls = 0
        self.refused = 0
        self.produced: list[bytes] = []

    def produce(self, topic: str, **kwargs: Any) -> None:
        if self.polls == 0:
            self.refused += 1
            if self.refused > 50:  # nothing serves the reports: stop the test, not the machine
                self.polls = -1
            raise BufferError("Local: Queue full")
        self.produced.append(kwargs["value"])

    def poll(self, timeout: float = 0.0) -> int:
        self.polls = max(self.polls, 0) + 1
        return 0


def test_a_full_local_queue_serves_delivery_reports_while_it_waits_for_room() -> None:
    # The worker serves its reports on the thread that produces, so waiting alone never ends.
    producer = _QueueFreedByPolls()
    publisher = _offline_publisher(producer)
    publisher.produce_one(TOPICS.results, b"r1", b"k", None, None)
    assert producer.produced == [b"r1"]
    assert producer.polls == 1, "the wait did not serve delivery reports"
