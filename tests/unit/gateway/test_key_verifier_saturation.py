"""argon2 cannot be saturated from outside (docs/security.md): a flood of wrong secrets for a
live key id is refused per address before any check, revoked keys cost no argon2, and a key
that sat idle or was pushed out of the trust cache is trusted again without argon2."""

from __future__ import annotations

import asyncio

import pytest

from tests.unit.auth_fixtures import MemoryKeyStore
from tests.unit.gateway.key_support import Clock, GatedHasher, issue
from tidegate.core.errors import AuthenticationError, RateLimitedError
from tidegate.gateway.auth.api_keys import parse_key
from tidegate.gateway.auth.client_budget import ClientBudget
from tidegate.gateway.auth.key_verifier import KeyVerifier
from tidegate.gateway.problems import error_problem


def wrong_secrets(key: str, count: int) -> list[str]:
    key_id, secret = parse_key(key) or ("", "")
    return [f"tg_{key_id}_{i:0{len(secret)}d}" for i in range(count)]


async def test_one_address_cannot_fill_the_argon2_slots_for_everyone() -> None:
    store, clock, hasher = MemoryKeyStore(), Clock(), GatedHasher()
    budget = ClientBudget(5, "key verifications")
    verifier = KeyVerifier(store, ttl_s=2.0, clock=clock, hasher=hasher, budget=budget)
    victim, honest = await issue(store), await issue(store)
    # Mallory floods the victim's (public) key id with made-up secrets, from one address.
    flood = [
        asyncio.ensure_future(verifier.verify(bogus, "203.0.113.7"))
        for bogus in wrong_secrets(victim, 40)
    ]
    await asyncio.sleep(0.05)
    refused = [f for f in flood if f.done() and isinstance(f.exception(), RateLimitedError)]
    assert len(refused) == 35, "past 5 uncached verifications a second, refused unchecked"
    answer = error_problem(refused[0].exception(), instance="/v2")  # type: ignore[arg-type]
    assert answer.status_code == 429
    assert int(answer.headers["retry-after"]) >= 1
    # Only the admitted five wait for argon2; another caller's new key queues behind at most
    # those, not behind forty.
    hasher.release()
    assert (await verifier.verify(honest, "198.51.100.2")).subject.startswith("key:")
    results = await asyncio.gather(*flood, return_exceptions=True)
    assert sum(isinstance(r, AuthenticationError) for r in results) == 5
    assert verifier.argon2_checks == 6


async def test_cached_keys_are_never_charged() -> None:
    store, clock = MemoryKeyStore(), Clock()
    verifier = KeyVerifier(store, ttl_s=2.0, clock=clock, budget=ClientBudget(1, "checks"))
    key = await issue(store)
    await verifier.verify(key, "198.51.100.2")
    for _ in range(50):
        await verifier.verify(key, "198.51.100.2")  # answered by the cache: no budget spent


async def test_a_revoked_key_is_refused_without_argon2() -> None:
    store, clock = MemoryKeyStore(), Clock()
    verifier = KeyVerifier(store, ttl_s=2.0, clock=clock)
    key = await issue(store)
    key_id, _ = parse_key(key) or ("", "")
    await store.revoke(key_id, revoked_by="local:t")
    for bogus in wrong_secrets(key, 3):
        with pytest.raises(AuthenticationError, match="revoked"):
            await verifier.verify(bogus)
    assert verifier.argon2_checks == 0


async def test_an_idle_key_pushed_out_of_the_cache_needs_no_argon2_again() -> None:
    store, clock = MemoryKeyStore(), Clock()
    verifier = KeyVerifier(store, ttl_s=2.0, clock=clock)
    idle = await issue(store)
    await verifier.verify(idle)
    clock.now += 30  # idle well past its trust
    for _ in range(3):  # others are verified meanwhile: the idle key's stale trust is dropped
        await verifier.verify(await issue(store))
    checks = verifier.argon2_checks
    reads = store.reads
    assert (await verifier.verify(idle)).subject.startswith("key:")
    assert verifier.argon2_checks == checks, "trusted again after a row read only"
    assert store.reads == reads + 1


async def test_a_changed_hash_or_an_old_check_is_checked_again() -> None:
    store, clock = MemoryKeyStore(), Clock()
    verifier = KeyVerifier(store, ttl_s=2.0, clock=clock, checked_s=60.0)
    key = await issue(store)
    await verifier.verify(key)
    clock.now += 61  # the check itself has expired
    await verifier.verify(key)
    assert verifier.argon2_checks == 2
