"""Moving a model between pools against the real Kafka, registry and PostgreSQL: a producer that
sees the model's placement change holds its requests until the old pool's workers have read
past what it sent there, so no key's requests are answered out of order, and none is lost.

The old pool is kept busy on purpose: a burst of requests waits there (its worker loads the
model cold, since the model was placed elsewhere before the burst) when the producer moves the
model, so the new pool's idle worker would answer the later requests first if nothing held them.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from pathlib import Path

from tests.integration.agents.test_pools import wait_for_log, wait_until_loaded_on
from tests.integration.workers import (
    Reader,
    Stack,
    controller_relay,
    request,
    start_worker,
    stop_workers,
    tidegate,
)
from tests.support import unique
from tidegate.clients.producer import TidegateProducer
from tidegate.core.kafka import make_admin
from tidegate.core.pools import pool_topic_names
from tidegate.models.model_settings import ModelSettings

KEYS = 16
BEFORE, AFTER = 1500, 500


def out_of_order(answered: list[tuple[str, str]]) -> list[tuple[str, int, int]]:
    """(key, earlier, later) for each result that came after one of a later request of its key;
    `answered` is (routing key, request id) in the results topic's order (one key, one
    partition)."""
    last: dict[str, int] = defaultdict(lambda: -1)
    wrong = []
    for key, rid in answered:
        seq = int(rid.rsplit("-", 1)[1])
        if seq < last[key]:
            wrong.append((key, last[key], seq))
        last[key] = max(last[key], seq)
    return wrong


async def test_a_model_moved_under_load_answers_every_key_in_order(
    stack: Stack, models: ModelSettings, tmp_path: Path
) -> None:
    pool = unique("mv").lower().replace("_", "-")[:40]
    await asyncio.to_thread(tidegate, stack, models, "pools", "declare", pool, "--partitions", "4")
    old = start_worker(stack, models, TIDEGATE_WORKER_WORKER_ID="old-pool")
    new = start_worker(stack, models, TIDEGATE_WORKER_POOL=pool, TIDEGATE_WORKER_WORKER_ID="new")
    results = Reader(stack, stack.topics.results)
    placement: dict[str, str | None] = {"tiny": None}
    try:
        async with controller_relay(stack):
            await wait_for_log(models, "old-pool")
            await wait_for_log(models, "new")
            await asyncio.to_thread(tidegate, stack, models, "pools", "place", "tiny", pool)
            await wait_until_loaded_on(stack, {"new"})

        producer = TidegateProducer(
            stack.kafka,
            stack.topics,
            stack.registry,
            placement=placement.get,
            worker_group=stack.group,
        )
        producer.start()
        try:
            # A producer that has not seen the move yet fills the old pool's topic.
            for i in range(BEFORE):
                producer.publish_record(request(f"r-{i}", f"k{i % KEYS}"))  # type: ignore[arg-type]
            placement["tiny"] = pool
            for i in range(BEFORE, BEFORE + AFTER):
                producer.publish_record(request(f"r-{i}", f"k{i % KEYS}"))  # type: ignore[arg-type]
            assert producer.flush(60) == 0
            answered = await asyncio.to_thread(results.until, BEFORE + AFTER, 120)
        finally:
            producer.stop()
        guard = producer.move_guard
        assert guard is not None
        assert (guard.moves, guard.timeouts) == (1, 0), "one move, drained in time"

        ids = [str(r["request_id"]) for r in answered]
        assert sorted(ids) == sorted(f"r-{i}" for i in range(BEFORE + AFTER)), "none lost"
        assert len(ids) == len(set(ids)), "none answered twice"
        by = {str(r["request_id"]): str(r["worker_id"]) for r in answered}
        assert {by[f"r-{i}"] for i in range(BEFORE)} == {"old-pool"}
        assert {by[f"r-{i}"] for i in range(BEFORE, BEFORE + AFTER)} == {"new"}
        order = [(f"k{int(rid.rsplit('-', 1)[1]) % KEYS}", rid) for rid in ids]
        assert out_of_order(order) == [], "a key's later request was answered first"
    finally:
        stop_workers(old, new)
        results.close()
        admin = make_admin(stack.kafka)
        for future in admin.delete_topics(pool_topic_names(stack.topics, pool)).values():
            future.result(timeout=30)
