"""A Redis lease on one partition of the replies topic (`PartitionLease`), so each gateway replica
owns its own; the holder also records how far it read the partition, for whoever holds it next.
The lease: docs/decisions/003-gateway-replies.md ("Decision"); a restarted replica taking its
partition back: docs/gateway-hardening.md ("A gateway process that dies is started again").
"""

from __future__ import annotations

import zlib

from redis.asyncio import Redis

__all__ = ["LEASE_PREFIX", "PartitionLease", "lease_key"]

LEASE_PREFIX = "tidegate:gateway:reply-lease"
# How long a recorded position is kept: as long as a result is worth storing for a fetch by id.
POSITION_TTL_S = 3600

# Extend if ours; re-take if it expired unclaimed; otherwise it is lost (0).
_RENEW = """
local owner = redis.call('GET', KEYS[1])
if owner == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
if not owner then
  if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return 1 end
end
return 0
"""
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


def lease_key(topic: str, partition: int, prefix: str = LEASE_PREFIX) -> str:
    return f"{prefix}:{topic}:{partition}"


class PartitionLease:
    """Claims, renews and releases one partition of `topic` for `owner`."""

    def __init__(
        self,
        client: Redis,
        *,
        topic: str,
        owner: str,
        lease_s: float,
        prefix: str = LEASE_PREFIX,
    ) -> None:
        self._redis = client
        self._topic = topic
        self._owner = owner
        self._lease_ms = int(lease_s * 1000)
        self._prefix = prefix
        self.partition: int | None = None
        self.held = False

    def key(self, partition: int) -> str:
        return lease_key(self._topic, partition, self._prefix)

    async def acquire(self, partitions: int) -> int | None:
        """Claim the first partition that is free or still ours, starting from one derived from
        the owner's name, so that replicas starting together rarely race for the same key and a
        restarted one finds its own first."""
        start = zlib.crc32(self._owner.encode()) % partitions
        for step in range(partitions):
            partition = (start + step) % partitions
            claimed = await self._redis.eval(  # type: ignore[misc]
                _RENEW, 1, self.key(partition), self._owner, str(self._lease_ms)
            )
            if claimed:
                self.partition, self.held = partition, True
                return partition
        self.held = False
        return None

    async def renew(self) -> bool:
        if self.partition is None:
            self.held = False
            return False
        kept = await self._redis.eval(  # type: ignore[misc]
            _RENEW, 1, self.key(self.partition), self._owner, str(self._lease_ms)
        )
        self.held = bool(kept)
        return self.held

    async def remember(self, offset: int) -> None:
        """Record that the held partition was read up to `offset` (the next one to read)."""
        if self.partition is not None and self.held:
            await self._redis.set(self.position_key(self.partition), offset, ex=POSITION_TTL_S)

    async def position(self, partition: int) -> int | None:
        """The offset up to which the last holder read `partition`, if recorded."""
        value = await self._redis.get(self.position_key(partition))
        try:
            return int(value) if value is not None else None
        except ValueError:
            return None

    def position_key(self, partition: int) -> str:
        return f"{self.key(partition)}:position"

    async def owner_of(self, partition: int) -> str | None:
        value = await self._redis.get(self.key(partition))
        return value.decode() if isinstance(value, bytes) else value

    async def release(self) -> None:
        if self.partition is not None:
            await self._redis.eval(  # type: ignore[misc]
                _RELEASE, 1, self.key(self.partition), self._owner
            )
        self.held = False
