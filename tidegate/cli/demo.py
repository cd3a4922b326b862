"""`tidegate demo`: a round trip of Avro requests through the real Kafka and schema registry.

Until the worker agents exist (the inference-path issue), the demo proves the foundations: requests
are encoded with the registered schema, published to `inference-requests` keyed by routing key,
read back from the partitions they landed on, decoded and checked.
"""

from __future__ import annotations

import time
import uuid
from datetime import UTC, datetime
from typing import Annotated, Any

import typer

__all__ = ["demo"]


def _request(i: int, run: str) -> dict[str, Any]:
    import struct

    features = [((i * 31 + j) % 97) / 97.0 for j in range(64)]
    return {
        "request_id": f"{run}-{i}",
        "model": "fraud",
        "tenant": "demo",
        "routing_key": f"card-{i % 16}",
        "inputs": [
            {
                "name": "features",
                "datatype": "FP32",
                "shape": [1, 64],
                "data": struct.pack("<64f", *features),
                "parameters": {},
            }
        ],
        "created_at": datetime.now(UTC),
    }


def _percentile(sorted_s: list[float], q: float) -> float:
    if not sorted_s:
        return float("nan")
    return sorted_s[min(len(sorted_s) - 1, int(q * len(sorted_s)))] * 1000


def demo(
    count: Annotated[int, typer.Option(min=1, max=100_000, help="Requests to send.")] = 500,
    timeout: Annotated[float, typer.Option(help="Seconds to wait for the round trip.")] = 60.0,
) -> None:
    """Publish requests to `inference-requests`, read them back and print a summary."""
    from confluent_kafka import TopicPartition
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.serialization import MessageField, SerializationContext
    from rich.console import Console
    from rich.progress import track
    from rich.table import Table

    from schemas import INFERENCE_REQUEST, AvroDecoder, AvroEncoder, load_schema
    from tidegate.kafka import make_consumer, make_producer
    from tidegate.settings import KafkaSettings, SchemaRegistrySettings, TopicSettings

    console = Console()
    kafka, topics = KafkaSettings(), TopicSettings()
    registry = SchemaRegistryClient(SchemaRegistrySettings().client_config())
    schema = load_schema(INFERENCE_REQUEST)
    encoder, decoder = AvroEncoder(registry, schema), AvroDecoder(registry, schema)
    ctx = SerializationContext(topics.requests, MessageField.VALUE)

    consumer = make_consumer(kafka, f"tidegate-demo-{uuid.uuid4().hex[:8]}")
    meta = consumer.list_topics(topics.requests, timeout=10).topics[topics.requests]
    starts = [
        TopicPartition(
            topics.requests,
            p,
            consumer.get_watermark_offsets(TopicPartition(topics.requests, p), timeout=10)[1],
        )
        for p in meta.partitions
    ]
    consumer.assign(starts)

    run = uuid.uuid4().hex[:8]
    producer = make_producer(kafka)
    sent_at: dict[str, float] = {}
    started = time.perf_counter()
    for i in track(range(count), description="publishing", console=console):
        record = _request(i, run)
        sent_at[record["request_id"]] = time.perf_counter()
        producer.produce(topics.requests, key=record["routing_key"], value=encoder(record, ctx))
        producer.poll(0)
    producer.flush(30)
    publish_s = time.perf_counter() - started

    latencies: list[float] = []
    deadline = time.monotonic() + timeout
    while len(latencies) < count and time.monotonic() < deadline:
        msg = consumer.poll(0.5)
        if msg is None or msg.error():
            continue
        decoded = decoder(msg.value(), ctx)
        if decoded["request_id"] in sent_at:
            latencies.append(time.perf_counter() - sent_at.pop(decoded["request_id"]))
    consumer.close()

    latencies.sort()
    table = Table("requests", "published/s", "read back", "p50 ms", "p99 ms", "lost")
    table.add_row(
        str(count),
        f"{count / publish_s:,.0f}",
        str(len(latencies)),
        f"{_percentile(latencies, 0.50):.1f}",
        f"{_percentile(latencies, 0.99):.1f}",
        str(len(sent_at)),
    )
    console.print(table)
    console.print(
        "Requests round-tripped through Kafka and the schema registry. Model serving arrives "
        "with the inference-path issue."
    )
    if sent_at:
        raise typer.Exit(1)
