"""The lineage headers of a redelivered request: written by the relay, redrive and replay, read
back by the worker."""

from __future__ import annotations

from tidegate.dlq.redelivery import (
    HISTORY,
    read_lineage,
    redelivery_headers,
    retries_since_redrive,
    step,
)

ORIGIN = {"topic": "inference-requests", "partition": 3, "offset": 41}


def test_headers_round_trip_and_keep_the_original_ones() -> None:
    history = [
        step("retry", 1000, source={"topic": "r:1", "partition": 0, "offset": 5}, reason="X"),
        step("redrive", 2000, run_id="run-1"),
    ]
    original = [("traceparent", b"00-abc"), (HISTORY, b"stale")]
    headers = redelivery_headers(
        original, attempt=3, origin=ORIGIN, history=history, first_failed_at_ms=900
    )
    assert headers[0] == ("traceparent", b"00-abc")
    assert [k for k, _ in headers].count(HISTORY) == 1
    lineage = read_lineage(headers)
    assert lineage is not None
    assert lineage.attempt == 3
    assert lineage.first_failed_at_ms == 900
    assert lineage.origin == ORIGIN
    assert lineage.history == history  # a topic with a colon survives too


def test_a_first_delivery_has_no_lineage_and_bad_headers_never_refuse_a_request() -> None:
    assert read_lineage(None) is None
    assert read_lineage([("traceparent", b"00-abc")]) is None
    broken = read_lineage([("tidegate-attempt", b"two"), (HISTORY, b"{")])
    assert broken is not None
    assert broken.attempt == 1


def test_a_redrive_starts_a_fresh_retry_budget_and_holds_are_not_retries() -> None:
    kinds = ["retry", "retry", "hold", "redrive", "retry", "hold"]
    assert retries_since_redrive([{"kind": k} for k in kinds]) == 1
    assert retries_since_redrive([{"kind": "retry"}, {"kind": "retry"}]) == 2
