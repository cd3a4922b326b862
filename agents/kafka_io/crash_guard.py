"""Crash loops (`CrashGuard`): a message whose processing kills the worker process is quarantined
after `crash_limit` kills, counted in Redis in one hash per partition. When Redis is unreachable
the guard stands down rather than stop serving.
The marks and what they cost: docs/failures.md ("Crash loops (`agents/kafka_io/crash_guard.py`,
`agents/kafka_io/solo_lane.py`)").
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Iterable
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import Counter
from redis.asyncio import Redis
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from tidegate.core.telemetry import get_logger

__all__ = ["CrashGuard", "PartitionGuard"]

log = get_logger(__name__)

CRASH_GUARD_ERRORS = Counter(
    "tidegate_worker_crash_guard_errors",
    "Redis calls of the crash guard that failed (the guard skips them).",
)
CRASHES = Counter(
    "tidegate_worker_crashes_detected",
    "Worker crashes found on assignment, by what they pinned down (range or message).",
    ["kind"],
)
_TTL_S = 7 * 24 * 3600
_STAND_DOWN_S = 30.0
_AHEAD = 256


@dataclass(slots=True)
class PartitionGuard:
    """What the guard knows of one assigned partition."""

    suspect_hi: int | None = None
    quarantined: set[int] = field(default_factory=set)
    counts: dict[int, int] = field(default_factory=dict)
    written_hi: int = -1

    def suspect(self, offset: int) -> bool:
        return self.suspect_hi is not None and offset <= self.suspect_hi


class CrashGuard:
    def __init__(
        self, redis: Redis, *, group_id: str, topic: str, crash_limit: int, timeout_s: float = 0.5
    ) -> None:
        self._redis = redis
        self._prefix = f"tidegate:crash:{group_id}:{topic}:"
        self.crash_limit = crash_limit
        self._timeout_s = timeout_s
        self.partitions: dict[int, PartitionGuard] = {}
        self._down_until = 0.0

    def key(self, partition: int) -> str:
        return f"{self._prefix}{partition}"

    async def assigned(self, partitions: Iterable[int]) -> None:
        """Read each new partition's hash: a dead owner's marks become suspects and counts."""
        parts = [p for p in partitions if p not in self.partitions]
        for partition in parts:
            self.partitions[partition] = PartitionGuard()
        if not parts or self._down():
            return
        try:
            async with self._redis.pipeline(transaction=False) as pipe:
                for partition in parts:
                    pipe.hgetall(self.key(partition))
                found = await self._bounded(pipe.execute())
            for partition, fields in zip(parts, found, strict=True):
                await self._recover(partition, _text(fields))
        except (RedisError, OSError) as exc:
            self._unavailable(exc)

    async def _recover(self, partition: int, fields: dict[str, str]) -> None:
        guard = self.partitions[partition]
        key = self.key(partition)
        high = [int(fields["hi"])] if "hi" in fields else []
        if "range" in fields:
            high.append(int(fields["range"]))
        updates: dict[str, Any] = {}
        if "solo" in fields:
            offset = int(fields["solo"])
            count = int(fields.get(f"n:{offset}", "1")) + 1
            updates[f"n:{offset}"] = count
            CRASHES.labels("message").inc()
            log.warning(
                "partition %d: offset %d was being processed alone when its worker died "
                "(%d crashes)",
                partition,
                offset,
                count,
            )
        elif "hi" in fields:
            CRASHES.labels("range").inc()
            log.warning(
                "partition %d: its last worker died with offsets up to %s unfinished; they are "
                "processed one at a time",
                partition,
                fields["hi"],
            )
        for name, value in {**fields, **updates}.items():
            if name.startswith("n:"):
                guard.counts[int(name[2:])] = int(value)
        guard.quarantined = {o for o, n in guard.counts.items() if n >= self.crash_limit}
        if high:
            guard.suspect_hi = max(high)
            updates["range"] = guard.suspect_hi
        if updates:
            async with self._redis.pipeline(transaction=True) as pipe:
                pipe.hset(key, mapping=updates)
                pipe.hdel(key, "hi", "solo")
                pipe.expire(key, _TTL_S)
                await self._bounded(pipe.execute())

    async def consumed(self, highest: dict[int, int]) -> None:
        """Before a poll's messages are processed: the new highest offset per partition."""
        moved = {}
        for partition, offset in highest.items():
            guard = self.partitions.get(partition)
            if guard is not None and offset > guard.written_hi:
                # Written ahead of what was read: one write per `_AHEAD` offsets instead of one
                # per poll. After a crash the unread rest of the mark is suspect too, and costs
                # that many messages run one at a time (a second or so).
                guard.written_hi = offset + _AHEAD
                moved[partition] = guard.written_hi
        if not moved or self._down():
            return
        try:
            async with self._redis.pipeline(transaction=False) as pipe:
                for partition, offset in moved.items():
                    pipe.hset(self.key(partition), "hi", str(offset))
                    pipe.expire(self.key(partition), _TTL_S)
                await self._bounded(pipe.execute())
        except (RedisError, OSError) as exc:
            self._unavailable(exc)

    async def solo(self, partition: int, offset: int) -> None:
        """Before a suspect is processed alone."""
        if self._down():
            return
        try:
            async with self._redis.pipeline(transaction=False) as pipe:
                pipe.hset(self.key(partition), "solo", str(offset))
                await self._bounded(pipe.execute())
        except (RedisError, OSError) as exc:
            self._unavailable(exc)

    async def passed(self, partition: int) -> None:
        """The partition's suspects are all done: it is an ordinary partition again."""
        guard = self.partitions.get(partition)
        if guard is not None:
            guard.suspect_hi = None
        try:
            async with self._redis.pipeline(transaction=False) as pipe:
                pipe.hdel(self.key(partition), "range", "solo")
                await self._bounded(pipe.execute())
        except (RedisError, OSError) as exc:
            self._unavailable(exc)

    async def released(self, partitions: Iterable[int], *, clear: bool = True) -> None:
        """The partitions are given up cleanly: no crash to report for them. A lost partition
        (`clear=False`) keeps its marks: its new owner may be writing them already."""
        parts = list(partitions)
        for partition in parts:
            self.partitions.pop(partition, None)
        if not parts or not clear or self._down():
            return
        try:
            async with self._redis.pipeline(transaction=False) as pipe:
                for partition in parts:
                    pipe.hdel(self.key(partition), "hi", "solo")
                await self._bounded(pipe.execute())
        except (RedisError, OSError) as exc:
            self._unavailable(exc)

    async def close(self) -> None:
        await self._redis.aclose()

    async def _bounded(self, call: Awaitable[Any]) -> Any:
        try:
            return await asyncio.wait_for(call, self._timeout_s)
        except TimeoutError as exc:
            raise RedisTimeoutError(f"no answer within {self._timeout_s} s") from exc

    def _down(self) -> bool:
        """Whether the guard stands down: a Redis that failed is left alone for a while, so a
        poll does not wait out a timeout every time."""
        return time.monotonic() < self._down_until

    def _unavailable(self, exc: BaseException) -> None:
        CRASH_GUARD_ERRORS.inc()
        self._down_until = time.monotonic() + _STAND_DOWN_S
        log.warning(
            "crash guard: Redis unavailable, standing down for %.0f s: %s", _STAND_DOWN_S, exc
        )


def _text(fields: dict[Any, Any]) -> dict[str, str]:
    return {
        (k.decode() if isinstance(k, bytes) else str(k)): (
            v.decode() if isinstance(v, bytes) else str(v)
        )
        for k, v in fields.items()
    }
