"""The Python producer client: publish `InferenceRequest`s, optionally wait for their results.

Requests are Avro in the Confluent wire format under `inference-requests-value`, looked up in the
registry (never registered from here: `tidegate schemas register` owns that), and keyed by routing
key or request id. Publishing is asynchronous like any Kafka producer: `publish` enqueues and
returns the request id, delivery is reported through `on_delivery` or collected for `flush`.

Results are awaited through the client's own consumer of `inference-results`, assigned to every
partition at its end offset when the client starts. No group membership is involved, so any
number of clients can wait side by side; each reads the whole topic and keeps only what it awaits,
which suits scripts and batch jobs. Interactive traffic at volume should go through the gateway,
whose replicas each read one partition of the replies topic.

With a `Tracing` that is on, each publish is a `send <topic>` span, a child of the span current
where `publish` is called, and the request carries its W3C trace context in its headers, so
the worker's spans join the caller's trace. Off (the default), nothing of it runs.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from types import TracebackType
from typing import Any

from confluent_kafka import Consumer, KafkaError, Message, Producer, TopicPartition
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.serialization import MessageField, SerializationContext
from opentelemetry.trace import Span, SpanKind, Status, StatusCode

from tidegate.core.errors import (
    ConfigurationError,
    OverloadedError,
    ResultTimeoutError,
    RetriableError,
    SerializationError,
)
from tidegate.core.kafka import consume_ready, make_consumer, make_producer
from tidegate.core.settings import KafkaSettings, SchemaRegistrySettings, TopicSettings
from tidegate.core.tracing import TRACING_OFF, KafkaHeaders, Tracing, span_headers
from tidegate.schemas.catalog import INFERENCE_REQUEST, INFERENCE_RESULT, load_schema
from tidegate.schemas.codec import AvroDecoder, AvroEncoder
from tidegate.schemas.requests import Inputs, build_request, request_key

__all__ = [
    "DeliveryCallback",
    "PublishError",
    "TidegateProducer",
    "build_request",
    "request_key",
]

DeliveryCallback = Callable[[str, Exception | None], None]


class PublishError(RetriableError):
    """Kafka did not take the request (brokers down, topic missing, delivery timed out)."""

    code = "PUBLISH_FAILED"


class TidegateProducer:
    """Publishes requests; with `await_results=True` also reads results. Start it, then use it."""

    def __init__(
        self,
        kafka: KafkaSettings | None = None,
        topics: TopicSettings | None = None,
        registry: SchemaRegistrySettings | None = None,
        *,
        await_results: bool = False,
        producer_extra: Mapping[str, Any] | None = None,
        tracing: Tracing = TRACING_OFF,
    ) -> None:
        self._kafka = kafka or KafkaSettings()
        self._tracing = tracing
        self._topics = topics or TopicSettings()
        self._registry = registry or SchemaRegistrySettings()
        self._await_results = await_results
        self._producer_extra = dict(producer_extra or {})
        self._producer: Producer | None = None
        self._consumer: Consumer | None = None
        self._encoder: AvroEncoder | None = None
        self._decoder: AvroDecoder | None = None
        self._schema_id = 0
        self._awaited: set[str] = set()
        self._results: dict[str, dict[str, Any]] = {}
        self.delivery_errors: dict[str, Exception] = {}

    def start(self, timeout: float = 15.0) -> None:
        """Connect, look the schema id up and, when awaiting results, pin the result offsets."""
        client = SchemaRegistryClient(self._registry.client_config())
        self._encoder = AvroEncoder(client, load_schema(INFERENCE_REQUEST))
        self._schema_id = self._encoder.schema_id(f"{self._topics.requests}-value")
        self._producer = make_producer(self._kafka, self._producer_extra)
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
    ) -> str:
        """Enqueue one request and return its id. `deadline` is an instant or a time from now."""
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
        self.publish_record(record, on_delivery)
        return str(record["request_id"])

    def publish_record(
        self,
        record: Mapping[str, Any],
        on_delivery: DeliveryCallback | None = None,
        headers: KafkaHeaders | None = None,
    ) -> None:
        """Enqueue a ready `InferenceRequest` record; a record that does not encode raises."""
        producer, encoder = self._running()
        request_id = str(record["request_id"])
        value = encoder.encode(record, self._schema_id)
        if self._await_results:
            self._awaited.add(request_id)
        report = on_delivery or self._remember_failure
        topic = self._topics.requests
        span: Span | None = None
        tracer = self._tracing.tracer
        if tracer is not None:
            span = tracer.start_span(
                f"send {topic}",
                kind=SpanKind.PRODUCER,
                attributes={"tidegate.request_id": request_id},
            )
            headers = [*(headers or ()), *span_headers(span)]

        def delivered(err: KafkaError | None, _msg: Message) -> None:
            error = None if err is None else PublishError(err.str())
            if span is not None:
                if error is not None:
                    span.set_status(Status(StatusCode.ERROR, str(error)))
                span.end()
            report(request_id, error)

        kwargs: dict[str, Any] = {"value": value, "key": request_key(record), "headers": headers}
        try:
            producer.produce(topic, on_delivery=delivered, **kwargs)
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
        producer.poll(0)

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

    def await_result(self, request_id: str, timeout: float = 30.0) -> dict[str, Any]:
        """The `InferenceResult` of one published request; `ResultTimeoutError` after `timeout`."""
        found = self.await_results([request_id], timeout)
        if request_id not in found:
            raise ResultTimeoutError(f"no result for {request_id} within {timeout}s")
        return found[request_id]

    def await_results(
        self,
        request_ids: Iterable[str],
        timeout: float = 30.0,
        progress: Callable[[dict[str, Any]], None] | None = None,
    ) -> dict[str, dict[str, Any]]:
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

    def _read(
        self, consumer: Consumer, decoder: AvroDecoder, timeout: float
    ) -> list[dict[str, Any]]:
        ctx = SerializationContext(self._topics.results, MessageField.VALUE)
        out: list[dict[str, Any]] = []
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
