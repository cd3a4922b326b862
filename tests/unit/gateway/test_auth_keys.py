"""API keys: their format, and the verifier's cache, which is what makes them cheap per call and
revocable within seconds (tidegate.gateway.auth.api_keys, tidegate.gateway.auth.key_verifier)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest

from tests.unit.auth_fixtures import MemoryKeyStore
from tests.unit.gateway.key_support import Clock, GatedHasher, issue
from tidegate.core.errors import AuthenticationError, OverloadedError
from tidegate.gateway.auth.api_keys import grants_from_json, grants_to_json, new_key, parse_key
from tidegate.gateway.auth.identity import Grant, Permission
from tidegate.gateway.auth.key_verifier import KeyVerifier
from tidegate.gateway.problems import error_problem


@pytest.fixture
def store() -> MemoryKeyStore:
    return MemoryKeyStore()


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def verifier(store: MemoryKeyStore, clock: Clock) -> KeyVerifier:
    return KeyVerifier(store, ttl_s=2.0, clock=clock)


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
    # A scope over no model stays one: never read back as every model.
    empty = (Grant("infer", frozenset()),)
    assert grants_from_json(grants_to_json(empty)) == empty
    assert grants_from_json('[{"role": "infer", "models": []}]')[0].models == frozenset()


async def test_a_key_scoped_to_no_model_is_refused(store: MemoryKeyStore) -> None:
    with pytest.raises(ValueError, match="names no model"):
        await store.create("t", (Grant("infer", frozenset()),), created_by="local:t")
    with pytest.raises(ValueError, match="at least one role"):
        await store.create("t", (), created_by="local:t")
    assert store.rows == {}


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
    store: MemoryKeyStore, verifier: KeyVerifier, clock: Clock
) -> None:
    db = datetime.now(UTC)
    store.db_now = lambda: db
    key = await issue(store, expires_at=db + timedelta(seconds=0.5))
    await verifier.verify(key)
    clock.now += 0.6  # past the expiry, well within the ttl
    db += timedelta(seconds=0.6)
    with pytest.raises(AuthenticationError, match="expired"):
        await verifier.verify(key)
    old = await issue(store, expires_at=db - timedelta(seconds=1))
    with pytest.raises(AuthenticationError, match="expired"):
        await verifier.verify(old)


async def test_expiry_goes_by_the_database_clock_not_the_gateways(
    store: MemoryKeyStore, verifier: KeyVerifier, clock: Clock
) -> None:
    # The database runs an hour behind this machine: a key expired "now" by the database is
    # refused although this machine's clock would call it an hour from expiring.
    db = [datetime.now(UTC) - timedelta(hours=1)]
    store.db_now = lambda: db[0]
    key = await issue(store)
    key_id = (parse_key(key) or ("", ""))[0]
    await verifier.verify(key)
    db[0] += timedelta(seconds=1)
    record = await store.expire(key_id)  # `tidegate auth keys expire --at now`
    assert record is not None
    assert record.state() == "expired"
    clock.now += 2.01
    with pytest.raises(AuthenticationError, match="expired"):
        await verifier.verify(key)
    later = await issue(store)
    assert (await store.expire((parse_key(later) or ("", ""))[0], timedelta(hours=2))) is not None
    await verifier.verify(later)  # two hours after the database's now: active


async def test_a_key_revoked_while_its_check_waits_for_argon2_is_refused(
    store: MemoryKeyStore, clock: Clock
) -> None:
    hasher = GatedHasher()
    verifier = KeyVerifier(store, ttl_s=2.0, hasher=hasher, clock=clock)
    key = await issue(store)
    key_id, secret = parse_key(key) or ("", "")
    # Two bogus secrets of the id hold both argon2 slots; the real key queues behind them.
    busy = [asyncio.ensure_future(verifier.verify(f"tg_{key_id}_{c * len(secret)}")) for c in "xy"]
    waiting = asyncio.ensure_future(verifier.verify(key))
    await asyncio.sleep(0.05)
    assert not waiting.done()
    clock.now += 20.0  # 20 s behind argon2 work
    await store.revoke(key_id, revoked_by="local:t")
    hasher.release()
    with pytest.raises(AuthenticationError, match="revoked"):
        await waiting
    for bogus in busy:
        with pytest.raises(AuthenticationError, match="invalid API key"):
            await bogus
    assert store.reads == 4  # each read once, the real key again after its check


async def test_a_check_that_waited_briefly_is_trusted_from_its_read_only(
    store: MemoryKeyStore, clock: Clock
) -> None:
    hasher = GatedHasher()
    verifier = KeyVerifier(store, ttl_s=2.0, hasher=hasher, clock=clock)
    key = await issue(store)
    checking = asyncio.ensure_future(verifier.verify(key))
    await asyncio.sleep(0.05)
    clock.now += 1.5  # within the ttl: the row read before the check still counts
    hasher.release()
    await checking
    assert store.reads == 1
    clock.now += 0.51  # 2.01 s after that read: trusted no longer
    await verifier.verify(key)
    assert store.reads == 2


async def test_argon2_waits_are_capped_and_beyond_the_cap_answer_503(
    store: MemoryKeyStore, clock: Clock
) -> None:
    hasher = GatedHasher()
    verifier = KeyVerifier(store, ttl_s=2.0, hasher=hasher, clock=clock, argon2_queue=3)
    key = await issue(store)
    key_id, secret = parse_key(key) or ("", "")
    bogus = [f"tg_{key_id}_{c * len(secret)}" for c in "abcde"]  # 2 running + 3 waiting
    held = [asyncio.ensure_future(verifier.verify(b)) for b in bogus]
    await asyncio.sleep(0.05)
    with pytest.raises(OverloadedError) as shed:
        await verifier.verify(f"tg_{key_id}_{'f' * len(secret)}")
    answer = error_problem(shed.value, instance="/v2")
    assert answer.status_code == 503
    assert int(answer.headers["retry-after"]) >= 1
    assert verifier.argon2_checks == 2
    hasher.release()
    results = await asyncio.gather(*held, return_exceptions=True)
    assert all(isinstance(r, AuthenticationError) for r in results)
    # Shedding is not remembered: once the queue drains the same call is checked.
    with pytest.raises(AuthenticationError, match="invalid API key"):
        await verifier.verify(f"tg_{key_id}_{'f' * len(secret)}")
    assert (await verifier.verify(key)).subject == f"key:{key_id}"


async def test_row_reads_in_flight_are_capped(store: MemoryKeyStore, clock: Clock) -> None:
    verifier = KeyVerifier(store, ttl_s=2.0, clock=clock, reads_in_flight=2)
    gate = asyncio.Event()
    plain_get = store.get

    async def slow_get(key_id: str) -> object:
        await gate.wait()
        return await plain_get(key_id)

    store.get = slow_get  # type: ignore[method-assign,assignment]
    held = [asyncio.ensure_future(verifier.verify(f"tg_{c * 16}_{'s' * 43}")) for c in "ab"]
    await asyncio.sleep(0)
    with pytest.raises(OverloadedError):
        await verifier.verify(f"tg_{'c' * 16}_{'s' * 43}")
    gate.set()
    for call in held:
        with pytest.raises(AuthenticationError):
            await call


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


async def test_bogus_keys_never_evict_an_accepted_key(store: MemoryKeyStore, clock: Clock) -> None:
    verifier = KeyVerifier(store, ttl_s=2.0, max_entries=3, max_refusals=50, clock=clock)
    key = await issue(store)
    key_id, secret = parse_key(key) or ("", "")
    identity = await verifier.verify(key)
    for n in range(500):
        with pytest.raises(AuthenticationError):
            await verifier.verify(f"tg_{n:016x}_{secret}")  # unknown ids
    for n in range(20):
        with pytest.raises(AuthenticationError):
            await verifier.verify(f"tg_{key_id}_{n:043d}")  # wrong secrets of the real id
    assert len(verifier._refused) == 50  # bounded
    reads, checks = store.reads, verifier.argon2_checks
    assert await verifier.verify(key) is identity  # still remembered: no read, no argon2
    assert (store.reads, verifier.argon2_checks) == (reads, checks)
