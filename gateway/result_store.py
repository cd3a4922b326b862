"""Where results wait to be fetched by id: a pending marker, the result later.

One Redis hash per request, `tidegate:gateway:request:<id>`, with two fields written separately
(so the marker and a fast result can land in either order): `meta`, the JSON the gateway needs
to answer later (which outputs, binary or not), and `result`, the InferenceResult exactly as it
came from Kafka (Confluent-framed Avro). Every write refreshes the TTL.

Only requests the gateway promised to keep are here: asynchronous ones (marked before they are
published) and synchronous ones answered 504 (marked then). A synchronous call answered in time
never writes (docs/decisions/009).
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import RedisError

from tidegate.gateway.http_errors import StoreUnavailableError

__all__ = ["RedisResultStore", "ResultStore", "StoredRequest"]

# The result of a request the store already knows (a marker, or an earlier copy); else nothing.
_ATTACH = """
if redis.call('EXISTS', KEYS[1]) == 1 then
  redis.call('HSET', KEYS[1], 'result', ARGV[1])
  return redis.call('EXPIRE', KEYS[1], ARGV[2])
end
return 0
"""


@dataclass(frozen=True)
class StoredRequest:
    meta: dict[str, Any] | None
    result: bytes | None


class ResultStore(ABC):
    @abstractmethod
    async def save(
        self, request_id: str, *, meta: dict[str, Any] | None = None, result: bytes | None = None
    ) -> None:
        """Record the pending marker (`meta`) and/or the framed result of a request."""

    @abstractmethod
    async def attach(self, request_id: str, result: bytes) -> bool:
        """Store the result only if the request is known here already; whether it was."""

    @abstractmethod
    async def get(self, request_id: str) -> StoredRequest | None:
        """What is known about a request; None when it is unknown or expired."""

    async def discard(self, request_id: str) -> None:  # noqa: B027 - optional hook
        """Forget a request that was never published."""


class RedisResultStore(ResultStore):
    def __init__(self, client: Redis, ttl_s: int, prefix: str = "tidegate:gateway:request") -> None:
        self._redis = client
        self._ttl_s = ttl_s
        self._prefix = prefix
        self._attach = client.register_script(_ATTACH)

    def key(self, request_id: str) -> str:
        return f"{self._prefix}:{request_id}"

    async def save(
        self, request_id: str, *, meta: dict[str, Any] | None = None, result: bytes | None = None
    ) -> None:
        fields: dict[str, str | bytes] = {}
        if meta is not None:
            fields["meta"] = json.dumps(meta)
        if result is not None:
            fields["result"] = result
        if not fields:
            return
        key = self.key(request_id)
        try:
            async with self._redis.pipeline(transaction=True) as pipe:
                pipe.hset(key, mapping=fields)
                pipe.expire(key, self._ttl_s)
                await pipe.execute()
        except RedisError as exc:
            raise StoreUnavailableError(f"result store unreachable: {exc}") from exc

    async def attach(self, request_id: str, result: bytes) -> bool:
        try:
            done = await self._attach(keys=[self.key(request_id)], args=[result, self._ttl_s])
        except RedisError as exc:
            raise StoreUnavailableError(f"result store unreachable: {exc}") from exc
        return bool(done)

    async def get(self, request_id: str) -> StoredRequest | None:
        try:
            found: dict[bytes, bytes] = await self._redis.hgetall(self.key(request_id))  # type: ignore[misc]
        except RedisError as exc:
            raise StoreUnavailableError(f"result store unreachable: {exc}") from exc
        if not found:
            return None
        meta = found.get(b"meta")
        return StoredRequest(json.loads(meta) if meta else None, found.get(b"result"))

    async def discard(self, request_id: str) -> None:
        try:
            await self._redis.delete(self.key(request_id))
        except RedisError as exc:
            raise StoreUnavailableError(f"result store unreachable: {exc}") from exc
