"""Dynamic batching: dispatch when idle, collect while busy, the size cap and the idle delay, one
queue per model, every member answered."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

import pytest
from prometheus_client import REGISTRY
from pydantic import ValidationError

from tests.unit.agents.batching_support import Outbox
from tests.unit.agents.dataplane_support import until
from tidegate.agents.inference.batching import (
    BatchQueue,
    BatchResultCountError,
    KeyedBatcher,
    QueueClosedError,
)
from tidegate.agents.worker_metrics import PrometheusBatchObserver
from tidegate.agents.worker_settings import WorkerSettings


class Recorder:
    """A handler that records its batches and answers each item with `item * 10`; while `gate`
    is set it holds each batch until the gate opens."""

    def __init__(self) -> None:
        self.batches: list[list[int]] = []
        self.waits: list[list[float]] = []
        self.gate: asyncio.Event | None = None
        self.running = asyncio.Event()

    async def __call__(self, items: Sequence[int], waits: Sequence[float]) -> list[int]:
        self.batches.append(list(items))
        self.waits.append(list(waits))
        self.running.set()
        if self.gate is not None:
            await self.gate.wait()
        await asyncio.sleep(0)
        return [i * 10 for i in items]


def submit(
    queue: BatchQueue[int, int], outbox: Outbox, *items: int
) -> list[asyncio.Future[object]]:
    futures = [outbox.expect(item) for item in items]
    for item in items:
        queue.submit(item)
    return futures


async def test_an_idle_model_gets_the_first_request_at_once() -> None:
    handler, outbox = Recorder(), Outbox()
    queue = BatchQueue(handler, outbox, max_batch_size=32)
    queue.start()
    started = time.monotonic()
    (future,) = submit(queue, outbox, 1)
    assert await asyncio.wait_for(future, 2) == 10
    assert time.monotonic() - started < 0.5
    assert handler.batches == [[1]]
    await queue.stop()


async def test_requests_collect_while_a_batch_runs_and_go_together_when_it_ends() -> None:
    handler, outbox = Recorder(), Outbox()
    handler.gate = asyncio.Event()
    queue = BatchQueue(handler, outbox, max_batch_size=8)
    queue.start()
    first = submit(queue, outbox, 0)
    await asyncio.wait_for(handler.running.wait(), 2)
    later = submit(queue, outbox, *range(1, 11))
    await asyncio.sleep(0.01)
    assert handler.batches == [[0]], "a batch started while the model was busy"
    handler.gate.set()
    await asyncio.wait_for(asyncio.gather(*first, *later), 2)
    assert handler.batches == [[0], list(range(1, 9)), [9, 10]], "not capped at max_batch_size"
    assert outbox.deliveries == handler.batches, "not one delivery per batch"
    await queue.stop()


async def test_a_full_batch_goes_at_once_without_waiting_for_the_delay() -> None:
    handler, outbox = Recorder(), Outbox()
    queue = BatchQueue(handler, outbox, max_batch_size=4, max_batch_delay_ms=10_000)
    queue.start()
    started = time.monotonic()
    futures = submit(queue, outbox, *range(4))
    assert await asyncio.wait_for(asyncio.gather(*futures), 2) == [0, 10, 20, 30]
    assert time.monotonic() - started < 1.0
    assert handler.batches == [[0, 1, 2, 3]]
    await queue.stop()


async def test_with_a_delay_an_idle_model_waits_that_long_for_a_fuller_batch() -> None:
    handler, outbox = Recorder(), Outbox()
    queue = BatchQueue(handler, outbox, max_batch_size=100, max_batch_delay_ms=50)
    queue.start()
    started = time.monotonic()
    futures = submit(queue, outbox, *range(3))
    assert await asyncio.wait_for(asyncio.gather(*futures), 2) == [0, 10, 20]
    assert time.monotonic() - started >= 0.045
    assert handler.batches == [[0, 1, 2]]
    assert all(w >= 45 for w in handler.waits[0])
    await queue.stop()


async def test_more_than_a_batch_is_split_in_order() -> None:
    handler, outbox = Recorder(), Outbox()
    queue = BatchQueue(handler, outbox, max_batch_size=3)
    queue.start()
    results = await asyncio.wait_for(asyncio.gather(*submit(queue, outbox, *range(7))), 2)
    assert results == [i * 10 for i in range(7)]
    assert [i for batch in handler.batches for i in batch] == list(range(7))
    assert max(len(b) for b in handler.batches) <= 3
    await queue.stop()


async def test_one_queue_per_key_and_models_run_side_by_side() -> None:
    gate = asyncio.Event()
    running: set[str] = set()
    both = asyncio.Event()
    seen: list[list[tuple[str, int]]] = []

    async def handler(items: Sequence[tuple[str, int]], waits: Sequence[float]) -> list[int]:
        models = {m for m, _ in items}
        seen.append(list(items))
        running.update(models)
        if len(running) == 2:
            both.set()
        await gate.wait()
        return [n for _, n in items]

    delivered: list[list[tuple[str, int]]] = []
    batcher: KeyedBatcher[tuple[str, int], int] = KeyedBatcher(
        handler, lambda items, _outcome: delivered.append(list(items)), max_batch_size=16
    )
    for n in range(6):
        for model in ("slow", "fast"):
            batcher.submit(model, (model, n))
    await asyncio.wait_for(both.wait(), 2)  # neither model waits for the other
    gate.set()
    await until(lambda: sum(map(len, delivered)) == 12)
    assert all(len({m for m, _ in batch}) == 1 for batch in seen), "a batch mixed models"
    for model in ("slow", "fast"):
        assert [n for b in delivered for m, n in b if m == model] == list(range(6))
    await batcher.stop()


async def test_a_wrong_number_of_results_fails_every_member() -> None:
    async def short(items: Sequence[int], waits: Sequence[float]) -> list[int]:
        return list(items)[:-1]

    outbox = Outbox()
    queue = BatchQueue(short, outbox, max_batch_size=3)
    queue.start()
    futures = submit(queue, outbox, *range(3))
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

    outbox = Outbox()
    queue = BatchQueue(flaky, outbox, max_batch_size=3)
    queue.start()
    first = submit(queue, outbox, *range(3))
    outcomes = await asyncio.wait_for(asyncio.gather(*first, return_exceptions=True), 2)
    assert [type(o) for o in outcomes] == [ValueError] * 3
    assert await asyncio.wait_for(submit(queue, outbox, 7)[0], 2) == 7
    await queue.stop()


async def test_stopping_answers_queued_and_running_members() -> None:
    release = asyncio.Event()

    async def slow(items: Sequence[int], waits: Sequence[float]) -> list[int]:
        await release.wait()
        return list(items)

    outbox = Outbox()
    queue = BatchQueue(slow, outbox, max_batch_size=2)
    queue.start()
    futures = submit(queue, outbox, *range(5))
    await asyncio.sleep(0.01)
    await queue.stop()
    outcomes = await asyncio.gather(*futures, return_exceptions=True)
    assert all(isinstance(o, QueueClosedError) for o in outcomes)
    (late,) = submit(queue, outbox, 9)
    assert isinstance(late.exception(), QueueClosedError)


async def test_batch_size_and_wait_are_observed() -> None:
    def sample(name: str) -> float:
        return REGISTRY.get_sample_value(name) or 0.0

    sizes, size_sum = (
        sample("tidegate_worker_batch_size_count"),
        sample("tidegate_worker_batch_size_sum"),
    )
    waits = sample("tidegate_worker_batch_wait_seconds_count")
    outbox = Outbox()
    queue = BatchQueue(Recorder(), outbox, max_batch_size=5, observer=PrometheusBatchObserver())
    queue.start()
    await asyncio.wait_for(asyncio.gather(*submit(queue, outbox, *range(5))), 2)
    await queue.stop()
    assert sample("tidegate_worker_batch_size_count") == sizes + 1
    assert sample("tidegate_worker_batch_size_sum") == size_sum + 5
    assert sample("tidegate_worker_batch_wait_seconds_count") == waits + 5


async def test_knobs_are_validated() -> None:
    with pytest.raises(ValueError, match="max_batch_size"):
        BatchQueue(Recorder(), Outbox(), max_batch_size=0)
    with pytest.raises(ValueError, match="max_batch_delay_ms"):
        KeyedBatcher(Recorder(), Outbox(), max_batch_delay_ms=-1)
    with pytest.raises(ValidationError):
        WorkerSettings(max_batch_size=0)
    with pytest.raises(ValidationError):
        WorkerSettings(max_batch_delay_ms=-0.5)
    assert WorkerSettings().max_batch_size == 32
    assert WorkerSettings().max_batch_delay_ms == 0.0


def test_a_queue_needs_a_running_loop() -> None:
    with pytest.raises(RuntimeError):
        BatchQueue(Recorder(), Outbox())
