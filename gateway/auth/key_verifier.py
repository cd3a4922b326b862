"""Verifying presented API keys fast (`KeyVerifier`): argon2 once per key and replica, the outcome
cached by the key's SHA-256, and revoked keys refused on every replica within `revocation_s`.
The caches, the argon2 slots and the per-address budget: docs/security.md ("API keys").
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError

from tidegate.core.errors import AuthenticationError, OverloadedError
from tidegate.gateway.auth.api_keys import KeyRecord, KeyStore, parse_key
from tidegate.gateway.auth.client_budget import ClientBudget
from tidegate.gateway.auth.identity import Identity

__all__ = ["KeyVerifier"]

_INVALID = "invalid API key"
_ARGON2_AT_ONCE = 2
_BUSY = "too many API keys are being verified; retry shortly"


@dataclass(frozen=True, slots=True)
class _Entry:
    until: float  # monotonic
    identity: Identity | None  # None: refused
    refusal: tuple[str, str] = ("", "")  # (message, reason), raised afresh each time


@dataclass(frozen=True, slots=True)
class _Checked:
    until: float  # monotonic
    secret_hash: str  # the stored hash argon2 accepted the presented key against


_Kept = TypeVar("_Kept", _Entry, _Checked)


class KeyVerifier:
    """`verify(presented)` returns the key's identity or raises `AuthenticationError`; a
    database that cannot be reached raises `LifecycleUnavailableError`, too much verification
    at once `OverloadedError` (neither is cached)."""

    def __init__(
        self,
        store: KeyStore,
        *,
        ttl_s: float = 2.0,
        max_entries: int = 10_000,
        max_refusals: int | None = None,
        argon2_queue: int = 32,
        reads_in_flight: int = 64,
        checked_s: float = 3600.0,
        budget: ClientBudget | None = None,
        hasher: PasswordHasher | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self.ttl_s = ttl_s
        self.max_entries = max_entries
        self.max_refusals = max_entries if max_refusals is None else max_refusals
        self.argon2_queue = argon2_queue
        self.reads_in_flight = reads_in_flight
        self.checked_s = checked_s
        self._budget = budget
        self._hasher = hasher or store.hasher
        self._clock = clock
        self._cache: dict[bytes, _Entry] = {}  # accepted keys
        self._refused: dict[bytes, _Entry] = {}  # refusals: never evict an accepted key
        self._checked: dict[bytes, _Checked] = {}  # what argon2 said, kept past the trust
        self._pending: dict[bytes, asyncio.Future[Identity]] = {}
        self._argon2 = asyncio.Semaphore(_ARGON2_AT_ONCE)
        self._argon2_wanted = 0  # running and waiting
        self._reading = 0
        self.db_reads = 0
        self.argon2_checks = 0

    async def verify(self, presented: str, client: str | None = None) -> Identity:
        """`client`: the caller's address, charged one unit of the budget when no cache answers
        (`RateLimitedError` past it)."""
        digest = hashlib.sha256(presented.encode()).digest()
        now = self._clock()
        entry = self._cache.get(digest)
        if entry is not None and entry.identity is not None and entry.until > now:
            return entry.identity
        refused = self._refused.get(digest)
        if refused is not None and refused.until > now:
            raise AuthenticationError(*refused.refusal)
        pending = self._pending.get(digest)
        if pending is None:
            if self._budget is not None:
                self._budget.take(client)
            pending = asyncio.ensure_future(self._check(digest, presented))
            self._pending[digest] = pending
            pending.add_done_callback(lambda _done: self._pending.pop(digest, None))
        # Shielded: a caller that goes away does not cancel the check the others wait on.
        return await asyncio.shield(pending)

    def forget(self) -> None:
        """Drop every remembered outcome (tests, and an operator's emergency lever)."""
        self._cache.clear()
        self._refused.clear()
        self._checked.clear()

    async def _check(self, digest: bytes, presented: str) -> Identity:
        parsed = parse_key(presented)
        if parsed is None:
            raise self._refuse(digest, "malformed API key")
        key_id, secret = parsed
        read_at, record = await self._read(key_id)
        if record is None:
            raise self._refuse(digest, "unknown API key id")
        self._refuse_unless_active(digest, record)
        # argon2 once per presented key and stored hash: a re-check only reads the row.
        if not self._was_checked(digest, record.secret_hash):
            if not await self._argon2_ok(record, secret):
                raise self._refuse(digest, "wrong API key secret")
            self._remember_check(digest, record.secret_hash)
            if self._clock() - read_at >= self.ttl_s:
                # The check waited its turn past the trust window: what the row said then
                # (not revoked) may no longer hold. Decide on a fresh read, trusted from it.
                verified_hash = record.secret_hash
                read_at, record = await self._read(key_id)
                if record is None:
                    raise self._refuse(digest, "unknown API key id")
                if record.secret_hash != verified_hash:
                    raise self._refuse(digest, "API key hash changed during its check")
                self._refuse_unless_active(digest, record)
        ttl = self.ttl_s
        if record.expires_in_s is not None:
            ttl = min(ttl, record.expires_in_s)
        identity = record.identity()
        self._refused.pop(digest, None)
        self._remember(self._cache, self.max_entries, digest, _Entry(read_at + ttl, identity))
        return identity

    def _refuse_unless_active(self, digest: bytes, record: KeyRecord) -> None:
        state = record.state()
        if state != "active":
            raise self._refuse(digest, f"API key {state}", message=f"the API key is {state}")

    def _was_checked(self, digest: bytes, secret_hash: str) -> bool:
        """Whether argon2 accepted this presented key against this stored hash, not too long
        ago (a key whose hash changed, or whose check expired, is checked again)."""
        checked = self._checked.get(digest)
        if checked is None or checked.secret_hash != secret_hash or checked.until <= self._clock():
            return False
        # Used again: it moves to the back, away from eviction.
        del self._checked[digest]
        self._checked[digest] = checked
        return True

    def _remember_check(self, digest: bytes, secret_hash: str) -> None:
        checked = _Checked(self._clock() + self.checked_s, secret_hash)
        self._remember(self._checked, self.max_entries, digest, checked)

    async def _read(self, key_id: str) -> tuple[float, KeyRecord | None]:
        """The key's row, and the monotonic time just before it was read (what its trust is
        counted from). Refuses to queue more reads than `reads_in_flight` on the small pool."""
        if self._reading >= self.reads_in_flight:
            raise OverloadedError(_BUSY)
        self._reading += 1
        try:
            read_at = self._clock()
            self.db_reads += 1
            return read_at, await self.store.get(key_id)
        finally:
            self._reading -= 1

    async def _argon2_ok(self, record: KeyRecord, secret: str) -> bool:
        if self._argon2_wanted >= _ARGON2_AT_ONCE + self.argon2_queue:
            raise OverloadedError(_BUSY)
        self._argon2_wanted += 1
        try:
            async with self._argon2:
                self.argon2_checks += 1
                try:
                    return await asyncio.to_thread(self._hasher.verify, record.secret_hash, secret)
                except (VerificationError, InvalidHashError):
                    return False
        finally:
            self._argon2_wanted -= 1

    def _refuse(
        self, digest: bytes, reason: str, *, message: str = _INVALID
    ) -> AuthenticationError:
        entry = _Entry(self._clock() + self.ttl_s, None, (message, reason))
        self._cache.pop(digest, None)
        self._remember(self._refused, self.max_refusals, digest, entry)
        return AuthenticationError(message, reason)

    def _remember(self, cache: dict[bytes, _Kept], limit: int, digest: bytes, entry: _Kept) -> None:
        """Insert, dropping the oldest remembered first: stale ones at the front, then as many
        as the bound needs (amortized O(1): a flood never walks the whole cache)."""
        cache.pop(digest, None)
        now = self._clock()
        while cache:
            oldest = next(iter(cache))
            if len(cache) < limit and cache[oldest].until > now:
                break
            del cache[oldest]
        if limit > 0:
            cache[digest] = entry
