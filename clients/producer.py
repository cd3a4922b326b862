"""The Python producer client: publish `InferenceRequest`s, optionally wait for their results.

Requests are Avro in the Confluent wire format under `<requests topic>-value`, looked up in the
registry (never registered from here: `tidegate schemas register` owns that), and keyed by routing
key or request id. A request with a routing key goes to its key's partition, so one key's requests
keep their order; one without goes to a sticky partition (`tidegate.core.sticky`), so the
requests of one linger share a ProduceRequest rather than cost one each. Publishing is
asynchronous like any Kafka producer: `publish` enqueues and returns the request id, delivery is
reported through `on_delivery` or collected for `flush`. A record larger than the producer's
`message.max.bytes` is refused before it is enqueued
(`RecordTooLargeError`, naming its size and the limit); a broker refusing one as too large is
reported as that error too.

Results are awaited through the client's own consumer of `inference-results`, assigned to every
partition at its end offset when the client starts. No group membership is involved, so any
number of clients can wait side by side; each reads the whole topic and keeps only what it awaits,
which suits scripts and batch jobs. Interactive traffic at volume should go through the gateway,
whose replicas each read one partition of the replies topic.

The lane (`lane=`, docs/lanes.md) picks the topic: `realtime` publishes to `topics.requests`,
`batch` to `topics.requests_batch`, which workers serve when real-time traffic leaves them room.
A client has a default lane, and each publish may name another. With `placement` (model to
pool), a request goes to its model's pool's topic of that lane (docs/pools.md).

With a `Tracing` that is on, each publish is a `send <topic>` span, a child of the span current
where `publish` is called, and the request carries its W3C trace context in its headers, so
the worker's spans join the caller's trace. Off (the default), nothing of it runs.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from functools import partial
from types import TracebackType
from typing import Any, Literal

from confluent_kafka import (
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    Producer,
    TopicPartition,
)
from confluent_kafka.serialization import MessageField, SerializationContext
from opentelemetry.trace import Span, SpanKind, Status, StatusCode

from tidegate.clients.pool_moves import DEFAULT_DRAIN_S, MoveGuard, Warm
from tidegate.core.errors import (
    ConfigurationError,
    InvalidInputError,
    OverloadedError,
    ResultTimeoutError,
    RetriableError,
    SerializationError,
)
from tidegate.core.kafka import consume_ready, make_consumer, make_producer
from tidegate.core.pools import pool_topics
from tidegate.core.settings import KafkaSettings, SchemaRegistrySettings, TopicSettings
from tidegate.core.sticky import StickyPartitions
from tidegate.core.tracing import TRACING_OFF, KafkaHeaders, Tracing, span_headers
from tidegate.schemas.catalog import INFERENCE_REQUEST, INFERENCE_RESULT, load_schema
from tidegate.schemas.codec import AvroDecoder, AvroEncoder, Registry, registry_client
from tidegate.schemas.records import RequestRecord, ResultRecord
from tidegate.schemas.requests import Inputs, build_request, request_key

__all__ = [
    "DEFAULT_MAX_RECORD_BYTES",
    "LANES",
    "DeliveryCallback",
    "Lane",
    "Placement",
    "PublishError",
    "RecordTooLargeError",
    "TidegateProducer",
    "build_request",
    "lane_topic",
    "request_key",
]

Lane = Literal["realtime", "batch"]
LANES: tuple[Lane, ...] = ("realtime", "batch")

DeliveryCallback = Callable[[str, Exception | None], None]
Placement = Callable[[str], str | None]
"""The pool a model is placed in (None: the default pool)."""

DEFAULT_MAX_RECORD_BYTES = 1_000_000
"""librdkafka's default `message.max.bytes`, the largest record a producer takes."""

STICKY_WINDOW_S = 0.01
"""How long requests without a routing key stay on one partition at least (librdkafka's own
`sticky.partitioning.linger.ms` default); a producer that lingers longer keeps them there for its
`linger.ms`, so a linger's worth of them make one ProduceRequest."""


def lane_topic(topics: TopicSettings, lane: Lane) -> str:
    """The requests topic of a lane."""
    return topics.requests_batch if lane == "batch" else topics.requests


class PublishError(RetriableError):
    """Kafka did not take the request (brokers down, topic missing, delivery timed out)."""

    code = "PUBLISH_FAILED"


class RecordTooLargeError(InvalidInputError):
    """The request's record is larger than Kafka takes: retrying the same request cannot help."""

    code = "RECORD_TOO_LARGE"

    def __init__(self, size: int | None, limit: int) -> None:
        what = f"the request's record of {size} bytes" if size else "the request's record"
        super().__init__(f"{what} exceeds the Kafka message limit of {limit} bytes")
        self.size = size
        self.limit = limit


class TidegateProducer:
    """Publishes requests; with `await_results=True` also reads results. Start it, then use it."""

    def __init__(
        self,
        kafka: KafkaSettings | None = None,
        topics: TopicSettings | None = None,
        registry: Registry | None = None,
        *,
        await_results: bool = False,
        producer_extra: Mapping[str, Any] | None = None,
        tracing: Tracing = TRACING_OFF,
        lane: Lane = "realtime",
        placement: Placement | None = None,
        worker_group: str | None = "tidegate-workers",
        drain_s: float = DEFAULT_DRAIN_S,
        warm: Warm | None = None,
    ) -> None:
        """`placement` names each model's pool (None: the default pool), and so the requests
        topic a request of that model goes to (docs/pools.md); without it, every request goes to
        the default pool's. When a model's placement changes, its requests are held until the
        old pool's workers (of `worker_group`, `TIDEGATE_WORKER_GROUP_ID`) have committed past
        what this client sent there, `drain_s` at most, so a key's requests keep their order
        (`MoveGuard`), and, with `warm`, until a worker of the new pool has the model loaded;
        `worker_group=None` sends them to the new pool at once."""
        self._kafka = kafka or KafkaSettings()
        self._placement = placement
        self._lane_topics: dict[tuple[str | None, Lane], str] = {}
        self.lane = lane
        self._tracing = tracing
        self._topics = topics or TopicSettings()
        self._registry = registry or SchemaRegistrySettings()
        self._await_results = await_results
        self._producer_extra = dict(producer_extra or {})
        self.max_record_bytes = int(
            self._producer_extra.get("message.max.bytes", DEFAULT_MAX_RECORD_BYTES)
        )
        self._producer: Producer | None = None
        # A partition switched within a linger would split its requests over two ProduceRequests.
        linger_s = float(self._producer_extra.get("linger.ms", 0)) / 1000.0
        self.sticky_window_s = max(STICKY_WINDOW_S, linger_s)
        self._sticky = StickyPartitions(self.sticky_window_s)
        self._partitions: dict[str, int | None] = {}
        self._consumer: Consumer | None = None
        self._encoder: AvroEncoder | None = None
        self._decoder: AvroDecoder | None = None
        self._schema_id = 0  # under the default lane's subject
        self._awaited: set[str] = set()
        self._results: dict[str, ResultRecord] = {}
        self.delivery_errors: dict[str, Exception] = {}
        self._guard: MoveGuard | None = None
        if placement is not None and worker_group is not None:
            self._guard = MoveGuard(
                self._kafka, self._topics, worker_group, drain_s=drain_s, warm=warm
            )

    @property
    def move_guard(self) -> MoveGuard | None:
        """What keeps a moving model's requests in order (None without placement)."""
        return self._guard

    def start(self, timeout: float = 15.0) -> None:
        """Connect, look the schema id up and, when awaiting results, pin the result offsets."""
        client = registry_client(self._registry)
        self._encoder = AvroEncoder(client, load_schema(INFERENCE_REQUEST))
        # The default lane's subject must be there; another lane's is looked up on first use.
        self._schema_id = self._encoder.schema_id(f"{lane_topic(self._topics, self.lane)}-value")
        self._producer = make_producer(self._kafka, self._producer_extra)
        self.partition_count(lane_topic(self._topics, self.lane), timeout)
        if self._await_results:
            self._decoder = AvroDecoder(client, load_schema(INFERENCE_RESULT))
            self._consumer = self._results_consumer(timeout)

    def _results_consumer(self, timeout: float) -> Consumer:
        consumer = make_consumer(self._kafka, f"tidegate-producer-{uuid.uuid4().hex[:12]}")
        topic = self._topics.results
        meta = consumer.list_topics(topic, timeout=timeout).topics.get(topic)
        if meta is None or meta.error is not None or not meta.partitions:
            consumer.close()
            raise ConfigurationError(f"results topic {topic!r} does not exist")
        # Concrete end offsets, not OFFSET_END: that one resolves lazily, after results of
        # requests published meanwhile may already have landed.
        starts = [
            TopicPartition(
                topic, p, consumer.get_watermark_offsets(TopicPartition(topic, p), timeout)[1]
            )
            for p in meta.partitions
        ]
        consumer.assign(starts)
        return consumer

    def stop(self, timeout: float = 10.0) -> None:
        """Deliver what is queued (up to `timeout`) and close the result consumer."""
        if self._producer is not None:
            self._producer.flush(timeout)
            self._producer = None
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None

    def __enter__(self) -> TidegateProducer:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def _running(self) -> tuple[Producer, AvroEncoder]:
        if self._producer is None or self._encoder is None:
            raise ConfigurationError("the producer is not started")
        return self._producer, self._encoder

    def schema_id(self, lane: Lane | None = None) -> int:
        """The registry id of the request schema under `lane`'s subject (the encoder caches it:
        a registry call only on a lane's first publish)."""
        _, encoder = self._running()
        return encoder.schema_id(f"{lane_topic(self._topics, lane or self.lane)}-value")

    def missing_topics(self, topics: Iterable[str], timeout: float = 5.0) -> list[str]:
        """The topics of `topics` Kafka does not have (blocks up to `timeout` per topic)."""
        producer, _ = self._running()
        missing = []
        for topic in topics:
            meta = producer.list_topics(topic, timeout=timeout).topics.get(topic)
            if meta is None or meta.error is not None or not meta.partitions:
                missing.append(topic)
        return missing

    def partition_count(self, topic: str, timeout: float = 5.0) -> int | None:
        """The topic's partition count, looked up once (at start for the default lane's topic, so
        a publish never waits on metadata); None when it could not be had, and the topic's
        requests then hash like keyed ones."""
        if topic not in self._partitions:
            producer, _ = self._running()
            count = None
            try:
                meta = producer.list_topics(topic, timeout=timeout).topics.get(topic)
            except KafkaException:
                meta = None
            if meta is not None and meta.error is None and meta.partitions:
                count = len(meta.partitions)
            self._partitions[topic] = count
        return self._partitions[topic]

    def publish(
        self,
        model: str,
        inputs: Inputs,
        *,
        version: str | None = None,
        routing_key: str | None = None,
        tenant: str = "default",
        deadline: datetime | timedelta | None = None,
        request_id: str | None = None,
        outputs: Sequence[str] = (),
        parameters: Mapping[str, Any] | None = None,
        on_delivery: DeliveryCallback | None = None,
        lane: Lane | None = None,
    ) -> str:
        """Enqueue one request and return its id. `deadline` is an instant or a time from now;
        `lane` (default: the client's) picks the requests topic."""
        record = build_request(
            model,
            inputs,
            version=version,
            routing_key=routing_key,
            tenant=tenant,
            deadline=deadline,
            request_id=request_id,
            outputs=outputs,
            parameters=parameters,
        )
        self.publish_record(record, on_delivery, lane=lane)
        return str(record["request_id"])

    def publish_record(
        self,
        record: RequestRecord,
        on_delivery: DeliveryCallback | None = None,
        headers: KafkaHeaders | None = None,
        lane: Lane | None = None,
        *,
        poll: bool = True,
    ) -> None:
        """Enqueue a ready `InferenceRequest` record on `lane` (default: the client's); a record
        that does not encode raises. `poll`: serve due delivery reports after it (False where a
        thread of the caller's serves them)."""
        producer, encoder = self._running()
        request_id = str(record["request_id"])
        lane = lane or self.lane
        pool = self._placement(record["model"]) if self._placement is not None else None
        topic = self._lane_topics.get((pool, lane))
        if topic is None:
            topic = self._lane_topics[pool, lane] = lane_topic(
                pool_topics(self._topics, pool), lane
            )
        schema_id = self._schema_id if lane == self.lane else self.schema_id(lane)
        value = encoder.encode(record, schema_id)
        key = request_key(record)
        # librdkafka would refuse it too, but with neither size nor limit in its message.
        size = len(value) + len(key) + sum(len(k) + len(v) for k, v in headers or ())
        if size > self.max_record_bytes:
            raise RecordTooLargeError(size, self.max_record_bytes)
        if self._await_results:
            self._awaited.add(request_id)
        report = on_delivery or self._remember_failure
        span: Span | None = None
        tracer = self._tracing.tracer
        if tracer is not None:
            span = tracer.start_span(
                f"send {topic}",
                kind=SpanKind.PRODUCER,
                attributes={"tidegate.request_id": request_id},
            )
            headers = [*(headers or ()), *span_headers(span)]

        guard = self._guard

        def delivered(err: KafkaError | None, msg: Message) -> None:
            if guard is not None:
                guard.delivered(delivered, msg)
            error = None if err is None else _delivery_error(err, self.max_record_bytes)
            if span is not None:
                if error is not None:
                    span.set_status(Status(StatusCode.ERROR, str(error)))
                span.end()
            report(request_id, error)

        kwargs: dict[str, Any] = {"value": value, "key": key, "headers": headers}
        if not record.get("routing_key"):
            count = self.partition_count(topic)
            if count:
                kwargs["partition"] = self._sticky.pick(topic, count)

        args = (producer, topic, delivered, kwargs, size, span)
        model = str(record["model"]) if guard is not None else ""
        if guard is None:
            self._produce(*args)
        elif guard.settled(model, pool):  # the common case: no callback made for a hold
            guard.send_tracked(delivered, self._produce, *args)
        else:
            produce = partial(self._produce, *args)
            fail = partial(report, request_id)  # a held record that could not be produced
            try:
                guard.send_or_hold(model, pool, delivered, produce, fail)
            except OverloadedError:
                if span is not None:
                    span.end()
                raise
        if poll:
            producer.poll(0)

    def _produce(
        self,
        producer: Producer,
        topic: str,
        delivered: Callable[[KafkaError | None, Message], None],
        kwargs: dict[str, Any],
        size: int,
        span: Span | None,
    ) -> None:
        try:
            producer.produce(topic, on_delivery=delivered, **kwargs)
        except KafkaException as exc:
            # Over the limit only by the trace headers added above: refused like the rest.
            if span is not None:
                span.set_status(Status(StatusCode.ERROR, str(exc)))
                span.end()
            if exc.args and exc.args[0].code() == KafkaError.MSG_SIZE_TOO_LARGE:
                raise RecordTooLargeError(size, self.max_record_bytes) from None
            raise
        except BufferError:
            # The local queue is full: serve delivery reports once, then give up rather than
            # block the caller indefinitely.
            producer.poll(1.0)
            try:
                producer.produce(topic, on_delivery=delivered, **kwargs)
            except BufferError as exc:
                if span is not None:
                    span.set_status(Status(StatusCode.ERROR, "the producer queue is full"))
                    span.end()
                raise OverloadedError("the producer queue is full") from exc

    def _remember_failure(self, request_id: str, error: Exception | None) -> None:
        if error is not None:
            self.delivery_errors[request_id] = error

    def poll(self, timeout: float = 0.0) -> int:
        """Serve delivery reports; returns how many were served."""
        producer, _ = self._running()
        return int(producer.poll(timeout))

    def flush(self, timeout: float = 30.0) -> int:
        """Wait for queued requests to be delivered; returns how many are still queued."""
        producer, _ = self._running()
        return int(producer.flush(timeout))

    def await_result(self, request_id: str, timeout: float = 30.0) -> ResultRecord:
        """The `InferenceResult` of one published request; `ResultTimeoutError` after `timeout`."""
        found = self.await_results([request_id], timeout)
        if request_id not in found:
            raise ResultTimeoutError(f"no result for {request_id} within {timeout}s")
        return found[request_id]

    def await_results(
        self,
        request_ids: Iterable[str],
        timeout: float = 30.0,
        progress: Callable[[ResultRecord], None] | None = None,
    ) -> dict[str, ResultRecord]:
        """Results of the given requests that arrive within `timeout`, by request id."""
        consumer, decoder = self._consumer, self._decoder
        if consumer is None or decoder is None:
            raise ConfigurationError("start the producer with await_results=True to await results")
        wanted = set(request_ids)
        found = {rid: self._results.pop(rid) for rid in list(wanted) if rid in self._results}
        deadline = time.monotonic() + timeout
        while len(found) < len(wanted) and time.monotonic() < deadline:
            self.poll(0)
            wait = min(0.2, max(0.0, deadline - time.monotonic()))
            for result in self._read(consumer, decoder, wait):
                rid = str(result["request_id"])
                self._awaited.discard(rid)
                if rid in wanted:
                    found[rid] = result
                    if progress is not None:
                        progress(result)
                else:
                    self._results[rid] = result
        return found

    def _read(self, consumer: Consumer, decoder: AvroDecoder, timeout: float) -> list[ResultRecord]:
        ctx = SerializationContext(self._topics.results, MessageField.VALUE)
        out: list[ResultRecord] = []
        for msg in consume_ready(consumer, 500, timeout):
            if msg.error() is not None:
                continue
            try:
                result = decoder(msg.value(), ctx)
            except SerializationError:
                # Not ours to quarantine: the results topic has its own consumers for that.
                continue
            if str(result["request_id"]) in self._awaited:
                out.append(result)
        return out


def _delivery_error(err: KafkaError, limit: int) -> Exception:
    # A topic whose `max.message.bytes` is below the producer's limit refuses on the broker.
    if err.code() == KafkaError.MSG_SIZE_TOO_LARGE:
        return RecordTooLargeError(None, limit)
    return PublishError(err.str())
