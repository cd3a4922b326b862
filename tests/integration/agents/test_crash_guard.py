"""The crash guard's bookkeeping in the real Redis: what a dead owner's marks tell the next."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis

from tests.support import unique
from tidegate.agents.kafka_io.crash_guard import CrashGuard
from tidegate.core.settings import RedisSettings


@pytest.fixture
async def group() -> AsyncIterator[str]:
    name = unique("guard")
    yield name
    redis = Redis.from_url(RedisSettings().url)
    keys = [k async for k in redis.scan_iter(f"tidegate:crash:{name}:*")]
    if keys:
        await redis.delete(*keys)
    await redis.aclose()


def guard(group: str) -> CrashGuard:
    """A worker process's guard: a new one per process, as after a restart."""
    return CrashGuard(Redis.from_url(RedisSettings().url), group_id=group, topic="t", crash_limit=3)


async def test_a_clean_handover_leaves_no_suspects(group: str) -> None:
    first = guard(group)
    await first.assigned([0, 1])
    await first.consumed({0: 10, 1: 4})
    await first.released([0, 1])
    second = guard(group)
    await second.assigned([0, 1])
    assert second.partitions[0].suspect_hi is None
    assert second.partitions[1].suspect_hi is None
    for g in (first, second):
        await g.close()


async def test_a_dead_owner_leaves_its_range_then_the_message_it_died_on_is_counted(
    group: str,
) -> None:
    dead = guard(group)
    await dead.assigned([0])
    await dead.consumed({0: 7})
    await dead.consumed({0: 12})
    # Killed: nothing released.
    survivor = guard(group)
    await survivor.assigned([0])
    state = survivor.partitions[0]
    hi = 7 + 256  # the mark runs ahead of what was read; 12 was within it
    assert state.suspect_hi == hi
    assert state.suspect(3)
    assert state.suspect(hi)
    assert not state.suspect(hi + 1)
    assert state.quarantined == set()
    await survivor.solo(0, 9)  # ... and killed while 9 ran alone
    counts = []
    for _ in range(2):
        again = guard(group)
        await again.assigned([0])
        counts.append(again.partitions[0].counts[9])
        assert again.partitions[0].suspect_hi == hi  # the range stays until it is passed
        if 9 not in again.partitions[0].quarantined:
            await again.solo(0, 9)
        await again.close()
    # Killed in the range, then twice alone: three crashes, the limit.
    assert counts == [2, 3]
    last = guard(group)
    await last.assigned([0])
    assert last.partitions[0].quarantined == {9}
    await last.passed(0)
    await last.released([0])
    fresh = guard(group)
    await fresh.assigned([0])
    assert fresh.partitions[0].suspect_hi is None
    for g in (dead, survivor, last, fresh):
        await g.close()


async def test_without_redis_the_guard_stands_down() -> None:
    broken = CrashGuard(
        Redis.from_url("redis://127.0.0.1:1/0", socket_connect_timeout=0.2),
        group_id="g",
        topic="t",
        crash_limit=3,
    )
    await broken.assigned([0])
    await broken.consumed({0: 5})
    assert broken.partitions[0].suspect_hi is None
    await broken.close()
