"""What the gateway does before publishing a synchronous call: answer it from the prediction cache
(nothing published), refuse it at once while every servable version's breaker is open, or send it
to the model's declared fallback, marked, when the breakers or admission would refuse it and the
caller allows it (docs/breakers.md, docs/overload.md)."""

from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator

import pytest
from fastapi.testclient import TestClient

from tests.unit.agents.dataplane_support import lifecycle_state, registered
from tests.unit.agents.redis_fake import FakeRedis, as_redis
from tests.unit.gateway_harness import FRAUD_JSON, Harness, features, problem_of
from tidegate.core.cache_settings import PredictionCacheSettings
from tidegate.gateway.admission.admission_control import Admission
from tidegate.gateway.modelstate.prediction_cache import GatewayPredictionCache, table_resolver
from tidegate.lifecycle.domain import events as ev
from tidegate.lifecycle.domain.routing import RoutingTable
from tidegate.schemas.prediction_keys import encode_outputs, prediction_key
from tidegate.schemas.records import TensorRecord
from tidegate.schemas.requests import FALLBACK_OF


class Breakers:
    """The workers' breaker states as `ModelHealth` reads them: `open[model]` is the seconds
    until one of its versions takes calls again; a model not in it has a closed breaker."""

    def __init__(self) -> None:
        self.open: dict[str, float] = {}

    def suspect(self, model: str) -> bool:
        return model in self.open

    def refusing(self, model: str, versions: Iterable[str]) -> float | None:
        return self.open.get(model) if list(versions) else None


@pytest.fixture
def breakers(harness: Harness) -> Breakers:
    found = Breakers()
    harness.services.health = found
    lite = lifecycle_state(
        "fraud-lite", *registered("7", signature_json=FRAUD_JSON), ev.Promoted("7")
    )
    harness.lifecycle.states["fraud-lite"] = lite
    harness.lifecycle.states["fraud"] = lifecycle_state(
        "fraud",
        *registered("1", signature_json=FRAUD_JSON),
        ev.Promoted("1"),
        ev.FallbackSet("fraud-lite", reason="same signature"),
    )
    return found


@pytest.fixture
def client(harness: Harness, breakers: Breakers) -> Iterator[TestClient]:
    with harness.client() as test_client:
        yield test_client


def test_with_every_breaker_open_the_call_goes_to_the_fallback_marked(
    client: TestClient, harness: Harness, breakers: Breakers
) -> None:
    breakers.open["fraud"] = 3.0
    resp = client.post("/v2/models/fraud/infer", json=features())
    assert resp.status_code == 200, resp.text
    (published,) = harness.worker.published
    assert published["model"] == "fraud-lite"
    assert published["model_version"] is None  # the fallback's own routing picks its version
    assert published["parameters"][FALLBACK_OF] == "breaker-open@fraud"
    assert resp.json()["model_name"] == "fraud-lite"


def test_with_every_breaker_open_and_no_fallback_allowed_the_call_is_refused_at_once(
    client: TestClient, harness: Harness, breakers: Breakers
) -> None:
    breakers.open["fraud"] = 2.2
    resp = client.post("/v2/models/fraud/infer", json=features(parameters={"fallback": False}))
    problem = problem_of(resp, 503)
    assert problem["code"] == "UNAVAILABLE"
    assert problem["retriable"] is True
    assert "circuit breaker" in problem["detail"]
    assert resp.headers["retry-after"] == "3"
    # The fallback's own breaker open: refused as well. A version asked for by name: never moved.
    breakers.open["fraud-lite"] = 1.0
    assert client.post("/v2/models/fraud/infer", json=features()).status_code == 503
    assert client.post("/v2/models/fraud/versions/1/infer", json=features()).status_code == 503
    assert harness.worker.published == []


def test_a_caller_cannot_mark_its_own_request_as_diverted(
    client: TestClient, harness: Harness
) -> None:
    body = features(parameters={FALLBACK_OF: "overloaded@other"})
    assert client.post("/v2/models/fraud/infer", json=body).status_code == 200
    (published,) = harness.worker.published
    assert published["model"] == "fraud"
    assert FALLBACK_OF not in published["parameters"]


def test_a_call_admission_would_refuse_goes_to_the_fallback_when_it_has_room(
    client: TestClient, harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    crowded = {"fraud"}

    def refusal(
        self: Admission, model: str | None = None, wait_s: float | None = None, lane: str = ""
    ) -> str | None:
        return "the estimated queueing delay exceeds this call's" if model in crowded else None

    monkeypatch.setattr(Admission, "refusal", refusal)
    resp = client.post("/v2/models/fraud/infer", json=features())
    assert resp.status_code == 200, resp.text
    assert harness.worker.published[-1]["parameters"][FALLBACK_OF] == "overloaded@fraud"
    # Without a fallback with room, admission answers with its own reason.
    crowded.add("fraud-lite")
    problem = problem_of(client.post("/v2/models/fraud/infer", json=features()), 503)
    assert problem["code"] == "OVERLOADED"
    assert len(harness.worker.published) == 1


def test_a_cached_answer_skips_kafka_and_says_so(harness: Harness) -> None:
    redis = FakeRedis()
    settings = PredictionCacheSettings(models=frozenset({"fraud"}), key_prefix="t:")
    harness.services.prediction_cache = GatewayPredictionCache(
        as_redis(redis), settings, replica_id="g1"
    )

    class Tables:
        def table(self, model: str) -> RoutingTable | None:
            state = harness.lifecycle.state(model)
            return RoutingTable.from_state(state) if state is not None else None

    harness.services.resolve_version = table_resolver(Tables())
    # One servable version: the one a worker would route to is certain before any worker sees it.
    harness.lifecycle.states["fraud"] = lifecycle_state(
        "fraud", *registered("1", signature_json=FRAUD_JSON), ev.Promoted("1")
    )
    body = features(rows=1)
    with harness.client() as client:
        first = client.post("/v2/models/fraud/infer", json=body)
        assert first.status_code == 200, first.text
        assert len(harness.worker.published) == 1  # a miss: published as usual
        record = harness.worker.published[0]
        output: TensorRecord = {
            "name": "probabilities",
            "datatype": "FP32",
            "shape": [1, 2],
            "data": struct.pack("<2f", 0.5, 0.25),
            "parameters": {},
        }
        key = prediction_key(
            "t:", "fraud", "1", record["inputs"], (), record["parameters"], tenant=record["tenant"]
        )
        redis.values[key] = encode_outputs([output])
        hit = client.post("/v2/models/fraud/infer", json=body)
    assert hit.status_code == 200, hit.text
    assert len(harness.worker.published) == 1  # the hit was never published
    answer = hit.json()
    assert answer["model_version"] == "1"
    assert answer["outputs"][0]["data"] == [0.5, 0.25]
    assert answer["parameters"]["cached"] is True


def test_a_fallback_that_would_reject_the_inputs_is_not_taken(
    client: TestClient, harness: Harness, breakers: Breakers
) -> None:
    harness.lifecycle.states["fraud"] = lifecycle_state(
        "fraud",
        *registered("1", signature_json=FRAUD_JSON),
        ev.Promoted("1"),
        ev.FallbackSet("echo", reason="another signature"),
    )
    breakers.open["fraud"] = 2.0
    problem = problem_of(client.post("/v2/models/fraud/infer", json=features()), 503)
    assert problem["code"] == "UNAVAILABLE"  # retriable, not echo's INVALID_INPUT
    assert harness.worker.published == []


def test_a_retried_async_call_already_accepted_is_202_while_the_breakers_are_open(
    client: TestClient, harness: Harness, breakers: Breakers
) -> None:
    body = features(id="retry-1", parameters={"fallback": False})
    headers = {"Prefer": "respond-async"}
    assert client.post("/v2/models/fraud/infer", json=body, headers=headers).status_code == 202
    breakers.open["fraud"] = 5.0
    again = client.post("/v2/models/fraud/infer", json=body, headers=headers)
    assert again.status_code == 202, again.text
    assert len(harness.worker.published) == 1
    other = features(id="retry-2", parameters={"fallback": False})
    assert client.post("/v2/models/fraud/infer", json=other, headers=headers).status_code == 503
