"""API keys for the key verifier's tests: issued into the in-memory store, checked behind a
gate or on a clock the test moves."""

from __future__ import annotations

import threading
from datetime import datetime
from typing import Literal

from argon2 import PasswordHasher

from tests.unit.auth_fixtures import FAST_HASHER, MemoryKeyStore
from tidegate.gateway.auth.identity import Grant

__all__ = ["Clock", "GatedHasher", "issue"]


class GatedHasher(PasswordHasher):
    """argon2 that holds every check until `release` (a queue of slow checks, on demand)."""

    def __init__(self) -> None:
        super().__init__(time_cost=1, memory_cost=8, parallelism=1)
        self.gate = threading.Event()

    def verify(self, hash: str | bytes, password: str | bytes) -> Literal[True]:
        self.gate.wait(timeout=10)
        return FAST_HASHER.verify(hash, password)

    def release(self) -> None:
        self.gate.set()


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def issue(
    store: MemoryKeyStore,
    *grants: Grant,
    expires_at: datetime | None = None,
    rate_per_s: float | None = None,
) -> str:
    issued = await store.create(
        "t",
        grants or (Grant("infer"),),
        created_by="local:t",
        expires_at=expires_at,
        rate_per_s=rate_per_s,
    )
    return issued.key.get_secret_value()
