"""A call's budget (how long it waits, and the request's deadline) and the record it publishes."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

import pytest

from tidegate.core.errors import InvalidInputError
from tidegate.gateway.gateway_settings import GatewaySettings
from tidegate.gateway.v2api import call_record
from tidegate.gateway.v2api.call_record import Budget, budget
from tidegate.schemas.records import ReplyToRecord, RequestRecord
from tidegate.schemas.v2 import parse_request

SETTINGS = GatewaySettings(default_timeout_s=10, max_timeout_s=60, publish_timeout_s=4)


@pytest.mark.parametrize(
    ("raw", "respond_async", "settings", "expected"),
    [
        # Synchronous: the wait is the deadline.
        ("2.5", False, SETTINGS, Budget(2.5, 2.5)),
        (None, False, SETTINGS, Budget(10, 10)),
        ("600", False, SETTINGS, Budget(60, 60)),
        # Asynchronous: waits for Kafka's acknowledgement; the deadline is asked for, or the
        # configured default, or none.
        ("3", True, SETTINGS, Budget(4, 3)),
        (None, True, SETTINGS, Budget(4, None)),
        (None, True, SETTINGS.model_copy(update={"async_deadline_s": 300.0}), Budget(4, 300)),
        ("600", True, SETTINGS, Budget(4, 60)),
    ],
)
def test_budget(
    raw: str | None, respond_async: bool, settings: GatewaySettings, expected: Budget
) -> None:
    assert budget(raw, settings, respond_async=respond_async) == expected


@pytest.mark.parametrize("raw", ["0", "-1", "soon", "nan", "inf"])
@pytest.mark.parametrize("respond_async", [False, True])
def test_a_bad_timeout_is_refused_either_way(raw: str, respond_async: bool) -> None:
    with pytest.raises(InvalidInputError) as exc:
        budget(raw, SETTINGS, respond_async=respond_async)
    assert exc.value.field == "Request-Timeout"


def record(deadline_s: float | None, **body: Any) -> RequestRecord:
    v2 = parse_request(
        json.dumps({"inputs": [{"name": "x", "shape": [], "datatype": "FP32"}], **body}).encode()
    )
    reply_to: ReplyToRecord = {"topic": "replies", "partition": 0}
    return call_record.new_record("m", None, v2, [], "r-1", reply_to, deadline_s)


def left_s(published: RequestRecord) -> float | None:
    deadline, created_at = published["deadline"], published["created_at"]
    if deadline is None:
        return None
    # new_record writes both as a `datetime`.
    assert isinstance(deadline, datetime), deadline
    assert isinstance(created_at, datetime), created_at
    return (deadline - created_at).total_seconds()


@pytest.mark.parametrize(
    ("deadline_s", "timeout_us", "left"),
    [
        (2.0, None, 2.0),
        (None, 1_500_000, 1.5),
        (2.0, 1_500_000, 1.5),
        (1.0, 1_500_000, 1.0),
        (None, None, None),
    ],
)
def test_the_earlier_deadline_wins(
    deadline_s: float | None, timeout_us: int | None, left: float | None
) -> None:
    params = {"timeout": timeout_us} if timeout_us else {}
    assert left_s(record(deadline_s, parameters=params)) == left


def test_an_output_asked_for_three_times_is_published_once() -> None:
    outputs = [{"name": "y"}, {"name": "y"}, {"name": "z"}, {"name": "y"}]
    assert record(None, outputs=outputs)["outputs"] == ["y", "z"]
