"""The lane of a gateway call: the `Tidegate-Lane` header or the request parameter `lane` picks
the topic the request is published to (docs/lanes.md); a bad lane is a 400 problem."""

from __future__ import annotations

import json
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.unit.gateway_harness import Harness, features, problem_of
from tidegate.core.errors import InvalidInputError
from tidegate.gateway.roundtrip.request_publisher import Ack
from tidegate.gateway.v2api import call_record
from tidegate.schemas.records import RequestRecord
from tidegate.schemas.v2 import parse_request


@pytest.fixture
def lanes(harness: Harness, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The lane of every publish, in order (the fake worker serves every lane alike)."""
    seen: list[str] = []
    submit = harness.worker.submit

    def on_lane(record: RequestRecord, lane: str = "realtime") -> Ack:
        seen.append(lane)
        return submit(record)

    monkeypatch.setattr(harness.worker, "submit", on_lane)
    return seen


@pytest.fixture
def client(harness: Harness, lanes: list[str]) -> Any:
    with harness.client() as test_client:
        yield test_client


@pytest.mark.parametrize(
    ("header", "parameters", "lane"),
    [
        (None, {}, "realtime"),
        ("batch", {}, "batch"),
        (" Batch ", {}, "batch"),
        (None, {"lane": "batch"}, "batch"),
        ("realtime", {"lane": "realtime"}, "realtime"),
    ],
)
def test_the_lane_comes_from_the_header_or_the_parameter(
    header: str | None, parameters: dict[str, Any], lane: str
) -> None:
    assert call_record.lane(header, parameters) == lane


@pytest.mark.parametrize(
    ("header", "parameters", "field"),
    [
        ("urgent", {}, "Tidegate-Lane"),
        (None, {"lane": 1}, "parameters.lane"),
        ("batch", {"lane": "realtime"}, "Tidegate-Lane"),
    ],
)
def test_a_bad_or_contradictory_lane_is_refused(
    header: str | None, parameters: dict[str, Any], field: str
) -> None:
    with pytest.raises(InvalidInputError) as refused:
        call_record.lane(header, parameters)
    assert refused.value.field == field


def test_the_lane_parameter_is_not_forwarded() -> None:
    v2 = parse_request(
        json.dumps(features(parameters={"lane": "batch", "threshold": 0.5})).encode()
    )
    record = call_record.new_record(
        "fraud", None, v2, [], "r-1", {"topic": "replies", "partition": 0}
    )
    assert "lane" not in record["parameters"]
    assert "threshold" in record["parameters"]


def test_a_call_is_published_on_its_lane(client: TestClient, lanes: list[str]) -> None:
    path = "/v2/models/fraud/infer"
    assert client.post(path, json=features()).status_code == 200
    batch = {"Tidegate-Lane": "batch"}
    assert client.post(path, json=features(), headers=batch).status_code == 200
    body = features(parameters={"lane": "batch"})
    asynchronous = {"Prefer": "respond-async"}
    assert client.post(path, json=body, headers=asynchronous).status_code == 202
    assert lanes == ["realtime", "batch", "batch"]


def test_a_bad_lane_is_a_400_and_nothing_is_published(
    client: TestClient, harness: Harness, lanes: list[str]
) -> None:
    resp = client.post(
        "/v2/models/fraud/infer", json=features(), headers={"Tidegate-Lane": "urgent"}
    )
    assert "lane" in problem_of(resp, 400)["detail"]
    assert lanes == []
    assert harness.worker.published == []
