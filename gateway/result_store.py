"""Where results wait to be fetched by id: a pending marker, the result later.

One Redis hash per request, `tidegate:gateway:request:<id>`, with fields written separately
(so the marker and a fast result can land in either order): `meta`, the JSON the gateway needs
to answer later (the model, which outputs, binary or not), `result`, the InferenceResult exactly
as it came from Kafka (Confluent-framed Avro), and `owner`, the subject of the identity that
made the request. Every write refreshes the TTL.

Request ids can be chosen by callers, so a write that names an `owner` is refused with
`RequestIdTakenError` (409) when the request is another subject's: nobody takes over, or
overwrites, another caller's result by reusing its id. A fetch shows a request only to its owner
(or an unscoped admin, `tidegate.gateway.infer`). `attach`, which knows no owner, only fills in
a result still missing, never replaces one.

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

from tidegate.gateway.http_errors import RequestIdTakenError, StoreUnavailableError

__all__ = ["RedisResultStore", "ResultStore", "StoredRequest"]

# The result of a request the store already knows and has no result for yet; else nothing.
_ATTACH = """
if redis.call('EXISTS', KEYS[1]) == 1 and redis.call('HEXISTS', KEYS[1], 'result') == 0 then
  redis.call('HSET', KEYS[1], 'result', ARGV[1])
  return redis.call('EXPIRE', KEYS[1], ARGV[2])
end
return 0
"""

# Write the fields ARGV[3..] (name, value pairs) of a request owned by ARGV[2], refreshing the
# TTL ARGV[1]: 1, or 0 (nothing written) when the request is another owner's.
_CLAIM = """
local owner = redis.call('HGET', KEYS[1], 'owner')
if owner and owner ~= ARGV[2] then
  return 0
end
redis.call('HSET', KEYS[1], 'owner', ARGV[2], unpack(ARGV, 3))
redis.call('EXPIRE', KEYS[1], ARGV[1])
return 1
"""


@dataclass(frozen=True)
class StoredRequest:
    meta: dict[str, Any] | None
    result: bytes | None
    owner: str | None = None
    """The subject that made the request; None for one stored without (before owners were)."""


class ResultStore(ABC):
    @abstractmethod
    async def save(
        self,
        request_id: str,
        *,
        meta: dict[str, Any] | None = None,
        result: bytes | None = None,
        owner: str | None = None,
    ) -> None:
        """Record the pending marker (`meta`) and/or the framed result of a request. With an
        `owner`, record it too, or raise `RequestIdTakenError` (writing nothing) when the
        request belongs to another owner."""

    @abstractmethod
    async def attach(self, request_id: str, result: bytes) -> bool:
        """Store the result only if the request is known here already and has none yet;
        whether it was stored."""

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
        self._claim = client.register_script(_CLAIM)

    def key(self, request_id: str) -> str:
        return f"{self._prefix}:{request_id}"

    async def save(
        self,
        request_id: str,
        *,
        meta: dict[str, Any] | None = None,
        result: bytes | None = None,
        owner: str | None = None,
    ) -> None:
        fields: dict[str, str | bytes] = {}
        if meta is not None:
            fields["meta"] = json.dumps(meta)
        if result is not None:
            fields["result"] = result
        if not fields:
            return
        key = self.key(request_id)
        if owner is not None:
            args = [self._ttl_s, owner, *(v for pair in fields.items() for v in pair)]
            try:
                written = await self._claim(keys=[key], args=args)
            except RedisError as exc:
                raise StoreUnavailableError(f"result store unreachable: {exc}") from exc
            if not written:
                raise RequestIdTakenError(request_id)
            return
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
        owner = found.get(b"owner")
        return StoredRequest(
            json.loads(meta) if meta else None,
            found.get(b"result"),
            owner.decode() if owner is not None else None,
        )

    async def discard(self, request_id: str) -> None:
        try:
            await self._redis.delete(self.key(request_id))
        except RedisError as exc:
            raise StoreUnavailableError(f"result store unreachable: {exc}") from exc
