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
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

from tidegate.clients.loadgen import KafkaLoad, LoadResult
from tidegate.core.kafka import consume_ready, make_consumer, make_producer
from tidegate.core.settings import KafkaSettings

__all__ = ["Ceiling", "JsonLoad", "JsonWire", "ceiling", "relay"]


class JsonWire:
    """The peers' contract: JSON requests (`request_id`, `features`, `key`) to `source`, JSON
    results (`request_id`, `probabilities`, `batch_size`) back on `sink`."""

    def __init__(self, source: str, sink: str) -> None:
        self.source, self.sink = source, sink

    def encode(self, record: dict[str, Any]) -> bytes:
        return json.dumps({k: v for k, v in record.items() if k != "key"}).encode()

    def decode(self, raw: bytes) -> dict[str, Any]:
        decoded: dict[str, Any] = json.loads(raw)
        return decoded

    def key(self, record: dict[str, Any]) -> str | None:
        key: str | None = record.get("key")
        return key

    def unkeyed(self, record: dict[str, Any]) -> dict[str, Any]:
        return {**record, "key": None}

    def status(self, result: dict[str, Any]) -> str:
        # The relay of `ceiling` echoes requests, so only an explicit error counts as one.
        return "error" if "error" in result else "OK"


def JsonLoad(source: str, sink: str) -> KafkaLoad:  # noqa: N802 - reads as the class it builds
    """`KafkaLoad` (open loop, warmed-up producer, results matched by request id) on JSON topics."""
    return KafkaLoad(wire=JsonWire(source, sink))


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
                timeout_s=10.0,
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
