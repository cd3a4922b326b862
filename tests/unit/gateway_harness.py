"""The gateway unit tests' harness: the gateway app with Kafka and Redis replaced by in-memory
fakes behind its own interfaces (`RequestPublisher`, `ReplyFeed`, `ResultStore`, `LifecycleView`).
The fake publisher plays the worker and answers each request through the fake feed, or holds the
answer back until the test releases it; it acknowledges each request at once, or holds the
acknowledgement back too. The fake store records every call made to it."""

from __future__ import annotations

import asyncio
import io
import threading
from collections.abc import Callable, Iterator, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

import fastavro
import httpx
import numpy as np
import pytest
from fastapi.testclient import TestClient

from tests.support import wait_for
from tests.unit.agents.dataplane_support import lifecycle_state, registered
from tests.unit.auth_fixtures import MemoryKeyStore
from tidegate.clients.producer import Lane, PublishError
from tidegate.gateway.app import create_app
from tidegate.gateway.auth.auth_settings import AuthSettings
from tidegate.gateway.auth.authn import Authenticator
from tidegate.gateway.auth.key_verifier import KeyVerifier
from tidegate.gateway.gateway_services import GatewayConfig, GatewayServices
from tidegate.gateway.gateway_settings import GatewaySettings
from tidegate.gateway.http_errors import RequestIdTakenError, RequestInFlightError
from tidegate.gateway.modelstate.model_catalog import ModelCatalog
from tidegate.gateway.roundtrip.reply_router import Deliver, ReplyFeed
from tidegate.gateway.roundtrip.request_publisher import Ack, RequestPublisher
from tidegate.gateway.roundtrip.result_store import ResultStore, StoredRequest
from tidegate.lifecycle.domain import events as ev
from tidegate.lifecycle.domain.state import ModelState
from tidegate.schemas.catalog import INFERENCE_RESULT, load_schema
from tidegate.schemas.records import (
    ErrorRecord,
    ReplyToRecord,
    RequestRecord,
    ResultRecord,
    ResultStatus,
    TensorRecord,
)
from tidegate.schemas.signature import Signature, TensorSpec
from tidegate.schemas.tensors import from_numpy, to_numpy

RESULT_SCHEMA = load_schema(INFERENCE_RESULT).parsed
FRAUD = Signature(
    inputs=(TensorSpec(name="features", datatype="FP32", shape=(-1, 4)),),
    outputs=(TensorSpec(name="probabilities", datatype="FP32", shape=(-1, 2)),),
)
ECHO = Signature(
    inputs=(TensorSpec(name="text", datatype="BYTES", shape=(-1,)),),
    outputs=(TensorSpec(name="echo", datatype="BYTES", shape=(-1,)),),
)
FRAUD_JSON = FRAUD.model_dump_json()
ECHO_JSON = ECHO.model_dump_json()


def encode_result(result: ResultRecord) -> bytes:
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, RESULT_SCHEMA, result)
    return buf.getvalue()


def decode_result(raw: bytes) -> ResultRecord:
    decoded = fastavro.schemaless_reader(io.BytesIO(raw), RESULT_SCHEMA, None)
    assert isinstance(decoded, dict)
    # Read with the InferenceResult schema: the record has its fields.
    return cast(ResultRecord, decoded)


def make_result(
    record: Mapping[str, Any],
    status: ResultStatus = "OK",
    outputs: list[TensorRecord] | None = None,
    error: ErrorRecord | None = None,
) -> ResultRecord:
    """A worker's answer to `record`: a `RequestRecord`, or the decoded request
    (tests/integration/fakes.py) that a plain dict stands for."""
    return {
        "request_id": record["request_id"],
        "model": record["model"],
        "model_version": record["model_version"] or "1",
        "status": status,
        "outputs": outputs or [],
        "error": error,
        "timings": {"queue_ms": 0.0, "batch_ms": 0.0, "compute_ms": 0.0, "total_ms": 0.0},
        "batch_size": 1,
        "worker_id": "fake",
        "source": None,
        "routing_rule": None,
        "tenant": record["tenant"],
        "routing_key": record["routing_key"],
        "completed_at": datetime.now(UTC),
    }


def compute(record: Mapping[str, Any]) -> ResultRecord:
    """What the fake worker answers: row sums and maxima for fraud, upper case for echo."""
    (tensor,) = record["inputs"]
    array = to_numpy(tensor)
    if record["model"] == "echo":
        out = from_numpy("echo", np.array([v.upper() for v in array], dtype=object))
    else:
        out = from_numpy("probabilities", np.stack([array.sum(1), array.max(1)], axis=1))
    return make_result(record, outputs=[out])


class FakeFeed(ReplyFeed):
    def __init__(self) -> None:
        self.deliver: Deliver | None = None
        self.assigned = True

    async def start(self, deliver: Deliver) -> None:
        self.deliver = deliver

    async def stop(self) -> None:
        self.deliver = None

    def reply_to(self) -> ReplyToRecord | None:
        return {"topic": "replies", "partition": 3} if self.assigned else None


class FakeWorker(RequestPublisher):
    """Publishing hands the request to a fake worker that replies through the feed."""

    def __init__(self, feed: FakeFeed) -> None:
        self.feed = feed
        self.published: list[RequestRecord] = []
        self.answer: Callable[[RequestRecord], ResultRecord] = compute
        self.hold = False
        self.hold_ack = False
        self.fail = False
        self.held: dict[str, tuple[ResultRecord, str | None]] = {}
        self.acks: dict[str, Ack] = {}
        self.loop: asyncio.AbstractEventLoop | None = None
        self.is_connected = True

    @property
    def connected(self) -> bool:
        return self.is_connected

    def submit(self, record: RequestRecord, lane: Lane = "realtime") -> Ack:
        self.loop = asyncio.get_running_loop()
        ack: Ack = self.loop.create_future()
        if self.fail:
            ack.set_exception(PublishError("all brokers are down"))
            return ack
        self.published.append(record)
        # The reply carries its submission's nonce back, as a worker's does.
        reply_to = record.get("reply_to")
        reply = (self.answer(record), reply_to.get("nonce") if reply_to else None)
        if self.hold:
            self.held[record["request_id"]] = reply
        else:
            self.loop.call_soon(self._deliver, reply)
        if self.hold_ack:
            self.acks[record["request_id"]] = ack
        else:
            ack.set_result(None)
        return ack

    def _deliver(self, reply: tuple[ResultRecord, str | None]) -> None:
        assert self.feed.deliver is not None
        result, nonce = reply
        self.feed.deliver(result, encode_result(result), None, nonce)

    def release(self, request_id: str) -> None:
        """Answer a held request, from the test's thread."""
        assert self.loop is not None
        self.loop.call_soon_threadsafe(self._deliver, self.held.pop(request_id))

    def release_ack(self, request_id: str, error: Exception | None = None) -> None:
        """Acknowledge a held request (or fail its publish), from the test's thread."""
        assert self.loop is not None
        ack = self.acks.pop(request_id)
        if error is None:
            self.loop.call_soon_threadsafe(ack.set_result, None)
        else:
            self.loop.call_soon_threadsafe(ack.set_exception, error)


class MemoryStore(ResultStore):
    """The result store in a dict, with every call recorded in `calls` (method, request id). A
    `save` that starts (but a reservation's) sets `saving`, and takes `save_delay_s` before it
    writes."""

    def __init__(self) -> None:
        self.requests: dict[str, StoredRequest] = {}
        self.calls: list[tuple[str, str]] = []
        self.save_delay_s = 0.0
        self.saving = threading.Event()

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
        """As `RedisResultStore.save` (its Lua script), without the TTL. A claim that writes no
        field is recorded as `reserve`."""
        reserve = claim and meta is None and result is None
        self.calls.append(("reserve" if reserve else "save", request_id))
        if not reserve:
            self.saving.set()
            if self.save_delay_s:
                await asyncio.sleep(self.save_delay_s)
        old = self.requests.get(request_id, StoredRequest(None, None))
        if old.owner is not None and old.owner != owner:
            raise RequestIdTakenError(request_id)
        if old.nonce is not None and old.nonce != nonce:
            if not claim:
                raise RequestIdTakenError(request_id)
            if old.result is None:
                raise RequestInFlightError(request_id)
            old = StoredRequest(None, None, old.owner, old.nonce)
        self.requests[request_id] = StoredRequest(
            meta if meta is not None else old.meta,
            result if result is not None else old.result,
            owner,
            nonce,
        )

    async def attach(self, request_id: str, result: bytes, nonce: str | None = None) -> bool:
        self.calls.append(("attach", request_id))
        old = self.requests.get(request_id)
        if old is None or old.result is not None:
            return False
        if old.nonce is not None and old.nonce != nonce:
            return False
        self.requests[request_id] = StoredRequest(old.meta, result, old.owner, old.nonce)
        return True

    async def get(self, request_id: str) -> StoredRequest | None:
        self.calls.append(("get", request_id))
        return self.requests.get(request_id)

    async def discard(self, request_id: str) -> None:
        self.calls.append(("discard", request_id))
        self.requests.pop(request_id, None)

    async def release(self, request_id: str, nonce: str) -> None:
        self.calls.append(("release", request_id))
        found = self.requests.get(request_id)
        if found is not None and found.nonce == nonce and found.meta is None:
            del self.requests[request_id]


class MemoryLifecycle:
    """The model states a `LifecycleFeed` would have folded, set by the test."""

    def __init__(self, *states: ModelState) -> None:
        self.states = {state.model: state for state in states}

    def state(self, model: str) -> ModelState | None:
        return self.states.get(model)

    async def caught_up(self, timeout_s: float) -> None:
        """Always caught up."""


def served_models() -> MemoryLifecycle:
    """fraud 1 (primary) and 2, echo 1 (primary): validated and warm on some worker."""
    return MemoryLifecycle(
        lifecycle_state(
            "fraud",
            *registered("1", signature_json=FRAUD_JSON),
            *registered("2", signature_json=FRAUD_JSON, runtime="torch"),
            ev.Promoted("1"),
        ),
        lifecycle_state("echo", *registered("1", signature_json=ECHO_JSON), ev.Promoted("1")),
    )


class Harness:
    def __init__(self, tmp_path: Path, **gateway: Any) -> None:
        self.lifecycle = served_models()
        self.feed = FakeFeed()
        self.worker = FakeWorker(self.feed)
        self.store = MemoryStore()
        self.services = GatewayServices(
            catalog=ModelCatalog(self.lifecycle),
            publisher=self.worker,
            feed=self.feed,
            store=self.store,
            decode_result=decode_result,
        )
        settings = {"default_timeout_s": 5.0, "max_body_bytes": 4096, **gateway}
        # Authentication off (`--insecure`): these tests are not about it; tests/unit/gateway/
        # test_auth*.py and test_permissions.py install an `authenticator` of their own.
        self.config = GatewayConfig(
            gateway=GatewaySettings(**settings), auth=AuthSettings(enabled=False)
        )
        self.authenticator: Authenticator | None = None

    def client(self) -> TestClient:
        app = create_app(
            self.config, lambda _config: self.services, authenticator=self.authenticator
        )
        return TestClient(app)


def secured(tmp_path: Path, store: MemoryKeyStore) -> Harness:
    """A harness whose gateway checks API keys against `store`."""
    harness = Harness(tmp_path)
    harness.authenticator = Authenticator(AuthSettings(), keys=KeyVerifier(store, ttl_s=2.0))
    return harness


@pytest.fixture
def harness(tmp_path: Path) -> Harness:
    return Harness(tmp_path)


@pytest.fixture
def client(harness: Harness) -> Iterator[TestClient]:
    with harness.client() as test_client:
        yield test_client


def features(rows: int = 2, **extra: Any) -> dict[str, Any]:
    data = np.arange(rows * 4, dtype=np.float32).reshape(rows, 4).tolist()
    return {
        "inputs": [{"name": "features", "datatype": "FP32", "shape": [rows, 4], "data": data}],
        **extra,
    }


def left_s(record: RequestRecord) -> float:
    """The seconds from a published request's creation to its deadline (the gateway writes both
    as a `datetime`)."""
    deadline, created_at = record.get("deadline"), record["created_at"]
    assert isinstance(deadline, datetime), deadline
    assert isinstance(created_at, datetime), created_at
    return (deadline - created_at).total_seconds()


def problem_of(resp: Any, status: int) -> dict[str, Any]:
    assert resp.status_code == status, resp.text
    assert resp.headers["content-type"] == "application/problem+json"
    body: dict[str, Any] = resp.json()
    assert {"type", "title", "status", "detail", "instance"} <= set(body)
    assert body["status"] == status
    return body


def fetched(client: TestClient, request_id: str) -> httpx.Response:
    """The response of GET /v2/requests/{id} once it is no longer pending."""

    def probe() -> httpx.Response | None:
        resp = client.get(f"/v2/requests/{request_id}")
        return resp if resp.status_code != 202 else None

    return wait_for(probe, timeout=5, what=f"the result of {request_id}")


def kept_writes(store: MemoryStore) -> list[tuple[str, str]]:
    """The store's writes other than a synchronous call's reservation of a chosen id and its
    release: what promises (or keeps) a result for a later fetch."""
    return [call for call in store.calls if call[0] not in ("get", "reserve", "release")]
