"""The gateway's HTTP behaviour, with Kafka and Redis replaced by in-memory fakes.

The fakes sit behind the gateway's own interfaces (`RequestPublisher`, `ReplyFeed`,
`ResultStore`, `ManifestSource`): the fake publisher plays the worker and answers each request
through the fake feed, or holds the answer back until the test releases it.
"""

from __future__ import annotations

import asyncio
import io
import json
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import fastavro
import httpx
import numpy as np
import pytest
import tritonclient.http as httpclient
from fastapi.testclient import TestClient
from tritonclient.http._utils import _get_inference_request

from agents.manifest import Manifest
from agents.signature import Signature, TensorSpec
from agents.tensors import from_numpy, to_numpy
from gateway.app import create_app
from gateway.models import ModelCatalog
from gateway.publisher import RequestPublisher
from gateway.replies import Deliver, ReplyFeed
from gateway.results import ResultStore, StoredRequest
from gateway.services import GatewayConfig, GatewayServices
from lifecycle import events as ev
from lifecycle.state import ModelState
from schemas import INFERENCE_RESULT, load_schema
from tests.support import wait_for
from tests.unit.test_service import lifecycle_state, registered
from tidegate.errors import ModelNotFoundError
from tidegate.producer import PublishError
from tidegate.settings import GatewaySettings, ModelSettings

RESULT_SCHEMA = load_schema(INFERENCE_RESULT).parsed
FRAUD = Signature(
    inputs=(TensorSpec(name="features", datatype="FP32", shape=(-1, 4)),),
    outputs=(TensorSpec(name="probabilities", datatype="FP32", shape=(-1, 2)),),
)
ECHO = Signature(
    inputs=(TensorSpec(name="text", datatype="BYTES", shape=(-1,)),),
    outputs=(TensorSpec(name="echo", datatype="BYTES", shape=(-1,)),),
)


def manifest(name: str, version: str, signature: Signature, runtime: str = "onnx") -> Manifest:
    return Manifest.model_validate(
        {
            "name": name,
            "version": version,
            "runtime": runtime,
            "entrypoint": "model.bin",
            "files": {"model.bin": "0" * 64},
            "signature": signature,
        }
    )


class MemorySource:
    def __init__(self, *manifests: Manifest) -> None:
        self._by_key = {(m.name, m.version): m for m in manifests}

    async def manifest(self, name: str, version: str) -> Manifest:
        found = self._by_key.get((name, version))
        if found is None:
            raise ModelNotFoundError(f"no model {name!r} version {version!r}")
        return found

    async def versions(self, name: str) -> list[str]:
        return sorted(v for n, v in self._by_key if n == name)


def encode_result(result: dict[str, Any]) -> bytes:
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, RESULT_SCHEMA, result)
    return buf.getvalue()


def decode_result(raw: bytes) -> dict[str, Any]:
    decoded = fastavro.schemaless_reader(io.BytesIO(raw), RESULT_SCHEMA, None)
    assert isinstance(decoded, dict)
    return decoded


def make_result(
    record: dict[str, Any],
    status: str = "OK",
    outputs: list[dict[str, Any]] | None = None,
    error: dict[str, Any] | None = None,
) -> dict[str, Any]:
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


def compute(record: dict[str, Any]) -> dict[str, Any]:
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

    def reply_to(self) -> dict[str, Any] | None:
        return {"topic": "replies", "partition": 3} if self.assigned else None


class FakeWorker(RequestPublisher):
    """Publishing hands the request to a fake worker that replies through the feed."""

    def __init__(self, feed: FakeFeed) -> None:
        self.feed = feed
        self.published: list[dict[str, Any]] = []
        self.answer: Callable[[dict[str, Any]], dict[str, Any]] = compute
        self.hold = False
        self.fail = False
        self.held: dict[str, dict[str, Any]] = {}
        self.loop: asyncio.AbstractEventLoop | None = None
        self.is_connected = True

    @property
    def connected(self) -> bool:
        return self.is_connected

    async def publish(self, record: dict[str, Any]) -> None:
        if self.fail:
            raise PublishError("all brokers are down")
        self.loop = asyncio.get_running_loop()
        self.published.append(record)
        result = self.answer(record)
        if self.hold:
            self.held[record["request_id"]] = result
        else:
            self.loop.call_soon(self._deliver, result)

    def _deliver(self, result: dict[str, Any]) -> None:
        assert self.feed.deliver is not None
        self.feed.deliver(result, encode_result(result))

    def release(self, request_id: str) -> None:
        """Answer a held request, from the test's thread."""
        assert self.loop is not None
        self.loop.call_soon_threadsafe(self._deliver, self.held.pop(request_id))


class MemoryStore(ResultStore):
    def __init__(self) -> None:
        self.requests: dict[str, StoredRequest] = {}

    async def save(
        self, request_id: str, *, meta: dict[str, Any] | None = None, result: bytes | None = None
    ) -> None:
        old = self.requests.get(request_id, StoredRequest(None, None))
        self.requests[request_id] = StoredRequest(
            meta if meta is not None else old.meta, result if result is not None else old.result
        )

    async def get(self, request_id: str) -> StoredRequest | None:
        return self.requests.get(request_id)

    async def discard(self, request_id: str) -> None:
        self.requests.pop(request_id, None)


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
        lifecycle_state("fraud", *registered("1", "2"), ev.Promoted("1")),
        lifecycle_state("echo", *registered("1"), ev.Promoted("1")),
    )


class Harness:
    def __init__(self, tmp_path: Path, **gateway: Any) -> None:
        self.lifecycle = served_models()
        self.feed = FakeFeed()
        self.worker = FakeWorker(self.feed)
        self.store = MemoryStore()
        source = MemorySource(
            manifest("fraud", "1", FRAUD),
            manifest("fraud", "2", FRAUD, runtime="torch"),
            manifest("echo", "1", ECHO),
        )
        self.services = GatewayServices(
            catalog=ModelCatalog(source, self.lifecycle),
            publisher=self.worker,
            feed=self.feed,
            store=self.store,
            decode_result=decode_result,
        )
        settings = {"default_timeout_s": 5.0, "max_body_bytes": 4096, **gateway}
        self.config = GatewayConfig(
            gateway=GatewaySettings(**settings),
            models=ModelSettings(store_dir=tmp_path),
        )

    def client(self) -> TestClient:
        return TestClient(create_app(self.config, lambda _config: self.services))


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


# -- health and metadata -----------------------------------------------------------------------


def test_health(client: TestClient, harness: Harness) -> None:
    assert client.get("/v2/health/live").json() == {"live": True}
    assert client.get("/v2/health/ready").json() == {"ready": True}
    harness.feed.assigned = False
    body = problem_of(client.get("/v2/health/ready"), 503)
    assert "reply partition" in body["detail"]
    harness.feed.assigned = True
    harness.worker.is_connected = False
    body = problem_of(client.get("/v2/health/ready"), 503)
    assert "producer" in body["detail"]


def test_server_metadata(client: TestClient) -> None:
    body = client.get("/v2").json()
    assert body["name"] == "tidegate"
    assert "binary_tensor_data" in body["extensions"]


def test_model_metadata(client: TestClient) -> None:
    body = client.get("/v2/models/fraud").json()
    assert body == {
        "name": "fraud",
        "versions": ["1", "2"],
        "platform": "onnxruntime_onnx",
        "inputs": [{"name": "features", "datatype": "FP32", "shape": [-1, 4]}],
        "outputs": [{"name": "probabilities", "datatype": "FP32", "shape": [-1, 2]}],
    }
    assert client.get("/v2/models/fraud/versions/2").json()["platform"] == "pytorch_torchscript"
    assert client.get("/v2/models/fraud/ready").json()["ready"] is True
    assert client.get("/v2/models/fraud/versions/2/ready").status_code == 200
    for path in ("/v2/models/nope", "/v2/models/fraud/versions/9", "/v2/models/nope/ready"):
        assert problem_of(client.get(path), 404)["code"] == "NOT_FOUND"


def test_served_versions_and_readiness_follow_the_lifecycle(
    client: TestClient, harness: Harness
) -> None:
    harness.lifecycle.states["fraud"] = lifecycle_state(
        "fraud",
        *registered("1", "3"),
        *registered("2", loaded_on=None),
        ev.Promoted("1"),
        ev.Retired("3"),
    )
    assert client.get("/v2/models/fraud").json()["versions"] == ["1", "2"]
    for path in ("/v2/models/fraud/versions/3", "/v2/models/fraud/versions/3/ready"):
        assert "retired" in problem_of(client.get(path), 404)["detail"]
    problem_of(client.post("/v2/models/fraud/versions/3/infer", json=features()), 404)
    not_warm = problem_of(client.get("/v2/models/fraud/versions/2/ready"), 503)
    assert "not loaded" in not_warm["detail"]
    assert client.get("/v2/models/fraud/versions/2").status_code == 200
    harness.lifecycle.states["echo"] = lifecycle_state("echo", *registered("1"))
    assert "no primary" in problem_of(client.get("/v2/models/echo/ready"), 404)["detail"]
    assert harness.worker.published == []


def test_unknown_routes_answer_problems(client: TestClient) -> None:
    problem_of(client.get("/v3/whatever"), 404)
    problem_of(client.delete("/v2/models/fraud/infer"), 405)


# -- synchronous inference ---------------------------------------------------------------------


def test_sync_infer_json(client: TestClient, harness: Harness) -> None:
    resp = client.post("/v2/models/fraud/infer", json=features(id="call-1"))
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["id"] == "call-1"
    assert body["model_name"] == "fraud"
    assert body["model_version"] == "1"
    assert body["outputs"] == [
        {"name": "probabilities", "datatype": "FP32", "shape": [2, 2], "data": [6, 3, 22, 7]}
    ]
    (record,) = harness.worker.published
    assert record["request_id"] == "call-1"
    assert record["model_version"] is None, "routing happens in the worker"
    assert record["reply_to"] == {"topic": "replies", "partition": 3}
    assert record["deadline"] is None
    # The result also stays retrievable by id.
    assert client.get("/v2/requests/call-1").json() == body


def test_explicit_version_is_published(client: TestClient, harness: Harness) -> None:
    resp = client.post("/v2/models/fraud/versions/2/infer", json=features())
    assert resp.status_code == 200, resp.text
    assert resp.json()["model_version"] == "2"
    assert harness.worker.published[0]["model_version"] == "2"


def test_parameters_routing_key_tenant_and_deadline(client: TestClient, harness: Harness) -> None:
    params = {"routing_key": "card-7", "tenant": "acme", "timeout": 2_000_000, "custom": "x"}
    resp = client.post("/v2/models/fraud/infer", json=features(parameters=params))
    assert resp.status_code == 200, resp.text
    (record,) = harness.worker.published
    assert record["routing_key"] == "card-7"
    assert record["tenant"] == "acme"
    assert record["parameters"] == {"timeout": 2_000_000, "custom": "x"}
    left = (record["deadline"] - record["created_at"]).total_seconds()
    assert left == pytest.approx(2.0, abs=0.01)


def test_binary_tensors_with_tritonclient_framing(client: TestClient) -> None:
    text = np.array([b"abc", b"de"], dtype=object)
    infer_input = httpclient.InferInput("text", [2], "BYTES")
    infer_input.set_data_from_numpy(text, binary_data=True)
    body, json_size = _get_inference_request(
        inputs=[infer_input],
        request_id="",
        outputs=None,
        sequence_id=0,
        sequence_start=False,
        sequence_end=False,
        priority=0,
        timeout=None,
        custom_parameters=None,
    )
    resp = client.post(
        "/v2/models/echo/infer",
        content=body,
        headers={"Inference-Header-Content-Length": str(json_size)},
    )
    assert resp.status_code == 200, resp.text
    length = int(resp.headers["Inference-Header-Content-Length"])
    parsed = httpclient.InferResult.from_response_body(resp.content, header_length=length)
    assert list(parsed.as_numpy("echo")) == [b"ABC", b"DE"]


def test_json_bytes_in_and_out(client: TestClient) -> None:
    body = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": ["hi"]}]}
    resp = client.post("/v2/models/echo/infer", json=body)
    assert resp.json()["outputs"][0]["data"] == ["HI"]


# -- refusals: nothing invalid is ever published -----------------------------------------------


def test_invalid_input_names_the_field(client: TestClient, harness: Harness) -> None:
    bad = features(id="bad-1")
    bad["inputs"][0]["datatype"] = "INT32"
    body = problem_of(client.post("/v2/models/fraud/infer", json=bad), 400)
    assert body["field"] == "features"
    assert body["request_id"] == "bad-1"
    assert body["code"] == "INVALID_INPUT"
    assert harness.worker.published == []


def test_malformed_json(client: TestClient, harness: Harness) -> None:
    resp = client.post(
        "/v2/models/fraud/infer",
        content=b'{"inputs": [',
        headers={"content-type": "application/json"},
    )
    assert problem_of(resp, 400)["code"] == "MALFORMED_REQUEST"
    assert harness.worker.published == []


def test_unsupported_media(client: TestClient, harness: Harness) -> None:
    text = client.post(
        "/v2/models/fraud/infer", content=b"{}", headers={"content-type": "text/plain"}
    )
    assert problem_of(text, 415)["field"] == "Content-Type"
    gzip = client.post(
        "/v2/models/fraud/infer", content=b"{}", headers={"content-encoding": "gzip"}
    )
    assert problem_of(gzip, 415)["field"] == "Content-Encoding"
    assert harness.worker.published == []


def test_oversized_bodies(client: TestClient, harness: Harness) -> None:
    big = json.dumps(features(rows=200)).encode()
    assert len(big) > 4096
    declared = client.post(
        "/v2/models/fraud/infer", content=big, headers={"content-type": "application/json"}
    )
    assert problem_of(declared, 413)["code"] == "PAYLOAD_TOO_LARGE"

    def chunks() -> Iterator[bytes]:
        for start in range(0, len(big), 1000):
            yield big[start : start + 1000]

    streamed = client.post("/v2/models/fraud/infer", content=chunks())
    assert problem_of(streamed, 413)["code"] == "PAYLOAD_TOO_LARGE"
    assert harness.worker.published == []


def test_unknown_model_or_version(client: TestClient, harness: Harness) -> None:
    problem_of(client.post("/v2/models/nope/infer", json=features()), 404)
    problem_of(client.post("/v2/models/fraud/versions/7/infer", json=features()), 404)
    assert harness.worker.published == []


@pytest.mark.parametrize("value", ["abc", "0", "-3", "nan"])
def test_bad_request_timeout(client: TestClient, value: str) -> None:
    resp = client.post(
        "/v2/models/fraud/infer", json=features(), headers={"Request-Timeout": value}
    )
    assert problem_of(resp, 400)["field"] == "Request-Timeout"


@pytest.mark.parametrize("request_id", ["has space", "../etc", "x" * 200])
def test_bad_request_ids(client: TestClient, request_id: str) -> None:
    resp = client.post("/v2/models/fraud/infer", json=features(id=request_id))
    assert problem_of(resp, 400)["field"] == "id"


def test_not_ready_replica_refuses(client: TestClient, harness: Harness) -> None:
    harness.feed.assigned = False
    problem_of(client.post("/v2/models/fraud/infer", json=features()), 503)
    assert harness.worker.published == []


def test_publish_failure_is_503_and_leaves_no_marker(client: TestClient, harness: Harness) -> None:
    harness.worker.fail = True
    resp = client.post("/v2/models/fraud/infer", json=features(id="lost-1"))
    assert problem_of(resp, 503)["code"] == "PUBLISH_FAILED"
    assert "lost-1" not in harness.store.requests


# -- result statuses ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "code", "http"),
    [
        ("INVALID", "SHAPE_MISMATCH", 400),
        ("NOT_FOUND", "NOT_FOUND", 404),
        ("DEADLINE_EXCEEDED", "DEADLINE_EXCEEDED", 504),
        ("ERROR", "MODEL_ERROR", 500),
        ("UNAVAILABLE", "UNAVAILABLE", 503),
    ],
)
def test_result_statuses(
    client: TestClient, harness: Harness, status: str, code: str, http: int
) -> None:
    error = {
        "code": code,
        "message": f"{status} happened",
        "error_class": "X",
        "retriable": status == "UNAVAILABLE",
        "field": "features" if status == "INVALID" else None,
        "details": {},
    }
    harness.worker.answer = lambda record: make_result(record, status=status, error=error)
    body = problem_of(client.post("/v2/models/fraud/infer", json=features(id="s-1")), http)
    assert body["code"] == code
    assert body["detail"] == f"{status} happened"
    assert body["request_id"] == "s-1"
    if status == "INVALID":
        assert body["field"] == "features"


# -- timeouts and asynchronous calls -----------------------------------------------------------


def test_timeout_then_fetch_later(client: TestClient, harness: Harness) -> None:
    harness.worker.hold = True
    resp = client.post(
        "/v2/models/fraud/infer", json=features(id="slow-1"), headers={"Request-Timeout": "0.2"}
    )
    body = problem_of(resp, 504)
    assert body["request_id"] == "slow-1"
    assert body["code"] == "TIMEOUT"
    assert resp.headers["location"] == "/v2/requests/slow-1"
    assert client.get("/v2/requests/slow-1").status_code == 202
    harness.worker.release("slow-1")
    late = fetched(client, "slow-1")
    assert late.json()["outputs"][0]["data"] == [6, 3, 22, 7]


def test_async_flow(client: TestClient, harness: Harness) -> None:
    harness.worker.hold = True
    body = features(
        id="a-1", outputs=[{"name": "probabilities", "parameters": {"binary_data": True}}]
    )
    resp = client.post("/v2/models/fraud/infer", json=body, headers={"Prefer": "respond-async"})
    assert resp.status_code == 202, resp.text
    assert resp.headers["location"] == "/v2/requests/a-1"
    assert resp.headers["preference-applied"] == "respond-async"
    pending = client.get("/v2/requests/a-1")
    assert pending.status_code == 202
    assert pending.json()["status"] == "PENDING"
    harness.worker.release("a-1")
    done = fetched(client, "a-1")
    # The output preferences of the original call apply to the fetched result.
    length = int(done.headers["Inference-Header-Content-Length"])
    parsed = httpclient.InferResult.from_response_body(done.content, header_length=length)
    np.testing.assert_array_equal(parsed.as_numpy("probabilities"), [[6, 3], [22, 7]])


def test_unknown_request_id(client: TestClient) -> None:
    assert problem_of(client.get("/v2/requests/never-seen"), 404)["code"] == "REQUEST_NOT_FOUND"
    problem_of(client.get("/v2/requests/bad%20id"), 404)


def test_shedding_when_too_many_in_flight(tmp_path: Path) -> None:
    harness = Harness(tmp_path, max_in_flight=1)
    harness.worker.hold = True
    with harness.client() as client:
        first = client.post(
            "/v2/models/fraud/infer", json=features(id="q-1"), headers={"Prefer": "respond-async"}
        )
        assert first.status_code == 202
        shed = client.post("/v2/models/fraud/infer", json=features(id="q-2"))
        problem_of(shed, 503)
        assert shed.headers["retry-after"] == "1"
        assert [r["request_id"] for r in harness.worker.published] == ["q-1"]
        harness.worker.release("q-1")
        wait_for(lambda: client.get("/v2/requests/q-1").status_code == 200, timeout=5, what="q-1")
        harness.worker.hold = False
        assert client.post("/v2/models/fraud/infer", json=features(id="q-3")).status_code == 200


def test_duplicate_id_in_flight_is_refused(tmp_path: Path) -> None:
    harness = Harness(tmp_path)
    harness.worker.hold = True
    with harness.client() as client:

        def call() -> Any:
            return client.post(
                "/v2/models/fraud/infer", json=features(id="dup"), headers={"Request-Timeout": "3"}
            )

        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(1) as pool:
            first = pool.submit(call)
            wait_for(lambda: harness.worker.held, timeout=5, what="first call published")
            assert problem_of(call(), 400)["field"] == "id"
            harness.worker.release("dup")
            assert first.result().status_code == 200


def test_metrics(client: TestClient) -> None:
    client.post("/v2/models/fraud/infer", json=features())
    client.post("/v2/models/nope/infer", json=features())
    text = client.get("/metrics").text
    assert 'tidegate_gateway_requests_total{model="fraud",status="200",version="1"}' in text
    assert 'tidegate_gateway_requests_total{model="_unknown",status="404",version=""}' in text
    assert "tidegate_gateway_request_duration_seconds_bucket" in text
    assert "tidegate_gateway_in_flight" in text
