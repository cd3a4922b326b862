"""Verifying presented API keys fast, and refusing revoked ones within seconds everywhere.

argon2 costs tens of milliseconds of CPU by design, far more than a whole inference call on the
gateway. So each replica verifies a key once and remembers the outcome, keyed by the SHA-256 of
the presented key (a fast hash is fine here: it only names a cache entry, and the key itself is
256 random bits, so it cannot be guessed from its digest). A call with a remembered key costs one
hash and one dict lookup; no argon2, no database.

A remembered outcome is trusted for `revocation_s` at most (2 s by default, never past the key's
expiry). Then the next call reads the key's row again; the argon2 check is not repeated while
the stored hash is the one already checked. A revoked or expired key is therefore refused on
every replica within `revocation_s` plus one database read of its revocation, with no pub/sub
to lose messages or to set up: at 2 s a key in use costs each replica one indexed primary-key
read per 2 s, which is nothing next to its traffic.

Refusals are remembered for the same time, so a client retrying a bad key costs no argon2 either,
and concurrent calls with the same key share one check. A key id that does not exist is refused
without argon2; a wrong secret of a real id costs one argon2 check, bounded by a semaphore so a
flood of them cannot take every core.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError

from tidegate.core.errors import AuthenticationError
from tidegate.gateway.api_keys import KeyRecord, KeyStore, parse_key
from tidegate.gateway.identity import Identity

__all__ = ["KeyVerifier"]

_INVALID = "invalid API key"
_ARGON2_AT_ONCE = 2


@dataclass(frozen=True, slots=True)
class _Entry:
    until: float  # monotonic
    identity: Identity | None  # None: refused
    refusal: tuple[str, str] = ("", "")  # (message, reason), raised afresh each time
    secret_hash: str | None = None  # what the presented key was verified against


class KeyVerifier:
    """`verify(presented)` returns the key's identity or raises `AuthenticationError`; a
    database that cannot be reached raises `LifecycleUnavailableError` (nothing is cached)."""

    def __init__(
        self,
        store: KeyStore,
        *,
        ttl_s: float = 2.0,
        max_entries: int = 10_000,
        hasher: PasswordHasher | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.store = store
        self.ttl_s = ttl_s
        self.max_entries = max_entries
        self._hasher = hasher or store.hasher
        self._clock = clock
        self._wall = wall
        self._cache: dict[bytes, _Entry] = {}
        self._pending: dict[bytes, asyncio.Future[Identity]] = {}
        self._argon2 = asyncio.Semaphore(_ARGON2_AT_ONCE)
        self.db_reads = 0
        self.argon2_checks = 0

    async def verify(self, presented: str) -> Identity:
        digest = hashlib.sha256(presented.encode()).digest()
        entry = self._cache.get(digest)
        if entry is not None and entry.until > self._clock():
            if entry.identity is None:
                raise AuthenticationError(*entry.refusal)
            return entry.identity
        pending = self._pending.get(digest)
        if pending is None:
            pending = asyncio.ensure_future(self._check(digest, presented, entry))
            self._pending[digest] = pending
            pending.add_done_callback(lambda _done: self._pending.pop(digest, None))
        # Shielded: a caller that goes away does not cancel the check the others wait on.
        return await asyncio.shield(pending)

    def forget(self) -> None:
        """Drop every remembered outcome (tests, and an operator's emergency lever)."""
        self._cache.clear()

    async def _check(self, digest: bytes, presented: str, prior: _Entry | None) -> Identity:
        parsed = parse_key(presented)
        if parsed is None:
            raise self._refuse(digest, "malformed API key")
        key_id, secret = parsed
        self.db_reads += 1
        record = await self.store.get(key_id)
        if record is None:
            raise self._refuse(digest, "unknown API key id")
        # argon2 once per presented key and stored hash: a re-check only reads the row.
        checked = prior is not None and prior.secret_hash == record.secret_hash
        if not checked and not await self._argon2_ok(record, secret):
            raise self._refuse(digest, "wrong API key secret")
        now = self._wall()
        state = record.state(now)
        if state != "active":
            raise self._refuse(
                digest, f"API key {state}", message=f"the API key is {state}", verified=record
            )
        ttl = self.ttl_s
        if record.expires_at is not None:
            ttl = min(ttl, (record.expires_at - now).total_seconds())
        identity = record.identity()
        entry = _Entry(self._clock() + ttl, identity, secret_hash=record.secret_hash)
        self._remember(digest, entry)
        return identity

    async def _argon2_ok(self, record: KeyRecord, secret: str) -> bool:
        async with self._argon2:
            self.argon2_checks += 1
            try:
                return await asyncio.to_thread(self._hasher.verify, record.secret_hash, secret)
            except (VerificationError, InvalidHashError):
                return False

    def _refuse(
        self,
        digest: bytes,
        reason: str,
        *,
        message: str = _INVALID,
        verified: KeyRecord | None = None,
    ) -> AuthenticationError:
        secret_hash = verified.secret_hash if verified is not None else None
        entry = _Entry(self._clock() + self.ttl_s, None, (message, reason), secret_hash)
        self._remember(digest, entry)
        return AuthenticationError(message, reason)

    def _remember(self, digest: bytes, entry: _Entry) -> None:
        cache = self._cache
        cache.pop(digest, None)
        if len(cache) >= self.max_entries:
            now = self._clock()
            for stale in [d for d, e in cache.items() if e.until <= now]:
                del cache[stale]
            while len(cache) >= self.max_entries:
                del cache[next(iter(cache))]  # the oldest remembered
        cache[digest] = entry
