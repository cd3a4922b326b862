"""Letters as the operator commands see them: what a letter says about itself (model, version,
code, time), the filters, the stats, and the JSON views of `list` and `show`."""

from __future__ import annotations

import base64
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from tidegate.core.errors import InvalidInputError, ModelExecutionError, WireFormatError
from tidegate.dlq.envelopes import dead_letter, error_info, source_position
from tidegate.dlq.letters import (
    UNKNOWN,
    UNREADABLE,
    Letter,
    LetterFilter,
    LetterStats,
    bytes_view,
    letter_view,
    to_ms,
)

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def envelope(
    *,
    code_exc: Exception | None = None,
    model: str | None = "fraud",
    failed_at: datetime = T0,
    details: dict[str, str] | None = None,
    request_id: str | None = "r1",
) -> dict[str, Any]:
    """A decoded envelope: timestamps as fastavro reads them (aware datetimes)."""
    record = dead_letter(
        source=source_position("inference-requests", 3, 17),
        error=error_info(code_exc or ModelExecutionError("boom"), details=details),
        key=b"k",
        value=b"\x00\x00\x00\x00\x01body",
        headers=[("traceparent", b"00-abc"), ("bin", b"\xff\xfe")],
        timestamp_ms=to_ms(failed_at),
        failed_at_ms=to_ms(failed_at) or 0,
        request_id=request_id,
        model=model,
    )
    for name in ("failed_at", "first_failed_at", "original_timestamp"):
        record[name] = datetime.fromtimestamp(record[name] / 1000, UTC)
    return record


def letter(offset: int = 0, topic: str = "failed", **kw: Any) -> Letter:
    request = kw.pop("request", None)
    env = envelope(**kw)
    return Letter(topic, 0, offset, to_ms(env["failed_at"]), env, request=request)


def test_a_letter_knows_its_version_from_the_error_or_the_pinned_request() -> None:
    assert letter().version is None
    assert letter(details={"version": "3"}).version == "3"
    assert letter(request={"model": "fraud", "model_version": "2"}).version == "2"
    assert letter(details={"version": "3"}, request={"model_version": "2"}).version == "3"


def test_an_unreadable_record_is_a_letter_with_a_problem() -> None:
    bad = Letter("failed", 1, 9, None, None, problem="WIRE_FORMAT: magic byte")
    assert not bad.readable
    assert bad.code == UNREADABLE
    assert (bad.model, bad.request_id, bad.version) == (None, None, None)
    view = letter_view(bad, full=True)
    assert view["message"] == "WIRE_FORMAT: magic byte"
    assert view["original_value"] is None


def test_a_poison_letter_takes_its_model_and_id_from_a_request_decoded_later() -> None:
    poison = letter(code_exc=WireFormatError("bad"), model=None, request_id=None)
    assert (poison.model, poison.request_id, poison.code) == (None, None, "WIRE_FORMAT")
    fixed = Letter(
        poison.topic, 0, 0, None, poison.envelope, request={"model": "m", "request_id": "x"}
    )
    assert (fixed.model, fixed.request_id) == ("m", "x")


def test_filters_combine_sets_with_and_and_values_with_or() -> None:
    fraud, minilm = letter(model="fraud"), letter(model="minilm")
    pinned = letter(model="fraud", request={"model_version": "2"})
    bad_input = letter(code_exc=InvalidInputError("x"))
    assert LetterFilter().matches(fraud)
    by_model = LetterFilter.build(models=["fraud", "other"])
    assert [by_model.matches(x) for x in (fraud, minilm)] == [True, False]
    by_code = LetterFilter.build(codes=["invalid_input"])
    assert [by_code.matches(x) for x in (bad_input, fraud)] == [True, False]
    by_version = LetterFilter.build(versions=["2"])
    assert by_version.needs_request
    assert by_version.matches(pinned)
    assert not by_version.matches(fraud), "an unknown version never matches"
    both = LetterFilter.build(models=["fraud"], codes=["MODEL_ERROR"])
    assert [both.matches(x) for x in (fraud, bad_input, minilm)] == [True, False, False]


def test_the_time_range_is_inclusive_on_failed_at() -> None:
    early, late = letter(failed_at=T0), letter(failed_at=T0 + timedelta(hours=1))
    window = LetterFilter.build(since=T0, until=T0 + timedelta(minutes=30))
    assert [window.matches(x) for x in (early, late)] == [True, False]
    assert LetterFilter.build(since=T0 + timedelta(hours=1)).matches(late)
    assert not LetterFilter.build(until=T0 - timedelta(seconds=1)).matches(early)


def test_an_empty_time_range_is_refused() -> None:
    with pytest.raises(InvalidInputError) as caught:
        LetterFilter.build(since=T0, until=T0 - timedelta(seconds=1))
    assert caught.value.field == "since"


def test_stats_count_by_topic_model_version_and_code_with_oldest_and_newest() -> None:
    stats = LetterStats()
    for item in [
        letter(model="fraud", failed_at=T0),
        letter(model="fraud", failed_at=T0 + timedelta(minutes=5), details={"version": "2"}),
        letter(model="minilm", failed_at=T0 - timedelta(minutes=5)),
        letter(topic="poison", model=None, code_exc=WireFormatError("x")),
        Letter("poison", 0, 5, None, None, problem="garbage"),
    ]:
        stats.add(item)
    view = stats.view()
    assert view["count"] == 5
    assert view["unreadable"] == 1
    assert view["oldest"] == (T0 - timedelta(minutes=5)).isoformat(timespec="milliseconds")
    assert view["newest"] == (T0 + timedelta(minutes=5)).isoformat(timespec="milliseconds")
    assert {k: v["count"] for k, v in view["by_topic"].items()} == {"failed": 3, "poison": 2}
    assert {k: v["count"] for k, v in view["by_model"].items()} == {
        "fraud": 2,
        "minilm": 1,
        UNKNOWN: 2,
    }
    assert {k: v["count"] for k, v in view["by_version"].items()} == {
        "fraud:2": 1,
        "fraud:unknown": 1,
        "minilm:unknown": 1,
        "unknown:unknown": 2,
    }
    assert {k: v["count"] for k, v in view["by_code"].items()} == {
        "MODEL_ERROR": 3,
        "WIRE_FORMAT": 1,
        UNREADABLE: 1,
    }
    fraud = view["by_model"]["fraud"]
    assert fraud["oldest"] < fraud["newest"]


def test_bytes_are_base64_with_text_when_they_are_text() -> None:
    assert bytes_view(None) is None
    assert bytes_view(b"card-7") == {"size": 6, "base64": "Y2FyZC03", "text": "card-7"}
    binary = bytes_view(b"\x00\xff")
    assert binary == {"size": 2, "base64": base64.b64encode(b"\x00\xff").decode()}


def test_the_full_view_carries_the_original_bytes_headers_and_request() -> None:
    request = {
        "request_id": "r1",
        "model": "fraud",
        "model_version": "2",
        "tenant": "t",
        "routing_key": None,
        "created_at": T0,
        "deadline": None,
        "inputs": [{"name": "features", "datatype": "FP32", "shape": [1, 4], "data": b"x"}],
    }
    full = letter_view(letter(request=request), full=True)
    assert full["original_key"]["text"] == "k"
    assert base64.b64decode(full["original_value"]["base64"]) == b"\x00\x00\x00\x00\x01body"
    headers = {h["key"]: h["value"] for h in full["original_headers"]}
    assert headers["traceparent"]["text"] == "00-abc"
    assert "text" not in headers["bin"]
    assert full["request"]["inputs"] == [{"name": "features", "datatype": "FP32", "shape": [1, 4]}]
    assert full["request"]["created_at"].startswith("2026-03-01T12:00:00")
    assert full["error"]["code"] == "MODEL_ERROR"
    summary = letter_view(letter())
    assert "original_value" not in summary
    assert summary["failed_at"] == T0.isoformat(timespec="milliseconds")
    assert summary["source"] == {"topic": "inference-requests", "partition": 3, "offset": 17}
