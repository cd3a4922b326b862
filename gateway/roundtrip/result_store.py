"""Where results wait to be fetched by id (`RedisResultStore`): one Redis hash per request, the
pending marker and the result later, each bound to its owner and its submission's nonce.
The layout: docs/decisions/003-gateway-replies.md ("Results by id, asynchronous calls,
timeouts"); claims and owners: docs/security.md ("Results by id belong to their caller").
"""

from __future__ import annotations

import json
import math
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import RedisError

from tidegate.gateway.http_errors import (
    RequestIdTakenError,
    RequestInFlightError,
    StoreUnavailableError,
)

__all__ = ["RedisResultStore", "ResultStore", "StoredRequest"]

# The result ARGV[1] of a request the store already knows, has no result for yet, and whose
# submission's nonce is ARGV[3] (or was stored without one); else nothing.
_ATTACH = """
if redis.call('EXISTS', KEYS[1]) == 0 or redis.call('HEXISTS', KEYS[1], 'result') == 1 then
  return 0
end
local nonce = redis.call('HGET', KEYS[1], 'nonce')
if nonce and nonce ~= ARGV[3] then
  return 0
end
redis.call('HSET', KEYS[1], 'result', ARGV[1])
return redis.call('EXPIRE', KEYS[1], ARGV[2])
"""

# Write the fields ARGV[5..] (name, value pairs) of a request owned by ARGV[2], submitted with
# nonce ARGV[3], refreshing the TTL ARGV[1]. ARGV[4] is `new` for a submission that takes the
# id, `same` for a write of the submission that holds it (a marker refreshed, its result).
# 1: written; 0: the request is another owner's, or (`same`) another submission's; 2 (`new`):
# the owner's earlier submission of this id has no result yet.
_CLAIM = """
local owner = redis.call('HGET', KEYS[1], 'owner')
if owner and owner ~= ARGV[2] then
  return 0
end
local nonce = redis.call('HGET', KEYS[1], 'nonce')
if nonce and nonce ~= ARGV[3] then
  if ARGV[4] ~= 'new' then
    return 0
  end
  if redis.call('HEXISTS', KEYS[1], 'result') == 0 then
    return 2
  end
  redis.call('HDEL', KEYS[1], 'result', 'meta')
end
redis.call('HSET', KEYS[1], 'owner', ARGV[2], 'nonce', ARGV[3], unpack(ARGV, 5))
redis.call('EXPIRE', KEYS[1], ARGV[1])
return 1
"""

# Delete a synchronous call's reservation (no marker written) if it is still submission ARGV[1]'s.
_RELEASE = """
if redis.call('HGET', KEYS[1], 'nonce') ~= ARGV[1] then
  return 0
end
if redis.call('HEXISTS', KEYS[1], 'meta') == 1 then
  return 0
end
return redis.call('DEL', KEYS[1])
"""


@dataclass(frozen=True)
class StoredRequest:
    meta: dict[str, Any] | None
    result: bytes | None
    owner: str | None = None
    """The subject that made the request; None for one stored without (before owners were)."""
    nonce: str | None = None
    """The nonce of the submission that holds the id; None for one stored before nonces were."""


class ResultStore(ABC):
    @abstractmethod
    async def save(
        self,
        request_id: str,
        *,
        meta: dict[str, Any] | None = None,
        result: bytes | None = None,
        owner: str | None = None,
        nonce: str | None = None,
        claim: bool = False,
        ttl_s: float | None = None,
    ) -> None:
        """Record the pending marker (`meta`) and/or the framed result of a request, as `owner`'s
        submission `nonce`, for `ttl_s` (default: the store's TTL).

        `claim`: this submission takes the id (it may write no field: a reservation). Raises
        `RequestIdTakenError` (writing nothing) when the request is another owner's, or
        `RequestInFlightError` when the owner's earlier submission of it has no result yet.
        Otherwise the write is the holding submission's: `RequestIdTakenError` when the id is
        another owner's or another submission's."""

    @abstractmethod
    async def attach(self, request_id: str, result: bytes, nonce: str | None = None) -> bool:
        """Store the result only if the request is known here already, has none yet, and was
        submitted with `nonce` (or before nonces were); whether it was stored."""

    @abstractmethod
    async def get(self, request_id: str) -> StoredRequest | None:
        """What is known about a request; None when it is unknown or expired."""

    async def discard(self, request_id: str) -> None:  # noqa: B027 - optional hook
        """Forget a request that was never published."""

    @abstractmethod
    async def release(self, request_id: str, nonce: str) -> None:
        """Drop submission `nonce`'s reservation of an id (a `claim` without a marker) once its
        synchronous call has ended without promising a later fetch."""


class RedisResultStore(ResultStore):
    def __init__(self, client: Redis, ttl_s: int, prefix: str = "tidegate:gateway:request") -> None:
        self._redis = client
        self._ttl_s = ttl_s
        self._prefix = prefix
        self._attach = client.register_script(_ATTACH)
        self._claim = client.register_script(_CLAIM)
        self._release = client.register_script(_RELEASE)

    def key(self, request_id: str) -> str:
        return f"{self._prefix}:{request_id}"

    async def save(
        self,
        request_id: str,
        *,
        meta: dict[str, Any] | None = None,
        result: bytes | None = None,
        owner: str | None = None,
        nonce: str | None = None,
        claim: bool = False,
        ttl_s: float | None = None,
    ) -> None:
        fields: dict[str, str | bytes] = {}
        if meta is not None:
            fields["meta"] = json.dumps(meta)
        if result is not None:
            fields["result"] = result
        if not fields and not claim:
            return
        ttl = max(1, math.ceil(ttl_s)) if ttl_s is not None else self._ttl_s
        args: list[str | bytes | int] = [
            ttl,
            owner or "",
            nonce or "",
            "new" if claim else "same",
            *(v for pair in fields.items() for v in pair),
        ]
        try:
            written = await self._claim(keys=[self.key(request_id)], args=args)
        except RedisError as exc:
            raise StoreUnavailableError(f"result store unreachable: {exc}") from exc
        if written == 2:
            raise RequestInFlightError(request_id)
        if not written:
            raise RequestIdTakenError(request_id)

    async def attach(self, request_id: str, result: bytes, nonce: str | None = None) -> bool:
        args: list[bytes | str | int] = [result, self._ttl_s, nonce or ""]
        try:
            done = await self._attach(keys=[self.key(request_id)], args=args)
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
        return StoredRequest(
            json.loads(meta) if meta else None,
            found.get(b"result"),
            found.get(b"owner", b"").decode() or None,
            found.get(b"nonce", b"").decode() or None,
        )

    async def discard(self, request_id: str) -> None:
        try:
            await self._redis.delete(self.key(request_id))
        except RedisError as exc:
            raise StoreUnavailableError(f"result store unreachable: {exc}") from exc

    async def release(self, request_id: str, nonce: str) -> None:
        try:
            await self._release(keys=[self.key(request_id)], args=[nonce])
        except RedisError as exc:
            raise StoreUnavailableError(f"result store unreachable: {exc}") from exc
