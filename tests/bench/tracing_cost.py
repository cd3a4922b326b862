"""What tracing costs the worker's per-batch path: decode, batch, build the results, encode and
produce them (the real Avro codec over a mock registry, a producer that only counts, a model that
returns a constant), with tracing off, on with every request sampled, and on with every request
sampled out upstream. Spans go through the batch processor to an exporter that drops them, as they
would to OTLP minus the network. `python -m tests.bench.tracing_cost`; rounds alternate and the
best batch counts (docs/observability.md has the figures)."""

from __future__ import annotations

import asyncio
import struct
import sys
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
from confluent_kafka.schema_registry import Schema
from confluent_kafka.schema_registry._sync.mock_schema_registry_client import (
    MockSchemaRegistryClient,
)
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from tidegate.agents.inference.result_builders import Timings, ok_result
from tidegate.agents.kafka_io.delivery import ResultPublisher
from tidegate.agents.kafka_io.failures import default_router
from tidegate.agents.kafka_io.partition import PartitionPipeline, Slot, hand_over
from tidegate.agents.kafka_io.sinks import AckedSink
from tidegate.agents.tasks.decoding import RequestDecoder
from tidegate.agents.tasks.inference_task import InferenceTask
from tidegate.agents.tasks.worker_tracing import batch_span, consumed
from tidegate.core import tracing as tracing_module
from tidegate.core.settings import TopicSettings
from tidegate.core.telemetry_settings import TracingSettings
from tidegate.core.tracing import KafkaHeaders, span_headers, start_tracing
from tidegate.schemas.catalog import INFERENCE_REQUEST, load_schema, topic_subjects
from tidegate.schemas.codec import AvroDecoder, AvroEncoder
from tidegate.schemas.records import RequestRecord, ResultRecord, TensorRecord
from tidegate.schemas.tensors import from_numpy

__all__ = ["run"]

SIZE = 32
BATCHES = 300
ROUNDS = 7
MODES = ("off", "on", "on, sampled out upstream")
TOPICS = TopicSettings(requests="req", results="res", failed="fail", poison="poison", shadow="sh")


class _Drop(SpanExporter):
    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return SpanExportResult.SUCCESS


class _Producer:
    def __init__(self) -> None:
        self.acks: list[Any] = []

    def produce(self, topic: str, **kwargs: Any) -> None:
        if "on_delivery" in kwargs:
            self.acks.append(kwargs["on_delivery"])

    def poll(self, timeout: float = 0.0) -> int:
        return 0


class _Message:
    __slots__ = ("_headers", "_offset", "_value")

    def __init__(self, offset: int, value: bytes, headers: KafkaHeaders | None) -> None:
        self._offset, self._value, self._headers = offset, value, headers

    def topic(self) -> str:
        return TOPICS.requests

    def partition(self) -> int:
        return 0

    def offset(self) -> int:
        return self._offset

    def key(self) -> bytes:
        return b"key"

    def value(self) -> bytes:
        return self._value

    def headers(self) -> KafkaHeaders | None:
        return self._headers

    def timestamp(self) -> tuple[int, int]:
        return (1, int(time.time() * 1000))


def _request(index: int) -> RequestRecord:
    return {
        "request_id": f"r{index}",
        "model": "fraud",
        "routing_key": f"k{index}",
        "inputs": [
            {
                "name": "features",
                "datatype": "FP32",
                "shape": [1, 4],
                "data": struct.pack("<4f", 1, 2, 3, 4),
                "parameters": {},
            }
        ],
        "created_at": int(time.time() * 1000),
        "reply_to": {"topic": "replies", "partition": 1},
    }


def _answer(tasks: list[InferenceTask], output: list[TensorRecord]) -> list[ResultRecord]:
    timings = Timings(0.1, 0.2, len(tasks))
    return [ok_result(t, output, version="1", timings=timings, worker_id="w") for t in tasks]


async def _best_batch_us(mode: str, client: MockSchemaRegistryClient, values: list[bytes]) -> float:
    producer = _Producer()
    publisher = ResultPublisher(producer, client, TOPICS)  # type: ignore[arg-type]
    publisher.start()
    tracer = None
    headers: KafkaHeaders | None = None
    if mode != "off":
        tracer = start_tracing(TracingSettings(enabled=True), "bench").tracer
        assert tracer is not None
        with tracer.start_as_current_span("send") as sent:
            headers = span_headers(sent)
        if mode != "on":
            headers = [(name, value[:-2] + b"00") for name, value in headers]
    sink = AckedSink(publisher, worker_id="w", on_fatal=print, traced=tracer is not None)
    decoder = RequestDecoder(AvroDecoder(client, load_schema(INFERENCE_REQUEST)))
    pipe = PartitionPipeline(
        TOPICS.requests, 0, decoder=decoder, sink=sink, failures=default_router(TOPICS, "w")
    )
    output = [from_numpy("probabilities", np.zeros((1, 2), dtype=np.float32))]
    best = float("inf")
    for batch in range(BATCHES):
        messages = [_Message(batch * SIZE + i, value, headers) for i, value in enumerate(values)]
        started = time.perf_counter()
        slots: list[Slot] = []
        for msg in messages:
            slot = pipe.accept(msg)
            assert slot is not None
            if tracer is not None:
                consumed(tracer, msg, slot.task)
            slots.append(slot)
        tasks = [slot.task for slot in slots]
        if tracer is None:
            results = _answer(tasks, output)
        else:
            with batch_span(tracer, tasks):
                results = _answer(tasks, output)
        hand_over(slots, results, worker_id="w")
        sink.flush()
        acks, producer.acks = producer.acks, []
        for ack in acks:
            ack(None, None)
        await asyncio.sleep(0)  # the sink releases the offsets on the loop
        best = min(best, time.perf_counter() - started)
    return best * 1e6


async def _run() -> None:
    # The batch processor, as in production, exporting to nothing instead of OTLP.
    tracing_module._otlp_exporter = lambda _settings: _Drop()  # type: ignore[assignment]
    client = MockSchemaRegistryClient({"url": "mock://tracing-cost"})
    for subject, name in topic_subjects(TOPICS).items():
        client.register_schema(subject, Schema(load_schema(name).text, "AVRO"))
    encoder = AvroEncoder(client, load_schema(INFERENCE_REQUEST))
    schema_id = encoder.schema_id(f"{TOPICS.requests}-value")
    values = [encoder.encode(_request(i), schema_id) for i in range(SIZE)]
    best = dict.fromkeys(MODES, float("inf"))
    for _ in range(ROUNDS):
        for mode in MODES:
            best[mode] = min(best[mode], await _best_batch_us(mode, client, values))
    base = best["off"]
    print(f"worker per-batch path, batches of {SIZE}, best batch of {ROUNDS} rounds:")
    for mode in MODES:
        extra = (best[mode] - base) / SIZE
        print(f"  tracing {mode:26s} {best[mode]:8.1f} us/batch  {extra:+6.1f} us/request")


def run() -> None:
    asyncio.run(_run())


if __name__ == "__main__":
    run()
    sys.exit(0)
