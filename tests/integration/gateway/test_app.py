"""The gateway against the real Kafka, Redis, schema registry and PostgreSQL, with a fake worker.

Each test gets its own requests, results, replies and lifecycle topics (and their subjects), and
runs the gateway with uvicorn in a thread on a free port. Which models are served comes from
lifecycle events appended through `LifecycleLog` (into the test's own database schema), which the
gateway reads from the lifecycle topic (tests/integration/gateway/gateway_fixtures.py).
`FakeWorker` stands in for the worker agents: it reads the requests topic, answers after an
optional `fake_delay_s` request parameter, and publishes each InferenceResult to the results topic
and to the request's `reply_to` partition.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import numpy as np
import pytest
import redis
import redis.asyncio as aioredis
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.integration.fakes import FakeWorker
from tests.integration.gateway.gateway_fixtures import GatewayServer, fraud_body
from tests.integration.registry_clients import registry_clients_made
from tests.support import unique, wait_for
from tidegate.core.settings import (
    KafkaSettings,
    PostgresSettings,
    RedisSettings,
    SchemaRegistrySettings,
    TopicSettings,
)
from tidegate.gateway.auth.auth_settings import AuthSettings
from tidegate.gateway.gateway_services import (
    GatewayConfig,
    GatewayServices,
    ServicesFactory,
    kafka_services,
)
from tidegate.gateway.gateway_settings import GatewaySettings
from tidegate.gateway.http_errors import RequestIdTakenError, RequestInFlightError
from tidegate.gateway.roundtrip.lease import lease_key
from tidegate.gateway.roundtrip.result_store import RedisResultStore, ResultStore, StoredRequest
from tidegate.lifecycle.domain import events as ev
from tidegate.lifecycle.domain.events import NewEvent
from tidegate.lifecycle.eventstore.lifecycle_log import LifecycleLog
from tidegate.lifecycle.lifecycle_settings import LifecycleSettings


@pytest.fixture
def start_gateway(
    kafka_settings: KafkaSettings,
    topics: TopicSettings,
    registry_settings: SchemaRegistrySettings,
    lifecycle: None,
) -> Iterator[Callable[..., GatewayServer]]:
    started: list[GatewayServer] = []

    def start(services: ServicesFactory = kafka_services, **gateway: Any) -> GatewayServer:
        config = GatewayConfig(
            gateway=GatewaySettings(replica_id=unique("replica"), **gateway),
            kafka=kafka_settings,
            topics=topics,
            registry=registry_settings,
            auth=AuthSettings(enabled=False),  # not about authentication (test_auth.py is)
        )
        server = GatewayServer(config, services)
        started.append(server)
        return server.start()

    yield start
    for server in started:
        server.stop()


def poll_result(server: GatewayServer, request_id: str) -> httpx.Response:
    def probe() -> httpx.Response | None:
        resp = server.http.get(f"/v2/requests/{request_id}")
        return resp if resp.status_code != 202 else None

    return wait_for(probe, timeout=20, what=f"the result of {request_id}")


def test_sync_infer_through_kafka(
    start_gateway: Callable[..., GatewayServer], worker: FakeWorker
) -> None:
    gateway = start_gateway()
    resp = gateway.http.post("/v2/models/fraud/infer", json=fraud_body(id=unique("sync")))
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["model_version"] == "1"
    assert body["outputs"][0]["data"] == [6, 3, 22, 7]
    (request,) = worker.seen
    assert request["request_id"] == body["id"]
    assert request["model_version"] is None
    reply_to = gateway.runtime.services.feed.reply_to()
    assert request["reply_to"] == {**(reply_to or {}), "nonce": request["reply_to"]["nonce"]}


def test_a_gateway_process_makes_one_schema_registry_client(
    start_gateway: Callable[..., GatewayServer],
    worker: FakeWorker,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Its reply decoder, request publisher, lifecycle feed, breaker states and audit trail share
    one: each client costs 40 ms of CPU to make, in every gateway process at every start."""
    made = registry_clients_made(monkeypatch)
    gateway = start_gateway()
    resp = gateway.http.post("/v2/models/fraud/infer", json=fraud_body(id=unique("one-client")))
    assert resp.status_code == 200, resp.text
    assert gateway.runtime.services.health is not None
    assert len(made) == 1


class CountingStore(ResultStore):
    """The real Redis store, each call counted."""

    def __init__(self, store: ResultStore) -> None:
        self.store = store
        self.calls: list[tuple[str, str]] = []

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
        reserve = claim and meta is None and result is None
        self.calls.append(("reserve" if reserve else "save", request_id))
        await self.store.save(
            request_id,
            meta=meta,
            result=result,
            owner=owner,
            nonce=nonce,
            claim=claim,
            ttl_s=ttl_s,
        )

    async def attach(self, request_id: str, result: bytes, nonce: str | None = None) -> bool:
        self.calls.append(("attach", request_id))
        return await self.store.attach(request_id, result, nonce)

    async def get(self, request_id: str) -> StoredRequest | None:
        self.calls.append(("get", request_id))
        return await self.store.get(request_id)

    async def discard(self, request_id: str) -> None:
        self.calls.append(("discard", request_id))
        await self.store.discard(request_id)

    async def release(self, request_id: str, nonce: str) -> None:
        self.calls.append(("release", request_id))
        await self.store.release(request_id, nonce)


def test_sync_calls_answered_in_time_make_no_redis_call(
    start_gateway: Callable[..., GatewayServer], worker: FakeWorker
) -> None:
    counted: list[CountingStore] = []

    def services(config: GatewayConfig) -> GatewayServices:
        real = kafka_services(config)
        counted.append(CountingStore(real.store))
        real.store = counted[0]
        return real

    gateway = start_gateway(services)
    for _ in range(5):
        resp = gateway.http.post("/v2/models/fraud/infer", json=fraud_body())
        assert resp.status_code == 200, resp.text
    assert counted[0].calls == []
    # An id the caller chose: reserved for the wait, released once answered, nothing else.
    chosen = unique("fast")
    resp = gateway.http.post("/v2/models/fraud/infer", json=fraud_body(id=chosen))
    assert resp.status_code == 200, resp.text
    assert counted[0].calls == [("reserve", chosen), ("release", chosen)]
    counted[0].calls.clear()

    request_id = unique("slow")
    resp = gateway.http.post(
        "/v2/models/fraud/infer",
        json=fraud_body(id=request_id, parameters={"fake_delay_s": 1.0}),
        headers={"Request-Timeout": "0.2"},
    )
    assert resp.status_code == 504, resp.text
    late = poll_result(gateway, request_id)
    assert late.status_code == 200, late.text
    writes = [call for call in counted[0].calls if call[0] not in ("get", "reserve")]
    assert writes == [("save", request_id), ("save", request_id)], "the marker, then the result"


def test_tritonclient_unmodified(
    start_gateway: Callable[..., GatewayServer], worker: FakeWorker
) -> None:
    gateway = start_gateway()
    client = httpclient.InferenceServerClient(url=f"127.0.0.1:{gateway.port}")
    try:
        assert client.is_server_live()
        assert client.is_server_ready()
        assert client.is_model_ready("fraud")
        assert client.get_model_metadata("fraud")["platform"] == "onnxruntime_onnx"

        features = np.arange(8, dtype=np.float32).reshape(2, 4)
        fp32 = httpclient.InferInput("features", [2, 4], "FP32")
        fp32.set_data_from_numpy(features)  # binary_data=True by default
        result = client.infer("fraud", [fp32], model_version="2", request_id=unique("triton"))
        np.testing.assert_array_equal(result.as_numpy("probabilities"), [[6, 3], [22, 7]])
        assert result.get_response()["model_version"] == "2"

        words = np.array([b"kafka", "ströme".encode()], dtype=object)
        text = httpclient.InferInput("text", [2], "BYTES")
        text.set_data_from_numpy(words)
        echoed = client.infer("echo", [text]).as_numpy("echo")
        assert list(echoed) == [b"KAFKA", "STRöME".encode()]

        json_out = client.infer(
            "echo", [text], outputs=[httpclient.InferRequestedOutput("echo", binary_data=False)]
        )
        assert "data" in json_out.get_output("echo"), "asked for JSON, not binary"
        assert list(json_out.as_numpy("echo")) == ["KAFKA", "STRöME"]

        bad = httpclient.InferInput("features", [2, 3], "FP32")
        bad.set_data_from_numpy(np.zeros((2, 3), dtype=np.float32))
        with pytest.raises(InferenceServerException, match="features") as exc:
            client.infer("fraud", [bad])
        assert exc.value.status() == "400"
    finally:
        client.close()


def test_timeout_then_result_by_id(
    start_gateway: Callable[..., GatewayServer], worker: FakeWorker
) -> None:
    gateway = start_gateway()
    request_id = unique("slow")
    resp = gateway.http.post(
        "/v2/models/fraud/infer",
        json=fraud_body(id=request_id, parameters={"fake_delay_s": 1.5}),
        headers={"Request-Timeout": "0.3"},
    )
    assert resp.status_code == 504, resp.text
    assert resp.json()["request_id"] == request_id
    assert resp.headers["location"] == f"/v2/requests/{request_id}"
    late = poll_result(gateway, request_id)
    assert late.status_code == 200, late.text
    assert late.json()["outputs"][0]["data"] == [6, 3, 22, 7]


def test_async_flow(start_gateway: Callable[..., GatewayServer], worker: FakeWorker) -> None:
    gateway = start_gateway()
    resp = gateway.http.post(
        "/v2/models/fraud/infer",
        json=fraud_body(parameters={"fake_delay_s": 1.0}),
        headers={"Prefer": "respond-async"},
    )
    assert resp.status_code == 202, resp.text
    location = resp.headers["location"]
    assert gateway.http.get(location).status_code == 202
    done = poll_result(gateway, resp.json()["id"])
    assert done.status_code == 200, done.text
    assert done.json()["id"] == resp.json()["id"]
    assert gateway.http.get("/v2/requests/never-published").status_code == 404


def record_id(ids: list[str], result: dict[str, Any]) -> None:
    ids.append(str(result["request_id"]))


def test_replicas_receive_only_their_own_replies(
    start_gateway: Callable[..., GatewayServer], worker: FakeWorker
) -> None:
    replicas = [start_gateway(), start_gateway()]
    seen: list[list[str]] = [[], []]
    for replica, ids in zip(replicas, seen, strict=True):
        replica.runtime.router.listeners.append(functools.partial(record_id, ids))
    partitions = {r.runtime.services.feed.reply_to()["partition"] for r in replicas}  # type: ignore[index]
    assert len(partitions) == 2, "each replica leases its own partition"

    sent: list[list[str]] = [[], []]
    for i in range(6):
        replica, mine = replicas[i % 2], sent[i % 2]
        resp = replica.http.post("/v2/models/fraud/infer", json=fraud_body(id=unique("rep")))
        assert resp.status_code == 200, resp.text
        mine.append(resp.json()["id"])
    assert seen == sent, "a replica's consumer saw another replica's reply"


def test_replica_that_cannot_hold_a_lease_is_not_ready(
    start_gateway: Callable[..., GatewayServer], worker: FakeWorker, topics: TopicSettings
) -> None:
    gateway = start_gateway(reply_lease_s=2)
    client = redis.Redis.from_url(RedisSettings().url)
    keys = [lease_key(topics.replies, p) for p in range(topics.reply_partitions)]
    try:
        for key in keys:
            client.set(key, "intruder", px=60_000)
        wait_for(
            lambda: gateway.http.get("/v2/health/ready").status_code == 503,
            timeout=10,
            what="the replica to notice its lost lease",
        )
        assert gateway.http.post("/v2/models/fraud/infer", json=fraud_body()).status_code == 503
    finally:
        client.delete(*keys)
        client.close()
    wait_for(
        lambda: gateway.http.get("/v2/health/ready").status_code == 200,
        timeout=10,
        what="the replica to lease a partition again",
    )
    resp = gateway.http.post("/v2/models/fraud/infer", json=fraud_body())
    assert resp.status_code == 200, resp.text


def test_served_versions_follow_lifecycle_events_live(
    start_gateway: Callable[..., GatewayServer],
    kafka_settings: KafkaSettings,
    topics: TopicSettings,
    registry_settings: SchemaRegistrySettings,
    pg_settings: PostgresSettings,
) -> None:
    gateway = start_gateway()
    assert gateway.http.get("/v2/models/fraud").json()["versions"] == ["1", "2"]
    assert gateway.http.get("/v2/models/fraud/versions/2/ready").status_code == 200

    async def retire() -> None:
        log = LifecycleLog.from_settings(
            pg_settings,
            LifecycleSettings(),
            kafka_settings,
            topics,
            registry_settings,
            publish=True,
        )
        async with log:
            await log.append("fraud", [NewEvent(ev.Retired("2"))], expected_version=None)

    asyncio.run(retire())
    wait_for(
        lambda: gateway.http.get("/v2/models/fraud/versions/2").status_code == 404,
        timeout=20,
        what="the gateway to see version 2 retired",
    )
    assert gateway.http.get("/v2/models/fraud").json()["versions"] == ["1"]
    resp = gateway.http.post("/v2/models/fraud/versions/2/infer", json=fraud_body())
    assert resp.status_code == 404, resp.text


def test_an_id_held_on_one_replica_is_refused_on_another(
    start_gateway: Callable[..., GatewayServer], worker: FakeWorker
) -> None:
    """A synchronous call's chosen id is claimed in Redis for its wait: a call with the same id
    on another replica, synchronous or asynchronous, is refused 409 and never published."""
    first, second = start_gateway(), start_gateway()
    request_id = unique("held")
    with ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(
            first.http.post,
            "/v2/models/fraud/infer",
            json=fraud_body(id=request_id, parameters={"fake_delay_s": 2.0}),
        )
        wait_for(
            lambda: any(r["request_id"] == request_id for r in worker.seen),
            timeout=10,
            what="the first call published",
        )
        for headers in ({}, {"Prefer": "respond-async"}):
            again = second.http.post(
                "/v2/models/fraud/infer", json=fraud_body(id=request_id), headers=headers
            )
            assert again.status_code == 409, again.text
            assert again.json()["code"] == "REQUEST_IN_FLIGHT"
        assert waiting.result().status_code == 200
    assert [r["request_id"] for r in worker.seen].count(request_id) == 1
    # Answered, the id is given back: the same caller may use it again, on any replica.
    resp = second.http.post("/v2/models/fraud/infer", json=fraud_body(id=request_id))
    assert resp.status_code == 200, resp.text


async def test_the_store_binds_an_id_to_its_owner_and_submission_across_replicas() -> None:
    """Two replicas' stores over the real Redis: the claim, the in-flight refusal, a result
    written only with its submission's nonce, and a reservation released only by its own."""
    clients = [aioredis.Redis.from_url(RedisSettings().url) for _ in range(2)]
    a, b = (RedisResultStore(c, ttl_s=60) for c in clients)
    rid = unique("order")
    try:
        await a.save(rid, meta={"model": "fraud"}, owner="key:alice", nonce="n-a", claim=True)
        with pytest.raises(RequestIdTakenError):  # Mallory, on the other replica
            await b.save(rid, owner="key:mallory", nonce="n-m", claim=True, ttl_s=5)
        with pytest.raises(RequestInFlightError):  # Alice again, before her result came
            await b.save(rid, owner="key:alice", nonce="n-a2", claim=True, ttl_s=5)
        with pytest.raises(RequestIdTakenError):  # a result of another submission
            await b.save(rid, result=b"forged", owner="key:alice", nonce="n-other")
        assert not await b.attach(rid, b"forged", "n-other")
        assert await b.attach(rid, b"hers", "n-a")
        stored = await a.get(rid)
        assert stored is not None
        assert (stored.result, stored.owner, stored.nonce) == (b"hers", "key:alice", "n-a")
        # With her result in, Alice may submit the id again; the old result goes.
        await b.save(rid, owner="key:alice", nonce="n-a3", claim=True, ttl_s=5)
        await a.release(rid, "n-a")  # not the holder's nonce: nothing happens
        again = await a.get(rid)
        assert again is not None
        assert (again.result, again.nonce) == (None, "n-a3")
        await a.release(rid, "n-a3")
        assert await a.get(rid) is None
    finally:
        await a.discard(rid)
        for client in clients:
            await client.aclose()
