"""Open-loop Kafka load for the JSON peers, and the generator's own ceiling.

`JsonLoad` is `tidegate.clients.loadgen.KafkaLoad` for JSON requests and results: request i is due
at `start + i / rate` whatever happened to the ones before, and its latency counts from when it
was due to when its result (matched by request id) arrives on the sink topic, so a peer that falls
behind cannot hide its queueing. A request not answered within the grace period counts as lost.

`ceiling()` runs the same generator against a bare consume->produce relay of the JSON bytes in its
own process (no decoding, no model): the rates it sustains there bound what any peer can be shown
to sustain, so a peer measured well below it is the limit, not the generator.

`python -m tests.bench.peers.jsonload --bootstrap B --source T --sink T --group G` runs that relay.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import signal
import sys
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

from tidegate.clients.loadgen import LoadResult
from tidegate.core.kafka import consume_ready, make_consumer, make_producer
from tidegate.core.settings import KafkaSettings

__all__ = ["Ceiling", "JsonLoad", "ceiling", "relay"]

RecordFactory = Callable[[int], dict[str, Any]]


class JsonLoad:
    """A long-lived producer of JSON requests to `source` and reader of their results on `sink`.

    An idempotent producer's first message to each partition waits for its producer id and the
    partition's sequence state (~0.5 s here), so `start` warms every partition up before anything
    is timed, as KafkaLoad does.
    """

    def __init__(self, source: str, sink: str, kafka: KafkaSettings | None = None) -> None:
        self._source, self._sink = source, sink
        self._kafka = kafka or KafkaSettings()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._due: dict[str, tuple[float, LoadResult]] = {}
        self._reader: threading.Thread | None = None
        self._producer: Any = None
        self._consumer: Any = None

    def start(self, warm_up: RecordFactory) -> None:
        from confluent_kafka import TopicPartition

        self._consumer = consumer = make_consumer(self._kafka, f"jsonload-{uuid.uuid4().hex[:8]}")
        meta = consumer.list_topics(self._sink, timeout=10).topics[self._sink]
        ends = []
        for p in meta.partitions:
            high = consumer.get_watermark_offsets(TopicPartition(self._sink, p), timeout=10)[1]
            ends.append(TopicPartition(self._sink, p, high))
        consumer.assign(ends)
        self._reader = threading.Thread(target=self._collect, name="jsonload-results", daemon=True)
        self._reader.start()
        self._producer = make_producer(self._kafka)
        source = self._producer.list_topics(self._source, timeout=10).topics[self._source]
        count = 16 * len(source.partitions)

        def spread(i: int) -> dict[str, Any]:
            # Keyed by request id, so the warm-up reaches every partition (with near certainty).
            return {**warm_up(i), "key": None}

        self.run("warm-up", spread, rate=400.0, count=count)

    def stop(self) -> None:
        self._stop.set()
        if self._reader is not None:
            self._reader.join(5)
            self._reader = None
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None
        if self._producer is not None:
            self._producer.flush(10)
            self._producer = None

    def __enter__(self) -> JsonLoad:
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
        grace_s: float = 15.0,
    ) -> LoadResult:
        """Publish `count` requests at `rate`/s; wait up to `grace_s` after the last one for the
        results. `make_record(i)` gives `request_id`, `features` and the message `key`."""
        result = LoadResult(label)
        producer = self._producer
        start = time.perf_counter()
        for i in range(count):
            at = start + i / rate
            delay = at - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            record = make_record(i)
            key = record.pop("key", None) or record["request_id"]
            with self._lock:
                self._due[record["request_id"]] = (at, result)
            producer.produce(self._source, key=key, value=json.dumps(record))
            producer.poll(0)
            result.sent += 1
        producer.flush(30)
        deadline = time.monotonic() + grace_s
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
            for msg in consume_ready(self._consumer, 500, 0.1):
                value = msg.value()
                if msg.error() or value is None:
                    continue
                now = time.perf_counter()
                record = json.loads(value)
                with self._lock:
                    entry = self._due.pop(record["request_id"], None)
                if entry is None:  # a warm-up straggler, or a duplicate after a rebalance
                    continue
                at, result = entry
                result.latencies.append(now - at)
                result.batch_sizes.append(int(record.get("batch_size") or 0))
                # The relay of `ceiling` echoes requests, so only an explicit error counts as one.
                status = "error" if "error" in record else "OK"
                result.statuses[status] = result.statuses.get(status, 0) + 1
                if status == "OK":
                    result.ok += 1
                else:
                    result.errors += 1


@dataclass
class Ceiling:
    """The generator against the bare relay: the highest rate whose p99 stayed within the bar
    with nothing lost, every step run, and the generator process's CPU (cores) in each step."""

    rate: float
    runs: list[LoadResult] = field(default_factory=list)
    cores: list[float] = field(default_factory=list)


def ceiling(
    rates: Sequence[float] = (1000, 1500, 2000, 3000, 4000, 6000, 8000, 12000, 16000),
    *,
    step_s: float = 3.0,
    bar_ms: float = 100.0,
    progress: Callable[[LoadResult, float], None] | None = None,
) -> Ceiling:
    """Step the generator up against a bare relay until a step misses the bar.

    On a 2-core machine the generator, the relay and the broker share the cores, so what stops the
    steps may be the machine rather than the generator alone: `cores` tells how much of it was the
    generator's."""
    from tests.bench.peers.run_peers import json_fraud_record, json_topics, start_relay
    from tests.support import unique

    out = Ceiling(0.0)
    with (
        json_topics("peers-ceiling") as (source, sink),
        start_relay(source, sink),
        JsonLoad(source, sink) as load,
    ):
        load.start(functools.partial(json_fraud_record, tag=unique("warm")))
        for rate in rates:
            tag = unique(f"ceiling-{rate:g}")
            cpu = time.process_time()
            result = load.run(
                "generator ceiling",
                functools.partial(json_fraud_record, tag=tag),
                rate=float(rate),
                count=max(1, int(rate * step_s)),
                grace_s=10.0,
            )
            cores = (time.process_time() - cpu) / result.elapsed_s if result.elapsed_s else 0.0
            out.runs.append(result)
            out.cores.append(cores)
            if progress is not None:
                progress(result, float(rate))
            if result.lost or result.errors or result.p(0.99) > bar_ms:
                break
            out.rate = float(rate)
    return out


def relay(argv: list[str] | None = None) -> int:
    """A bare consume->produce relay of the request bytes: the trivial endpoint of `ceiling`."""
    parser = argparse.ArgumentParser(description="bare JSON relay for the generator's ceiling")
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--source", required=True)
    parser.add_argument("--sink", required=True)
    parser.add_argument("--group", required=True)
    args = parser.parse_args(argv)
    kafka = KafkaSettings(bootstrap_servers=args.bootstrap)
    consumer = make_consumer(kafka, args.group)
    producer = make_producer(kafka)
    stopping = False

    def stop(_signum: int, _frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    parent = os.getppid()
    consumer.subscribe([args.source])
    # Once the parent is gone (a benchmark killed outright) the process is reparented.
    while not stopping and os.getppid() == parent:
        messages = consume_ready(consumer, 500, 0.1)
        for msg in messages:
            if not msg.error():
                # The request's own bytes carry its request_id, which is all the reader matches.
                producer.produce(args.sink, key=msg.key(), value=msg.value())
        producer.poll(0)
        if messages:
            consumer.commit(asynchronous=True)
    consumer.close()
    producer.flush(10)
    return 0


if __name__ == "__main__":
    sys.exit(relay())
