"""An in-memory stand-in for the few `redis.asyncio.Redis` calls the prediction cache and feature
enrichment make (`GET`, `SET`, `MGET`, and pipelines of `SET` and `HMGET`), counting round
trips: the stages promise one per batch for each. The integration tests run the same stages
against the real Redis."""

from __future__ import annotations

from typing import Any, cast

from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError

__all__ = ["FakeRedis", "as_redis"]


class FakeRedis:
    def __init__(self) -> None:
        self.values: dict[str, bytes] = {}
        self.hashes: dict[str, dict[str, bytes]] = {}
        self.ttls_ms: dict[str, int] = {}
        self.round_trips = 0
        self.down = False

    def _trip(self) -> None:
        if self.down:
            raise RedisConnectionError("Connection refused")
        self.round_trips += 1

    async def mget(self, keys: list[str]) -> list[bytes | None]:
        self._trip()
        return [self.values.get(key) for key in keys]

    async def get(self, key: str) -> bytes | None:
        self._trip()
        return self.values.get(key)

    async def set(self, key: str, value: bytes, *, px: int) -> bool:
        self._trip()
        self.values[key] = value
        self.ttls_ms[key] = px
        return True

    def pipeline(self, transaction: bool = True) -> _Pipeline:
        assert transaction is False, "the stages never need MULTI"
        return _Pipeline(self)


def as_redis(fake: FakeRedis) -> Redis:
    """The fake where a stage takes a client: it answers every call the stages make."""
    return cast(Redis, fake)


class _Pipeline:
    def __init__(self, redis: FakeRedis) -> None:
        self._redis = redis
        self._commands: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []

    def set(self, key: str, value: bytes, *, px: int) -> _Pipeline:
        self._commands.append(("set", (key, value), {"px": px}))
        return self

    def hmget(self, key: str, fields: list[str]) -> _Pipeline:
        self._commands.append(("hmget", (key, fields), {}))
        return self

    async def execute(self) -> list[Any]:
        self._redis._trip()
        out: list[Any] = []
        for name, args, options in self._commands:
            if name == "set":
                key, value = args
                self._redis.values[key] = value
                self._redis.ttls_ms[key] = options["px"]
                out.append(True)
            else:
                key, fields = args
                found = self._redis.hashes.get(key, {})
                out.append([found.get(field) for field in fields])
        return out
