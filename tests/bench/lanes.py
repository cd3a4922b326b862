"""Priority lanes under a batch flood (`python -m tests.bench lanes`): one worker process (as
`tidegate worker` assembles it) serves a steady real-time stream, `RATE` requests a second for
`SECONDS`, three ways: alone; with a flood of `FLOOD` requests on the batch lane published as it
starts; and with the same flood on the real-time lane itself, as without lanes. The batch-lane
flood runs again with `realtime_idle_ms=0` (batch batches start in any gap of real-time traffic).
Reported: the real-time latency (publish to the result's Kafka timestamp) p50/p99, the flood's
throughput while the stream runs, and how long the flood took in all. A short stream first warms
the producer and the worker up, unmeasured.

The model takes `FIXED_S` plus `ROW_S` a row on its one thread, like the built-in runtimes (one
call at a time per loaded version), sleeping rather than burning CPU, so what is measured is the
worker's scheduling and not the machine's other tenants.
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from confluent_kafka import TopicPartition
from confluent_kafka.admin import NewTopic  # type: ignore[attr-defined]

from tests.bench.takeover import bench_stack
from tests.integration.workers import SIGNATURE, Stack, build_tiny_model
from tests.support import unique
from tidegate.agents.assembly import WorkerConfig, running_worker
from tidegate.agents.inference.loaded import LoadedModel
from tidegate.agents.worker_settings import WorkerSettings
from tidegate.clients.producer import Lane, TidegateProducer
from tidegate.core.kafka import make_admin, make_consumer
from tidegate.dlq.failure_settings import FailureSettings
from tidegate.models.runtime.contract import Arrays, ModelRuntime
from tidegate.schemas.catalog import INFERENCE_REQUEST
from tidegate.schemas.registration import RegistryHttp, register_all

__all__ = ["run"]

RATE = 100
SECONDS = 6.0
FLOOD = 6000
FIXED_S = 0.001
ROW_S = 0.00025
BATCH = 32
FEATURES = np.array([[1.0, 2.0, 3.0, 4.0]], dtype=np.float32)


class TimedRuntime(ModelRuntime):
    """`FIXED_S` plus `ROW_S` a row, on one thread, like the built-in runtimes."""

    def __init__(self) -> None:
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="bench-model")

    async def load(self, package: Any) -> None:
        """Nothing to load."""

    async def infer(self, inputs: Arrays) -> dict[str, Any]:
        x = inputs["features"]
        await asyncio.get_running_loop().run_in_executor(
            self._thread, time.sleep, FIXED_S + ROW_S * len(x)
        )
        total = x.sum(axis=1, keepdims=True, dtype=np.float32)
        return {"probabilities": np.concatenate([total, -total], axis=1)}


@dataclass
class Side:
    name: str
    flood_lane: Lane | None
    realtime_idle_ms: float = 10.0
    latencies_ms: list[float] = field(default_factory=list)
    flood_during_per_s: float = 0.0
    flood_total_s: float = 0.0


class Results:
    """Every result's request id and Kafka timestamp (ms), read in a thread."""

    def __init__(self, stack: Stack) -> None:
        self._consumer = make_consumer(stack.kafka, unique("lanes-bench-reader"))
        topic = stack.topics.results
        self._consumer.assign([TopicPartition(topic, p, 0) for p in range(4)])
        self._decode = stack.results
        self.seen: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        while not self._stop.is_set():
            for msg in self._consumer.consume(500, 0.1):
                if not msg.error():
                    self.seen[str(self._decode(msg.value())["request_id"])] = msg.timestamp()[1]

    def wait(self, ids: list[str], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not all(i in self.seen for i in ids):
            if time.monotonic() > deadline:
                missing = sum(i not in self.seen for i in ids)
                raise RuntimeError(f"{missing} results missing after {timeout}s")
            self._stop.wait(0.05)

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self._consumer.close()


@contextmanager
def lanes_stack() -> Iterator[Stack]:
    """`bench_stack`, with a batch-lane topic and subject of the run's own."""
    with tempfile.TemporaryDirectory(prefix="lanes-") as tmp:
        models = build_tiny_model(Path(tmp))
        with bench_stack(models) as stack:
            batch = unique("lanes-requests-batch")
            admin = make_admin(stack.kafka)
            admin.create_topics([NewTopic(batch, num_partitions=4, replication_factor=1)])[
                batch
            ].result(timeout=30)
            with RegistryHttp(stack.registry) as http:
                list(register_all(http, {f"{batch}-value": INFERENCE_REQUEST}))
            stack.topics = stack.topics.model_copy(update={"requests_batch": batch})
            try:
                yield stack
            finally:
                admin.delete_topics([batch])[batch].result(timeout=30)


def measure(
    realtime: TidegateProducer, results: Results, side: Side, seconds: float = SECONDS
) -> None:
    flood: list[str] = []
    began = time.time()
    if side.flood_lane is not None:
        prefix = unique("flood")
        for i in range(FLOOD):
            flood.append(
                realtime.publish(
                    "tiny", {"features": FEATURES}, request_id=f"{prefix}-{i}", lane=side.flood_lane
                )
            )
            if i % 500 == 0:
                realtime.poll(0)
        realtime.flush(30)
    sent: dict[str, float] = {}
    pace = time.monotonic()
    pacer = threading.Event()  # never set: its timed wait paces the stream
    stream_began = time.time()
    while len(sent) < RATE * seconds:
        rid = unique("rt")
        sent[rid] = time.time()
        realtime.publish("tiny", {"features": FEATURES}, request_id=rid)
        realtime.poll(0)
        pace += 1.0 / RATE
        pacer.wait(max(0.0, pace - time.monotonic()))
    stream_ended = time.time()
    realtime.flush(30)
    results.wait(list(sent), 120)
    side.latencies_ms = [results.seen[rid] - sent[rid] * 1000 for rid in sent]
    if flood:
        during = sum(
            stream_began * 1000 <= results.seen.get(f, 0) <= stream_ended * 1000 for f in flood
        )
        side.flood_during_per_s = during / (stream_ended - stream_began)
        results.wait(flood, 600)
        side.flood_total_s = max(results.seen[f] for f in flood) / 1000 - began


async def _serve(stack: Stack, sides: list[Side], realtime_idle_ms: float) -> None:
    runtime = TimedRuntime()

    async def loader(name: str, version: str) -> LoadedModel:
        return LoadedModel(name, version, SIGNATURE, runtime)

    config = WorkerConfig(
        worker=WorkerSettings(
            group_id=stack.group,
            worker_id="bench",
            metrics_port=0,
            max_batch_size=BATCH,
            realtime_idle_ms=realtime_idle_ms,
        ),
        kafka=stack.kafka,
        topics=stack.topics,
        registry=stack.registry,
        postgres=stack.pg,
        failure=FailureSettings(crash_guard=False),
    )
    results = Results(stack)
    # One producer for every side: a new one's first requests wait for its connection.
    realtime = TidegateProducer(stack.kafka, stack.topics, stack.registry)
    realtime.start()
    try:
        async with running_worker(config, loader=loader) as worker:
            deadline = time.monotonic() + 60
            while not all(len(w._pipelines) == 4 for w in worker.lanes.values()):
                if time.monotonic() > deadline:
                    raise RuntimeError("the lanes were not assigned their partitions")
                await asyncio.sleep(0.1)
            await asyncio.to_thread(measure, realtime, results, Side("warm-up", None), 1.0)
            for side in sides:
                await asyncio.to_thread(measure, realtime, results, side)
    finally:
        realtime.stop()
        results.close()


def run() -> None:
    sides = [
        Side("real-time alone", None),
        Side("flood on the batch lane", "batch"),
        Side("flood on the real-time lane", "realtime"),
        Side("batch lane, idle after 0 ms", "batch", realtime_idle_ms=0.0),
    ]
    with lanes_stack() as stack:
        for idle in sorted({s.realtime_idle_ms for s in sides}, reverse=True):
            asyncio.run(_serve(stack, [s for s in sides if s.realtime_idle_ms == idle], idle))
    print(
        f"\nlanes: {RATE} real-time requests/s for {SECONDS:.0f} s; flood of {FLOOD}; model "
        f"{FIXED_S * 1000:.1f} ms + {ROW_S * 1000:.2f} ms/row, batches of {BATCH}"
    )
    for side in sides:
        lat = sorted(side.latencies_ms)
        p99 = lat[min(len(lat) - 1, int(0.99 * len(lat)))]
        p50 = statistics.median(lat)
        line = f"  {side.name:<28} real-time p50 {p50:7.1f} ms  p99 {p99:7.1f} ms"
        if side.flood_lane is not None:
            line += (
                f"  flood {side.flood_during_per_s:6.0f}/s while real-time runs, "
                f"all in {side.flood_total_s:5.1f} s"
            )
        print(line)
