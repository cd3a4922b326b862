"""Priority lanes against the real Kafka: the producer client picks the lane, a worker process
serves both, each in its own consumer group, and a batch-lane flood neither delays real-time
requests nor stops: while real-time traffic flows, the batch lane gets about its share."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import numpy as np
from confluent_kafka import ConsumerGroupTopicPartitions, TopicPartition

from tests.integration.workers import (
    SIGNATURE,
    Reader,
    Stack,
    in_thread,
    running,
)
from tests.support import eventually, unique, wait_for
from tidegate.agents.assembly import RunningWorker
from tidegate.agents.inference.loaded import LoadedModel
from tidegate.clients.producer import Lane, TidegateProducer
from tidegate.core.kafka import make_admin
from tidegate.models.model_settings import ModelSettings
from tidegate.models.runtime.contract import Arrays, ModelRuntime

FEATURES = np.array([[1.0, 2.0, 3.0, 4.0]], dtype=np.float32)


def send(client: TidegateProducer, request_id: str, lane: Lane | None = None) -> str:
    return client.publish("tiny", {"features": FEATURES}, request_id=request_id, lane=lane)


class SlowRuntime(ModelRuntime):
    """Each call takes `delay_s` (off the CPU, so the lanes could overlap freely but for the
    gate) and sums its rows."""

    def __init__(self, delay_s: float) -> None:
        self.delay_s = delay_s

    async def load(self, package: Any) -> None:
        """Nothing to load."""

    async def infer(self, inputs: Arrays) -> dict[str, Any]:
        await asyncio.sleep(self.delay_s)
        total = inputs["features"].sum(axis=1, keepdims=True, dtype=np.float32)
        return {"probabilities": np.concatenate([total, -total], axis=1)}


def loader_of(runtime: ModelRuntime) -> Any:
    async def loader(name: str, version: str) -> LoadedModel:
        return LoadedModel(name, version, SIGNATURE, runtime)

    return loader


def producer(stack: Stack, lane: Lane) -> TidegateProducer:
    client = TidegateProducer(stack.kafka, stack.topics, stack.registry, lane=lane)
    client.start()
    return client


async def both_assigned(worker: RunningWorker) -> None:
    async def probe() -> bool:
        return all(len(w._pipelines) == 4 for w in worker.lanes.values())

    await eventually(probe, what="both lanes assigned their 4 partitions")


def ids_of(reader: Reader, prefix: str) -> set[str]:
    """Request ids of the results `reader` has read so far that start with `prefix`."""
    ids = (str(record["request_id"]) for record, _ in reader.poll())
    return {rid for rid in ids if rid.startswith(prefix)}


def until_all(reader: Reader, prefix: str, ids: set[str], timeout: float = 60.0) -> None:
    wait_for(lambda: ids_of(reader, prefix) >= ids, timeout=timeout, what=f"every {prefix} result")


async def test_each_lane_is_served_in_its_own_group(stack: Stack, models: ModelSettings) -> None:
    results = Reader(stack, stack.topics.results)
    async with running(stack, models, loader_of(SlowRuntime(0.0))) as worker:
        assert set(worker.lanes) == {"realtime", "batch"}
        assert worker.lanes["batch"].requests_topic == stack.topics.requests_batch
        realtime, batch = producer(stack, "realtime"), producer(stack, "batch")
        rt = [send(realtime, f"rt-{i}") for i in range(5)]
        # A publish may name another lane than its client's.
        bt = [send(batch, f"bt-{i}") for i in range(5)]
        bt.append(send(realtime, "bt-x", lane="batch"))
        assert realtime.flush(30) == 0
        assert batch.flush(30) == 0
        got = await in_thread(results.until, 11)
    realtime.stop()
    batch.stop()
    assert {r["status"] for r in got} == {"OK"}
    assert ids_of(results, "rt-") == set(rt)
    assert ids_of(results, "bt-") == set(bt)
    # The batch lane read its own topic and committed there, in `<group>-batch`.
    admin = make_admin(stack.kafka)
    tps = [TopicPartition(stack.topics.requests_batch, p) for p in range(4)]
    asked = ConsumerGroupTopicPartitions(f"{stack.group}-batch", tps)
    (future,) = admin.list_consumer_group_offsets([asked]).values()
    committed = future.result(timeout=30).topic_partitions
    assert sum(max(tp.offset, 0) for tp in committed) == 6


async def test_a_batch_flood_gets_its_share_while_realtime_flows(
    stack: Stack, models: ModelSettings
) -> None:
    # 20 ms a call, 4 requests a batch: unhindered, the batch lane does 200 requests a second.
    runtime = SlowRuntime(0.02)
    results = Reader(stack, stack.topics.results)
    async with running(
        stack, models, loader_of(runtime), max_batch_size=4, batch_share=0.1
    ) as worker:
        await both_assigned(worker)
        batch, realtime = producer(stack, "batch"), producer(stack, "realtime")
        flood = [send(batch, f"flood-{i}") for i in range(400)]
        assert batch.flush(30) == 0
        # A steady real-time stream, one request every 10 ms for 1.5 s: its lane never idles.
        sent: list[str] = []
        pacer = threading.Event()  # never set: its timed wait paces the stream

        def stream() -> None:
            pace = time.monotonic()
            while len(sent) < 150:
                sent.append(send(realtime, unique("rt")))
                realtime.poll(0)
                pace += 0.01
                pacer.wait(max(0.0, pace - time.monotonic()))
            assert realtime.flush(30) == 0

        await in_thread(stream)
        await in_thread(until_all, results, "rt-", set(sent))
        # Every real-time request is answered while the flood is not; meanwhile the flood moved,
        # at about its share (10% of 200/s over ~1.5 s is ~30; unhindered it would be ~300).
        during = len(ids_of(results, "flood-"))
        assert 0 < during < 150, during
        # Once real-time traffic stops, the batch lane has the worker to itself.
        await in_thread(until_all, results, "flood-", set(flood))
    realtime.stop()
    batch.stop()
