"""A flush's results go to librdkafka in one `produce_batch` call: in the order they were added,
a traced result (headers, which the batch call cannot carry) alone and in its place, a refused
message produced again only when that keeps the order, and the flush's acknowledgements counted
as before."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from confluent_kafka import KafkaError, KafkaException

from tests.unit.agents.delivery_support import TOPICS
from tidegate.agents.kafka_io.delivery import ResultBatch, ResultPublisher

TRACE = [("traceparent", b"00-abc")]


class BatchProducer:
    """`produce`, `produce_batch` and `list_topics` of a confluent Producer, recording one row per
    message in the order librdkafka would queue them; `refuse` marks what a batch call refuses,
    by index within the call, as librdkafka does with an `_error` on the message."""

    def __init__(self) -> None:
        self.queued: list[tuple[str, bytes, str]] = []
        self.batch_calls = 0
        self.refuse: dict[int, int] = {}
        # (the call's partition, the partitions its messages asked for), per call
        self.calls: list[tuple[int | None, list[int | None]]] = []
        self.headers: list[Any] = []
        self.refuse_topics: dict[str, int] = {}

    def list_topics(self, topic: str, timeout: float) -> Any:
        meta = SimpleNamespace(error=None, partitions=dict.fromkeys(range(8)))
        return SimpleNamespace(topics={topic: meta})

    def produce(self, topic: str, **kwargs: Any) -> None:
        if topic in self.refuse_topics:
            raise KafkaException(KafkaError(self.refuse_topics[topic]))
        self.queued.append((topic, kwargs["value"], "alone"))
        self.headers.append(kwargs.get("headers"))

    def produce_batch(
        self, topic: str, messages: list[dict[str, Any]], partition: int | None = None, **_: Any
    ) -> int:
        # As confluent-kafka's: a message's own `partition` is ignored, only the call's counts.
        self.batch_calls += 1
        self.calls.append((partition, [m.get("partition") for m in messages]))
        for k, message in enumerate(messages):
            code = self.refuse.get(k)
            if code is not None:
                message["_error"] = KafkaError(code)
            else:
                self.queued.append((topic, message["value"], "batch"))
        return len(messages) - len(self.refuse)


def publisher(producer: BatchProducer) -> ResultPublisher:
    made = ResultPublisher(producer, None, TOPICS)  # type: ignore[arg-type]
    for encoder in (made._results, made._letters, made._shadow):
        encoder.schema_id = lambda subject: 1  # type: ignore[method-assign]
    made.start()
    return made


def rig(
    refuse: dict[int, int] | None = None,
) -> tuple[BatchProducer, ResultPublisher, ResultBatch, list[BaseException]]:
    """A started publisher over a `BatchProducer` refusing `refuse`, and a batch of it whose
    failures are collected."""
    producer = BatchProducer()
    producer.refuse = refuse or {}
    fails: list[BaseException] = []
    pub = publisher(producer)
    return producer, pub, ResultBatch(pub, None, fails.append), fails


def test_a_flush_is_one_batch_call_in_the_order_added() -> None:
    producer, pub, batch, fails = rig()
    for i in range(5):
        assert pub.result(f"r{i}".encode(), b"k", None, None, batch=batch) == 1
    assert producer.queued == [], "nothing is queued before the batch is sent"
    batch.send()
    assert producer.batch_calls == 1
    assert [v for _, v, _ in producer.queued] == [b"r0", b"r1", b"r2", b"r3", b"r4"]
    assert not fails


def test_a_run_for_one_named_partition_is_one_call_naming_it() -> None:
    """The binding ignores a message's own partition: keyless results (a sticky partition) go in
    a call that names it, keyed ones in a call left to the partitioner, in the order added."""
    producer, _pub, batch, _ = rig()
    batch.add(b"a", b"r-1", 3)
    batch.add(b"b", b"r-2", 3)
    batch.add(b"c", b"card-1", None)
    batch.add(b"d", b"r-3", 5)
    batch.send()
    assert producer.calls == [(3, [3, 3]), (None, [None]), (5, [5])]
    assert [v for _, v, _ in producer.queued] == [b"a", b"b", b"c", b"d"]


def test_a_traced_result_goes_alone_after_what_was_added_before_it() -> None:
    producer, pub, batch, _ = rig()
    pub.result(b"r0", b"k", None, None, batch=batch)
    pub.result(b"r1", b"k", None, None, TRACE, batch=batch)
    pub.result(b"r2", b"k", None, None, batch=batch)
    batch.send()
    assert producer.queued == [
        (TOPICS.results, b"r0", "batch"),
        (TOPICS.results, b"r1", "alone"),
        (TOPICS.results, b"r2", "batch"),
    ]


def test_a_large_result_goes_alone_after_what_was_added_before_it() -> None:
    producer, pub, batch, _ = rig()
    big = b"x" * (512 * 1024)
    pub.result(b"r0", b"k", None, None, batch=batch)
    pub.result(big, b"k", None, None, batch=batch)
    batch.send()
    assert [(v[:2], how) for _, v, how in producer.queued] == [(b"r0", "batch"), (b"xx", "alone")]


def test_replies_go_out_at_once_with_their_nonce() -> None:
    producer, pub, batch, _ = rig()
    reply = {"topic": TOPICS.replies, "partition": 1, "nonce": "n-1"}
    assert pub.result(b"r0", b"k", reply, None, batch=batch) == 2  # type: ignore[arg-type]
    assert producer.queued == [(TOPICS.replies, b"r0", "alone")]
    assert producer.headers == [[("tidegate-submission", b"n-1")]]
    batch.send()
    assert producer.queued[-1] == (TOPICS.results, b"r0", "batch")


def test_a_full_queue_refusing_the_tail_produces_the_tail_again_in_order() -> None:
    producer, pub, batch, fails = rig(refuse={3: KafkaError._QUEUE_FULL, 4: KafkaError._QUEUE_FULL})
    for i in range(5):
        pub.result(f"r{i}".encode(), b"k", None, None, batch=batch)
    batch.send()
    assert [(v, how) for _, v, how in producer.queued] == [
        (b"r0", "batch"),
        (b"r1", "batch"),
        (b"r2", "batch"),
        (b"r3", "alone"),
        (b"r4", "alone"),
    ]
    assert not fails


def test_a_refusal_that_a_later_message_overtook_fails_the_batch() -> None:
    """librdkafka refuses every message after the first one a full queue refused, but refuses
    a message on its own for other reasons (its size): a later one is then already queued."""
    producer, pub, batch, fails = rig(refuse={1: KafkaError.MSG_SIZE_TOO_LARGE})
    for i in range(3):
        pub.result(f"r{i}".encode(), b"k", None, None, batch=batch)
    batch.send()
    assert len(fails) == 1
    assert isinstance(fails[0], KafkaException)
    assert [v for _, v, _ in producer.queued] == [b"r0", b"r2"], "r1 is never produced after r2"


def test_any_other_refusal_fails_the_batch() -> None:
    producer, pub, batch, fails = rig(refuse={0: KafkaError.MSG_SIZE_TOO_LARGE})
    pub.result(b"r0", b"k", None, None, batch=batch)
    batch.send()
    assert len(fails) == 1
    assert producer.queued == []


async def test_the_at_least_once_sink_releases_a_flush_once_every_batched_ack_is_in() -> None:
    from tidegate.agents.inference.result_builders import Timings, ok_result
    from tidegate.agents.kafka_io.offsets import OffsetTracker
    from tidegate.agents.kafka_io.sinks import AckedSink, SinkEntry
    from tidegate.agents.tasks.inference_task import InferenceTask

    acks: list[Any] = []

    class AckingProducer(BatchProducer):
        def produce_batch(
            self,
            topic: str,
            messages: list[dict[str, Any]],
            partition: int | None = None,
            **kw: Any,
        ) -> int:
            acks.extend([kw["on_delivery"]] * len(messages))
            return super().produce_batch(topic, messages, partition)

    producer = AckingProducer()
    pub = publisher(producer)
    pub.encode_result = lambda result: str(result["request_id"]).encode()  # type: ignore[method-assign]
    fatal: list[BaseException] = []
    sink = AckedSink(pub, worker_id="w", on_fatal=fatal.append)
    tracker = OffsetTracker()
    for offset in range(3):
        request = {"request_id": f"r{offset}", "model": "m", "inputs": []}
        task = InferenceTask(request=request)  # type: ignore[arg-type]
        result = ok_result(task, [], version="1", timings=Timings(), worker_id="w")
        tracker.consumed(offset)
        sink.add(SinkEntry(tracker, offset, b"k", result=result, task=task))
        tracker.done(offset)  # its processing finished; its message's ack is still out
    sink.flush()
    assert producer.batch_calls == 1
    assert len(acks) == 3
    for ack in acks[:2]:
        ack(None, None)
    await asyncio.sleep(0)
    assert tracker.position is None, "not before the last acknowledgement"
    acks[2](None, None)
    for _ in range(10):
        await asyncio.sleep(0)
    assert tracker.position == 3
    assert not fatal


def test_a_batch_that_failed_inside_a_result_lets_nothing_after_it_out() -> None:
    """A traced result sends the batch before it; when that send fails, neither the traced
    result nor any later one goes out, and the batch stays failed."""
    producer, pub, batch, fails = rig(refuse={0: KafkaError.MSG_SIZE_TOO_LARGE})
    assert pub.result(b"r0", b"k", None, None, batch=batch) == 1
    assert pub.result(b"r1", b"k", None, None, TRACE, batch=batch) == 0
    assert pub.result(b"r2", b"k", None, None, batch=batch) == 0
    assert batch.send() is False
    assert producer.queued == []
    assert len(fails) == 1


def test_a_reply_refused_at_once_is_counted_and_the_result_stands() -> None:
    from tidegate.agents import worker_metrics as metrics

    producer, pub, batch, _ = rig()
    producer.refuse_topics = {TOPICS.replies: KafkaError.MSG_SIZE_TOO_LARGE}
    counted = metrics.REPLIES_UNDELIVERED.labels("MSG_SIZE_TOO_LARGE")
    before = counted._value.get()
    reply = {"topic": TOPICS.replies, "partition": 1, "nonce": "n-1"}
    assert pub.result(b"r0", b"k", reply, None, batch=batch) == 1  # type: ignore[arg-type]
    assert batch.send() is True
    assert producer.queued == [(TOPICS.results, b"r0", "batch")]
    assert counted._value.get() == before + 1
