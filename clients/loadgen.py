"""Open-loop load generation for the demo and the benchmarks, over Kafka and over HTTP.

Open loop: request i is due at `start + i / rate` whatever happened to the ones before, and its
latency is measured from when it was due, not from when it was sent, so a stalled system cannot
hide its queueing (no coordinated omission).
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

from tidegate.core.kafka import consume_ready, make_consumer, make_producer
from tidegate.core.settings import KafkaSettings, SchemaRegistrySettings, TopicSettings
from tidegate.schemas.catalog import INFERENCE_REQUEST, INFERENCE_RESULT
from tidegate.schemas.catalog import load_schema as schema
from tidegate.schemas.codec import AvroDecoder, AvroEncoder

__all__ = ["AvroWire", "KafkaLoad", "LoadResult", "Wire", "http_load", "percentile"]

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
    shed: int = 0
    """503s with `Retry-After` that were sent again after it (`http_load(retry_shed=...)`)."""
    shed_reasons: dict[str, int] = field(default_factory=dict)
    """The shed calls by the refusal's `detail`, its numbers masked: which check refused."""
    records: list[dict[str, Any]] = field(default_factory=list)
    """The result records themselves, when the load was started with `keep_records`."""

    @property
    def throughput(self) -> float:
        return (self.ok + self.errors) / self.elapsed_s if self.elapsed_s else 0.0

    def p(self, q: float) -> float:
        return percentile(self.latencies, q) * 1000

    @classmethod
    def merged(cls, label: str, parts: list[LoadResult]) -> LoadResult:
        """One result for runs that belong together (e.g. the chunks of a canary's traffic)."""
        out = cls(label)
        for part in parts:
            out.sent += part.sent
            out.ok += part.ok
            out.errors += part.errors
            out.lost += part.lost
            out.shed += part.shed
            for reason, n in part.shed_reasons.items():
                out.shed_reasons[reason] = out.shed_reasons.get(reason, 0) + n
            out.elapsed_s += part.elapsed_s
            out.latencies.extend(part.latencies)
            out.batch_sizes.extend(part.batch_sizes)
            out.records.extend(part.records)
            for status, n in part.statuses.items():
                out.statuses[status] = out.statuses.get(status, 0) + n
        return out

    @property
    def mean_batch(self) -> float:
        return sum(self.batch_sizes) / len(self.batch_sizes) if self.batch_sizes else 0.0


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class Wire(Protocol):
    """How a load's requests go out and its results come back: topics, bytes and status."""

    source: str
    sink: str

    def encode(self, record: dict[str, Any]) -> bytes: ...

    def decode(self, raw: bytes) -> dict[str, Any]: ...

    def key(self, record: dict[str, Any]) -> str | None:
        """The message key; None spreads the request over partitions by its id."""

    def unkeyed(self, record: dict[str, Any]) -> dict[str, Any]:
        """The record without its key, so that warm-up requests reach every partition."""

    def status(self, result: dict[str, Any]) -> str: ...


class AvroWire:
    """tidegate's contract: Avro `InferenceRequest`s in, `InferenceResult`s back, routing keys."""

    def __init__(self, topics: TopicSettings) -> None:
        from confluent_kafka.schema_registry import SchemaRegistryClient
        from confluent_kafka.serialization import MessageField, SerializationContext

        self.source, self.sink = topics.requests, topics.results
        registry = SchemaRegistryClient(SchemaRegistrySettings().client_config())
        self._encoder = AvroEncoder(registry, schema(INFERENCE_REQUEST))
        self._decoder = AvroDecoder(registry, schema(INFERENCE_RESULT))
        self._ctx = SerializationContext(topics.requests, MessageField.VALUE)

    def encode(self, record: dict[str, Any]) -> bytes:
        record["created_at"] = datetime.now(UTC)
        encoded: bytes = self._encoder(record, self._ctx)
        return encoded

    def decode(self, raw: bytes) -> dict[str, Any]:
        decoded: dict[str, Any] = self._decoder(raw)
        return decoded

    def key(self, record: dict[str, Any]) -> str | None:
        return record.get("routing_key")

    def unkeyed(self, record: dict[str, Any]) -> dict[str, Any]:
        return {**record, "routing_key": None}

    def status(self, result: dict[str, Any]) -> str:
        return str(result["status"])


class KafkaLoad:
    """A long-lived producer of requests and reader of their results, as a real producer app is.

    An idempotent producer's first message to each partition waits for its producer id and the
    partition's sequence state (~0.5 s here), so a fresh producer per measurement would put that
    start-up into every p99. `start` therefore warms every partition up before anything is timed.
    """

    def __init__(
        self,
        topics: Any = None,
        *,
        keep_records: bool = False,
        wire: Wire | None = None,
        kafka: KafkaSettings | None = None,
        group_prefix: str = "loadgen",
    ) -> None:
        """`topics` (a TopicSettings) defaults to the environment's; `keep_records` keeps every
        result record in its LoadResult, for callers that check more than status and latency;
        `wire` replaces tidegate's Avro topics with another contract (the benchmark's peers);
        `kafka` and `group_prefix` are whom it connects as and its reader's group (a producer
        principal may use only `tidegate-producer-*` groups)."""
        self._kafka = kafka or KafkaSettings()
        self._group_prefix = group_prefix
        self._wire: Wire = wire or AvroWire(topics or TopicSettings())
        self._keep = keep_records
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._due: dict[str, tuple[float, LoadResult]] = {}
        self._reader: threading.Thread | None = None
        self._producer: Any = None
        self._consumer: Any = None

    def start(self, warm_up: RecordFactory) -> None:
        from confluent_kafka import TopicPartition

        sink, source = self._wire.sink, self._wire.source
        self._consumer = consumer = make_consumer(
            self._kafka, f"{self._group_prefix}-{uuid.uuid4().hex[:8]}"
        )
        meta = consumer.list_topics(sink, timeout=10).topics[sink]
        ends = []
        for p in meta.partitions:
            high = consumer.get_watermark_offsets(TopicPartition(sink, p), timeout=10)[1]
            ends.append(TopicPartition(sink, p, high))
        consumer.assign(ends)
        self._reader = threading.Thread(target=self._collect, name="loadgen-results", daemon=True)
        self._reader.start()
        self._producer = make_producer(self._kafka)
        requests = self._producer.list_topics(source, timeout=10).topics[source]
        count = 16 * len(requests.partitions)

        def spread(i: int) -> dict[str, Any]:
            # Keyed by request id, so the warm-up reaches every partition (with near certainty).
            return self._wire.unkeyed(warm_up(i))

        self.run("warm-up", spread, rate=400.0, count=count)

    def stop(self) -> None:
        self._stop.set()
        if self._reader is not None:
            self._reader.join(5)
        if self._consumer is not None:
            self._consumer.close()
        if self._producer is not None:
            self._producer.flush(10)

    def __enter__(self) -> KafkaLoad:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def run(
        self,
        label: str,
        make_record: RecordFactory,
        *,
        rate: float,
        count: int,
        timeout_s: float = 60.0,
        progress: Callable[[int], None] | None = None,
    ) -> LoadResult:
        """Publish `count` requests at `rate`/s and collect their results for up to `timeout_s`
        after the last one; what has not come back by then is lost."""
        result = LoadResult(label)
        wire, producer = self._wire, self._producer
        start = time.perf_counter()
        for i in range(count):
            at = start + i / rate
            delay = at - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            record = make_record(i)
            with self._lock:
                self._due[record["request_id"]] = (at, result)
            key = wire.key(record) or record["request_id"]
            producer.produce(wire.source, key=key, value=wire.encode(record))
            producer.poll(0)
            result.sent += 1
            if progress is not None:
                progress(1)
        producer.flush(30)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and self._pending(result):
            time.sleep(0.02)
        result.elapsed_s = time.perf_counter() - start
        with self._lock:
            lost = [rid for rid, (_, r) in self._due.items() if r is result]
            for rid in lost:
                del self._due[rid]
        result.lost = len(lost)
        return result

    def _pending(self, result: LoadResult) -> bool:
        with self._lock:
            return any(r is result for _, r in self._due.values())

    def _collect(self) -> None:
        while not self._stop.is_set():
            batch = consume_ready(self._consumer, 500, 0.1)
            # Arrival is when the poll returned: decoding the batch's earlier messages is the
            # generator's own work, not the contender's latency.
            now = time.perf_counter()
            for msg in batch:
                value = msg.value()
                if msg.error() or value is None:
                    continue
                record = self._wire.decode(value)
                with self._lock:
                    entry = self._due.pop(record["request_id"], None)
                if entry is None:
                    continue
                at, result = entry
                result.latencies.append(now - at)
                result.batch_sizes.append(int(record.get("batch_size") or 0))
                if self._keep:
                    result.records.append(record)
                status = self._wire.status(record)
                result.statuses[status] = result.statuses.get(status, 0) + 1
                if status == "OK":
                    result.ok += 1
                else:
                    result.errors += 1


def _retry_after(value: str | None) -> float | None:
    """Seconds from a `Retry-After` of delta-seconds; None when absent or a date."""
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None


def _refusal_kind(body: bytes) -> str:
    """A problem body's `detail` with its numbers masked, so refusals by one check count as one."""
    try:
        detail = json.loads(body).get("detail")
    except (ValueError, AttributeError):
        detail = None
    if not isinstance(detail, str):
        return "(no detail)"
    return re.sub(r"\d+(\.\d+)?", "N", detail)


async def http_load(
    label: str,
    url: str,
    make_body: Callable[[int], dict[str, Any]],
    *,
    rate: float,
    count: int,
    timeout_s: float = 30.0,
    progress: Callable[[int], None] | None = None,
    headers: Mapping[str, str] | None = None,
    retry_shed: int = 0,
) -> LoadResult:
    """POST `count` V2 requests to `url` at `rate`/s, open loop, with `headers` added to each
    (e.g. `{"Authorization": "Bearer tg_..."}`: the gateway authenticates every call).

    With `retry_shed`, a call refused 503 with `Retry-After` (shed by admission control) is sent
    again after that many seconds, up to `retry_shed` times, as a well-behaved client does; its
    latency then runs to the last answer, and `LoadResult.shed` counts the retries. Benchmarks
    leave it at 0 and count the 503s.

    aiohttp rather than httpx: on these 2 cores the generator shares the CPU with what it measures,
    and httpx's per-request cost (about 5 ms) capped the measured rate at the client.
    """
    import aiohttp

    result = LoadResult(label)
    connector = aiohttp.TCPConnector(limit=1024)
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    sent_headers = {**(headers or {}), "Content-Type": "application/json"}
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        loop = asyncio.get_running_loop()
        start = loop.time()
        wall_start = time.perf_counter()

        async def one(i: int, at: float) -> None:
            body = json.dumps(make_body(i)).encode()
            for attempt in range(retry_shed + 1):
                wait_s = None
                try:
                    async with session.post(url, data=body, headers=sent_headers) as resp:
                        answer = await resp.read()
                        status = "OK" if resp.status == 200 else f"HTTP {resp.status}"
                        if resp.status == 503 and attempt < retry_shed:
                            wait_s = _retry_after(resp.headers.get("Retry-After"))
                            if wait_s is not None:
                                reason = _refusal_kind(answer)
                                result.shed_reasons[reason] = result.shed_reasons.get(reason, 0) + 1
                except (aiohttp.ClientError, TimeoutError) as exc:
                    status = type(exc).__name__
                if wait_s is None:
                    break
                result.shed += 1
                await asyncio.sleep(wait_s)
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
