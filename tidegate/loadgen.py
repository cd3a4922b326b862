"""Open-loop load generation for the demo and the benchmarks, over Kafka and over HTTP.

Open loop: request i is due at `start + i / rate` whatever happened to the ones before, and its
latency is measured from when it was due, not from when it was sent, so a stalled system cannot
hide its queueing (no coordinated omission).
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

__all__ = ["LoadResult", "http_load", "kafka_load", "percentile"]

RecordFactory = Callable[[int], dict[str, Any]]


@dataclass
class LoadResult:
    """What one load run measured. Latencies are seconds from when each request was due."""

    label: str
    sent: int = 0
    ok: int = 0
    errors: int = 0
    lost: int = 0
    elapsed_s: float = 0.0
    latencies: list[float] = field(default_factory=list)
    batch_sizes: list[int] = field(default_factory=list)
    statuses: dict[str, int] = field(default_factory=dict)

    @property
    def throughput(self) -> float:
        return (self.ok + self.errors) / self.elapsed_s if self.elapsed_s else 0.0

    def p(self, q: float) -> float:
        return percentile(self.latencies, q) * 1000

    @property
    def mean_batch(self) -> float:
        return sum(self.batch_sizes) / len(self.batch_sizes) if self.batch_sizes else 0.0


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def kafka_load(
    label: str,
    make_record: RecordFactory,
    *,
    rate: float,
    count: int,
    timeout_s: float = 60.0,
    progress: Callable[[int], None] | None = None,
) -> LoadResult:
    """Publish `count` requests to the requests topic at `rate`/s and collect their results."""
    from confluent_kafka import TopicPartition
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.serialization import MessageField, SerializationContext

    from schemas import INFERENCE_REQUEST, INFERENCE_RESULT, AvroDecoder, AvroEncoder, load_schema
    from tidegate.kafka import consume_ready, make_consumer, make_producer
    from tidegate.settings import KafkaSettings, SchemaRegistrySettings, TopicSettings

    kafka, topics = KafkaSettings(), TopicSettings()
    registry = SchemaRegistryClient(SchemaRegistrySettings().client_config())
    encoder = AvroEncoder(registry, load_schema(INFERENCE_REQUEST))
    decoder = AvroDecoder(registry, load_schema(INFERENCE_RESULT))
    req_ctx = SerializationContext(topics.requests, MessageField.VALUE)
    consumer = make_consumer(kafka, f"tidegate-loadgen-{uuid.uuid4().hex[:8]}")
    meta = consumer.list_topics(topics.results, timeout=10).topics[topics.results]
    ends = []
    for p in meta.partitions:
        high = consumer.get_watermark_offsets(TopicPartition(topics.results, p), timeout=10)[1]
        ends.append(TopicPartition(topics.results, p, high))
    consumer.assign(ends)

    result = LoadResult(label)
    due: dict[str, float] = {}
    lock = threading.Lock()
    stop = threading.Event()

    def collect() -> None:
        while not stop.is_set():
            for msg in consume_ready(consumer, 500, 0.2):
                if msg.error():
                    continue
                now = time.perf_counter()
                record = decoder(msg.value())
                with lock:
                    started = due.pop(record["request_id"], None)
                    if started is None:
                        continue
                    result.latencies.append(now - started)
                    result.batch_sizes.append(int(record.get("batch_size") or 0))
                    status = str(record["status"])
                    result.statuses[status] = result.statuses.get(status, 0) + 1
                    if status == "OK":
                        result.ok += 1
                    else:
                        result.errors += 1

    reader = threading.Thread(target=collect, name="loadgen-results", daemon=True)
    reader.start()
    producer = make_producer(kafka)
    start = time.perf_counter()
    for i in range(count):
        at = start + i / rate
        delay = at - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        record = make_record(i)
        record["created_at"] = datetime.now(UTC)
        with lock:
            due[record["request_id"]] = at
        key = record.get("routing_key") or record["request_id"]
        producer.produce(topics.requests, key=key, value=encoder(record, req_ctx))
        producer.poll(0)
        result.sent += 1
        if progress is not None:
            progress(1)
    producer.flush(30)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with lock:
            if not due:
                break
        time.sleep(0.05)
    stop.set()
    reader.join(5)
    consumer.close()
    result.elapsed_s = time.perf_counter() - start
    result.lost = len(due)
    return result


async def http_load(
    label: str,
    url: str,
    make_body: Callable[[int], dict[str, Any]],
    *,
    rate: float,
    count: int,
    timeout_s: float = 30.0,
    progress: Callable[[int], None] | None = None,
) -> LoadResult:
    """POST `count` V2 requests to `url` at `rate`/s, open loop.

    aiohttp rather than httpx: on these 2 cores the generator shares the CPU with what it measures,
    and httpx's per-request cost (about 5 ms) capped the measured rate at the client.
    """
    import aiohttp

    result = LoadResult(label)
    connector = aiohttp.TCPConnector(limit=1024)
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    headers = {"Content-Type": "application/json"}
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        loop = asyncio.get_running_loop()
        start = loop.time()
        wall_start = time.perf_counter()

        async def one(i: int, at: float) -> None:
            body = json.dumps(make_body(i)).encode()
            try:
                async with session.post(url, data=body, headers=headers) as resp:
                    await resp.read()
                    status = "OK" if resp.status == 200 else f"HTTP {resp.status}"
            except (aiohttp.ClientError, TimeoutError) as exc:
                status = type(exc).__name__
            result.latencies.append(loop.time() - at)
            result.statuses[status] = result.statuses.get(status, 0) + 1
            if status == "OK":
                result.ok += 1
            else:
                result.errors += 1
            if progress is not None:
                progress(1)

        tasks = []
        for i in range(count):
            at = start + i / rate
            delay = at - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(i, at)))
            result.sent += 1
        await asyncio.gather(*tasks)
        result.elapsed_s = time.perf_counter() - wall_start
    return result
