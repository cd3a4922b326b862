"""Micro-batching: size and delay triggers, per-partition order, every member answered."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

import pytest
from prometheus_client import REGISTRY
from pydantic import ValidationError

from tidegate.agents.batching import (
    BatchQueue,
    BatchResultCountError,
    PartitionBatcher,
    QueueClosedError,
)
from tidegate.agents.worker_metrics import PrometheusBatchObserver
from tidegate.agents.worker_settings import WorkerSettings


class Recorder:
    """A handler that records its batches and answers each item with `item * 10`."""

    def __init__(self) -> None:
        self.batches: list[list[int]] = []
        self.waits: list[list[float]] = []

    async def __call__(self, items: Sequence[int], waits: Sequence[float]) -> list[int]:
        self.batches.append(list(items))
        self.waits.append(list(waits))
        await asyncio.sleep(0)
        return [i * 10 for i in items]


async def test_a_full_batch_goes_at_once_without_waiting_for_the_delay() -> None:
    handler = Recorder()
    queue = BatchQueue(handler, max_batch_size=4, max_batch_delay_ms=10_000)
    queue.start()
    started = time.monotonic()
    futures = [queue.submit(i) for i in range(4)]
    assert await asyncio.wait_for(asyncio.gather(*futures), 2) == [0, 10, 20, 30]
    assert time.monotonic() - started < 1.0
    assert handler.batches == [[0, 1, 2, 3]]
    await queue.stop()


async def test_a_partial_batch_goes_when_the_delay_has_passed() -> None:
    handler = Recorder()
    queue = BatchQueue(handler, max_batch_size=100, max_batch_delay_ms=50)
    queue.start()
    started = time.monotonic()
    futures = [queue.submit(i) for i in range(3)]
    assert await asyncio.wait_for(asyncio.gather(*futures), 2) == [0, 10, 20]
    assert time.monotonic() - started >= 0.045
    assert handler.batches == [[0, 1, 2]]
    assert all(w >= 45 for w in handler.waits[0])
    await queue.stop()


async def test_more_than_a_batch_is_split_in_order() -> None:
    handler = Recorder()
    queue = BatchQueue(handler, max_batch_size=3, max_batch_delay_ms=0)
    queue.start()
    results = await asyncio.wait_for(asyncio.gather(*(queue.submit(i) for i in range(7))), 2)
    assert results == [i * 10 for i in range(7)]
    assert [i for batch in handler.batches for i in batch] == list(range(7))
    assert max(len(b) for b in handler.batches) <= 3
    await queue.stop()


async def test_batches_are_per_partition_and_keep_each_partitions_order() -> None:
    seen: list[list[tuple[int, int]]] = []
    running: set[int] = set()
    overlapped = False

    async def handler(items: Sequence[tuple[int, int]], waits: Sequence[float]) -> list[int]:
        nonlocal overlapped
        partition = items[0][0]
        overlapped = overlapped or partition in running
        running.add(partition)
        seen.append(list(items))
        await asyncio.sleep(0.005)
        running.discard(partition)
        return [seq for _, seq in items]

    batcher = PartitionBatcher(handler, max_batch_size=4, max_batch_delay_ms=1)
    futures: dict[int, list[asyncio.Future[int]]] = {0: [], 1: []}
    for seq in range(20):
        for partition in (0, 1):
            futures[partition].append(batcher.submit(partition, (partition, seq)))
    for partition in (0, 1):
        assert await asyncio.wait_for(asyncio.gather(*futures[partition]), 5) == list(range(20))
    assert all(len({p for p, _ in batch}) == 1 for batch in seen), "a batch mixed partitions"
    for partition in (0, 1):
        order = [seq for batch in seen for p, seq in batch if p == partition]
        assert order == list(range(20))
    assert not overlapped, "two batches of one partition ran at the same time"
    await batcher.stop()


async def test_a_wrong_number_of_results_fails_every_member() -> None:
    async def short(items: Sequence[int], waits: Sequence[float]) -> list[int]:
        return list(items)[:-1]

    queue = BatchQueue(short, max_batch_size=3, max_batch_delay_ms=0)
    queue.start()
    futures = [queue.submit(i) for i in range(3)]
    outcomes = await asyncio.wait_for(asyncio.gather(*futures, return_exceptions=True), 2)
    assert all(isinstance(o, BatchResultCountError) for o in outcomes)
    await queue.stop()


async def test_a_failing_handler_fails_every_member_and_the_queue_goes_on() -> None:
    calls = 0

    async def flaky(items: Sequence[int], waits: Sequence[float]) -> list[int]:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise ValueError("boom")
        return list(items)

    queue = BatchQueue(flaky, max_batch_size=3, max_batch_delay_ms=0)
    queue.start()
    first = [queue.submit(i) for i in range(3)]
    outcomes = await asyncio.wait_for(asyncio.gather(*first, return_exceptions=True), 2)
    assert [type(o) for o in outcomes] == [ValueError] * 3
    assert await asyncio.wait_for(queue.submit(7), 2) == 7
    await queue.stop()


async def test_stopping_answers_queued_and_running_members() -> None:
    release = asyncio.Event()

    async def slow(items: Sequence[int], waits: Sequence[float]) -> list[int]:
        await release.wait()
        return list(items)

    queue = BatchQueue(slow, max_batch_size=2, max_batch_delay_ms=0)
    queue.start()
    futures = [queue.submit(i) for i in range(5)]
    await asyncio.sleep(0.01)
    await queue.stop()
    outcomes = await asyncio.gather(*futures, return_exceptions=True)
    assert all(isinstance(o, QueueClosedError) for o in outcomes)
    assert isinstance(queue.submit(9).exception(), QueueClosedError)


async def test_batch_size_and_wait_are_observed() -> None:
    def sample(name: str) -> float:
        return REGISTRY.get_sample_value(name) or 0.0

    sizes, size_sum = (
        sample("tidegate_worker_batch_size_count"),
        sample("tidegate_worker_batch_size_sum"),
    )
    waits = sample("tidegate_worker_batch_wait_seconds_count")
    queue = BatchQueue(
        Recorder(), max_batch_size=5, max_batch_delay_ms=0, observer=PrometheusBatchObserver()
    )
    queue.start()
    await asyncio.wait_for(asyncio.gather(*(queue.submit(i) for i in range(5))), 2)
    await queue.stop()
    assert sample("tidegate_worker_batch_size_count") == sizes + 1
    assert sample("tidegate_worker_batch_size_sum") == size_sum + 5
    assert sample("tidegate_worker_batch_wait_seconds_count") == waits + 5


async def test_knobs_are_validated() -> None:
    with pytest.raises(ValueError, match="max_batch_size"):
        BatchQueue(Recorder(), max_batch_size=0)
    with pytest.raises(ValueError, match="max_batch_delay_ms"):
        PartitionBatcher(Recorder(), max_batch_delay_ms=-1)
    with pytest.raises(ValidationError):
        WorkerSettings(max_batch_size=0)
    with pytest.raises(ValidationError):
        WorkerSettings(max_batch_delay_ms=-0.5)
    assert WorkerSettings().max_batch_size == 32
    assert WorkerSettings().max_batch_delay_ms == 5.0


def test_a_queue_needs_a_running_loop() -> None:
    with pytest.raises(RuntimeError):
        BatchQueue(Recorder())
