"""The gateway's HTTP behaviour, with Kafka and Redis replaced by in-memory fakes
(tests/unit/gateway_harness.py).

The fakes sit behind the gateway's own interfaces (`RequestPublisher`, `ReplyFeed`,
`ResultStore`, `LifecycleView`): the fake publisher plays the worker and answers each request
through the fake feed, or holds the answer back until the test releases it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.http as httpclient
from fastapi.routing import APIRoute
from fastapi.testclient import TestClient
from tritonclient.http._utils import _get_inference_request

from tests.support import wait_for
from tests.unit.agents.dataplane_support import lifecycle_state, registered
from tests.unit.gateway_harness import (
    FRAUD_JSON,
    Harness,
    features,
    fetched,
    kept_writes,
    left_s,
    make_result,
    problem_of,
)
from tidegate.gateway.v2api import routes
from tidegate.lifecycle.domain import events as ev
from tidegate.schemas.records import ErrorRecord, ResultStatus

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
        *registered("1", "3", signature_json=FRAUD_JSON),
        *registered("2", loaded_on=None, signature_json=FRAUD_JSON),
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


def test_inference_is_matched_before_the_other_routes() -> None:
    paths = [route.path for route in routes.router.routes if isinstance(route, APIRoute)]
    assert paths[:2] == ["/v2/models/{model}/infer", "/v2/models/{model}/versions/{version}/infer"]


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
    reply_to = record["reply_to"]
    assert reply_to is not None
    nonce = reply_to.pop("nonce")
    assert reply_to == {"topic": "replies", "partition": 3}
    assert nonce is not None
    assert len(nonce) >= 16, "each submission carries its own unguessable nonce"
    # The wait (the harness's default_timeout_s) is the request's deadline.
    assert left_s(record) == pytest.approx(5.0, abs=0.05)


def test_a_call_answered_in_time_never_touches_the_result_store(
    client: TestClient, harness: Harness
) -> None:
    resp = client.post("/v2/models/fraud/infer", json=features())
    assert resp.status_code == 200, resp.text
    assert harness.store.calls == []
    # An id the caller chose is reserved for the call's wait (so no other caller takes it
    # meanwhile, on any replica), and given back when it is answered.
    for n in range(3):
        resp = client.post("/v2/models/fraud/infer", json=features(id=f"fast-{n}"))
        assert resp.status_code == 200, resp.text
    assert harness.store.calls == [
        call for n in range(3) for call in (("reserve", f"fast-{n}"), ("release", f"fast-{n}"))
    ]
    assert harness.store.requests == {}
    # Nothing promised it a later fetch, so it is not kept for one.
    assert problem_of(client.get("/v2/requests/fast-0"), 404)["code"] == "REQUEST_NOT_FOUND"


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
    assert left_s(record) == pytest.approx(2.0, abs=0.01)


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
    client: TestClient, harness: Harness, status: ResultStatus, code: str, http: int
) -> None:
    error: ErrorRecord = {
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
    # The marker at the 504, the result when it came: nothing before the deadline passed.
    assert kept_writes(harness.store) == [("save", "slow-1"), ("save", "slow-1")]


def test_a_result_arriving_while_the_504_is_written_is_kept(
    client: TestClient, harness: Harness
) -> None:
    """The late result may come before the 504's own marker reached the store; it is stored all
    the same, not attached to a request the store does not know yet."""
    harness.worker.hold = True
    harness.store.save_delay_s = 0.5
    with ThreadPoolExecutor(1) as pool:
        call = pool.submit(
            client.post,
            "/v2/models/fraud/infer",
            json=features(id="race-1"),
            headers={"Request-Timeout": "0.1"},
        )
        assert harness.store.saving.wait(5), "the 504's marker is being written"
        harness.worker.release("race-1")
        assert call.result().status_code == 504
    harness.store.save_delay_s = 0.0
    assert fetched(client, "race-1").json()["outputs"][0]["data"] == [6, 3, 22, 7]


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
    # Its id is the caller's: looked up first (a retry is not published twice), then marked
    # before it was published.
    assert harness.store.calls[:2] == [("get", "a-1"), ("save", "a-1")]
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

        with ThreadPoolExecutor(1) as pool:
            first = pool.submit(call)
            wait_for(lambda: harness.worker.held, timeout=5, what="first call published")
            body = problem_of(call(), 409)
            assert (body["code"], body["field"]) == ("REQUEST_IN_FLIGHT", "id")
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
