"""API keys: their format, and the verifier's cache, which is what makes them cheap per call and
revocable within seconds (tidegate.gateway.api_keys, tidegate.gateway.key_verifier)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest

from tests.unit.auth_fixtures import MemoryKeyStore
from tidegate.core.errors import AuthenticationError
from tidegate.gateway.api_keys import grants_from_json, grants_to_json, new_key, parse_key
from tidegate.gateway.identity import Grant, Permission
from tidegate.gateway.key_verifier import KeyVerifier


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def store() -> MemoryKeyStore:
    return MemoryKeyStore()


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def verifier(store: MemoryKeyStore, clock: Clock) -> KeyVerifier:
    return KeyVerifier(store, ttl_s=2.0, clock=clock)


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


def test_a_key_is_tg_id_secret_and_parses_back() -> None:
    key_id, key = new_key()
    value = key.get_secret_value()
    assert value.startswith(f"tg_{key_id}_")
    assert parse_key(value) == (key_id, value.split("_", 2)[2])
    assert len(value.split("_", 2)[2]) >= 43  # 256 random bits
    assert new_key()[1].get_secret_value() != value
    for bad in ("", "tg_", "tg_short_x", f"tg_{key_id}", "Bearer " + value, value + " "):
        assert parse_key(bad) is None
    assert str(key) == "**********"  # never printed by accident


def test_grants_round_trip_through_json() -> None:
    grants = (Grant("infer"), Grant("deploy", frozenset({"fraud", "minilm"})))
    assert grants_from_json(grants_to_json(grants)) == grants


async def test_a_valid_key_is_its_identity_and_is_verified_once(
    store: MemoryKeyStore, verifier: KeyVerifier
) -> None:
    key = await issue(store, Grant("deploy", frozenset({"fraud"})), rate_per_s=5.0)
    identity = await verifier.verify(key)
    assert identity.subject.startswith("key:")
    assert identity.kind == "api-key"
    assert identity.rate_per_s == 5.0
    assert identity.allows(Permission.DEPLOY, "fraud")
    assert not identity.allows(Permission.DEPLOY, "minilm")
    for _ in range(100):
        assert await verifier.verify(key) is identity
    # The hot path: no database read and no argon2 after the first call.
    assert (store.reads, verifier.argon2_checks) == (1, 1)


async def test_after_the_ttl_the_row_is_read_again_without_argon2(
    store: MemoryKeyStore, verifier: KeyVerifier, clock: Clock
) -> None:
    key = await issue(store)
    await verifier.verify(key)
    clock.now += 2.01
    await verifier.verify(key)
    assert (store.reads, verifier.argon2_checks) == (2, 1)


async def test_a_revoked_key_is_refused_at_the_next_check(
    store: MemoryKeyStore, verifier: KeyVerifier, clock: Clock
) -> None:
    key = await issue(store)
    identity = await verifier.verify(key)
    await store.revoke(identity.subject.removeprefix("key:"), revoked_by="local:t")
    await verifier.verify(key)  # still remembered: within the ttl
    clock.now += 2.01
    with pytest.raises(AuthenticationError, match="revoked") as refused:
        await verifier.verify(key)
    assert refused.value.reason == "API key revoked"
    with pytest.raises(AuthenticationError, match="revoked"):
        await verifier.verify(key)  # the refusal is remembered too


async def test_an_expired_key_is_refused_and_never_trusted_past_its_expiry(
    store: MemoryKeyStore, clock: Clock
) -> None:
    wall = datetime.now(UTC)
    verifier = KeyVerifier(store, ttl_s=2.0, clock=clock, wall=lambda: wall)
    key = await issue(store, expires_at=wall + timedelta(seconds=0.5))
    await verifier.verify(key)
    clock.now += 0.6  # past the expiry, well within the ttl
    wall += timedelta(seconds=0.6)
    with pytest.raises(AuthenticationError, match="expired"):
        await verifier.verify(key)
    old = await issue(store, expires_at=wall - timedelta(seconds=1))
    with pytest.raises(AuthenticationError, match="expired"):
        await verifier.verify(old)


async def test_wrong_secrets_unknown_ids_and_garbage_are_refused_cheaply(
    store: MemoryKeyStore, verifier: KeyVerifier
) -> None:
    key = await issue(store)
    key_id, secret = parse_key(key) or ("", "")
    wrong = f"tg_{key_id}_{'x' * len(secret)}"
    for _ in range(3):
        with pytest.raises(AuthenticationError, match="invalid API key") as refused:
            await verifier.verify(wrong)
    assert refused.value.reason == "wrong API key secret"
    assert verifier.argon2_checks == 1  # the refusal is remembered: one argon2 in all
    with pytest.raises(AuthenticationError) as unknown:
        await verifier.verify(f"tg_{'0' * 16}_{secret}")
    assert unknown.value.reason == "unknown API key id"
    reads = store.reads
    with pytest.raises(AuthenticationError) as garbage:
        await verifier.verify("tg_not-a-key")
    assert garbage.value.reason == "malformed API key"
    assert (store.reads, verifier.argon2_checks) == (reads, 1)
    # The caller is never told which part was wrong, nor shown what it sent.
    assert str(unknown.value) == str(refused.value) == "invalid API key"
    assert secret not in str(refused.value)


async def test_concurrent_calls_with_a_new_key_share_one_check(
    store: MemoryKeyStore, verifier: KeyVerifier
) -> None:
    key = await issue(store)
    identities = await asyncio.gather(*(verifier.verify(key) for _ in range(20)))
    assert len({id(i) for i in identities}) == 1
    assert (store.reads, verifier.argon2_checks) == (1, 1)


async def test_the_cache_is_bounded(store: MemoryKeyStore, clock: Clock) -> None:
    verifier = KeyVerifier(store, ttl_s=2.0, max_entries=3, clock=clock)
    keys = [await issue(store) for _ in range(5)]
    for key in keys:
        await verifier.verify(key)
    assert len(verifier._cache) == 3
    await verifier.verify(keys[-1])  # the newest is still remembered
    assert verifier.argon2_checks == 5
