"""The served_requests row of a result, and how one batch's results of one request are planned:
the lineage fields map, the best result per (request id, digest) is kept by its rank, and a
reused request id writes in rounds with no request id twice per round."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from tidegate.lifecycle.control.served_rows import ServedBatch, rank, served_row

AT = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)


def result(request_id: str = "r1", **fields: Any) -> dict[str, Any]:
    """A decoded InferenceResult as the indexer gets it (timestamps already datetimes)."""
    base: dict[str, Any] = {
        "request_id": request_id,
        "model": "fraud",
        "model_version": "2",
        "status": "OK",
        "error": None,
        "timings": {"total_ms": 4.5},
        "worker_id": "w1",
        "routing_rule": "split@7",
        "tenant": "acme",
        "routing_key": "k",
        "completed_at": AT,
    }
    return {**base, **fields}


def test_a_redriven_result_maps_its_source_schema_digest_attempt_origin_and_history() -> None:
    replay = {
        "kind": "replay",
        "at": datetime(2026, 5, 1, 11, 0, tzinfo=UTC),
        "from": {"topic": "inference-requests", "partition": 3, "offset": 41},
        "id": "replay-7",
        "reason": None,
    }
    redrive = {
        "kind": "redrive",
        "at": datetime(2026, 5, 1, 11, 30, tzinfo=UTC),
        "from": {"topic": "inference-failed-requests", "partition": 0, "offset": 9},
        "id": "redrive-2",
        "reason": "MODEL_ERROR",
    }
    row = served_row(
        result(
            source={"topic": "inference-requests", "partition": 5, "offset": 1200},
            request_schema_id=17,
            request_digest="ab" * 16,
            attempt=3,
            origin={"topic": "inference-requests", "partition": 3, "offset": 41},
            history=[replay, redrive],
        )
    )
    assert (row["source_topic"], row["source_partition"], row["source_offset"]) == (
        "inference-requests",
        5,
        1200,
    )
    assert (row["origin_topic"], row["origin_partition"], row["origin_offset"]) == (
        "inference-requests",
        3,
        41,
    )
    assert (row["request_schema_id"], row["request_digest"], row["attempt"]) == (17, "ab" * 16, 3)
    assert row["history"] == [
        {**replay, "at": "2026-05-01T11:00:00+00:00"},
        {**redrive, "at": "2026-05-01T11:30:00+00:00"},
    ]
    json.dumps(row["history"])  # stored as jsonb: nothing in it but JSON
    assert (row["version"], row["routing_rule"], row["total_ms"]) == ("2", "split@7", 4.5)


def test_a_result_without_lineage_is_a_first_attempt_from_nowhere_known() -> None:
    row = served_row(result(status="ERROR", error={"code": "MODEL_ERROR"}))
    assert row["attempt"] == 1
    assert row["history"] == []
    assert row["error_code"] == "MODEL_ERROR"
    for column in ("source_topic", "source_offset", "origin_topic", "request_digest"):
        assert row[column] is None


def test_ok_ranks_over_a_failure_and_a_later_delivery_over_an_earlier_one() -> None:
    step = {"kind": "redrive", "at": AT, "from": None, "id": "d1", "reason": None}
    error = served_row(result(status="ERROR"))
    ok = served_row(result())
    redriven_error = served_row(result(status="ERROR", history=[step]))
    redriven_ok = served_row(result(history=[step]))
    assert rank(ok) > rank(redriven_error) > rank(error)
    assert rank(redriven_ok) > rank(ok)
    assert rank(served_row(result())) == rank(ok)  # a tie: the row already there stays


def test_a_batch_keeps_the_best_result_per_request_and_digest() -> None:
    step = {"kind": "retry", "at": AT, "from": None, "id": None, "reason": "UNAVAILABLE"}
    batch = ServedBatch()
    batch.add(served_row(result("r1", status="ERROR", request_digest="d1", worker_id="first")))
    batch.add(served_row(result("r1", request_digest="d1", history=[step], worker_id="retried")))
    batch.add(served_row(result("r1", status="ERROR", request_digest="d1", worker_id="again")))
    batch.add(served_row(result("r2", request_digest="d2")))
    assert batch.results == 4
    (only,) = batch.rounds()
    assert [(r["request_id"], r["worker_id"]) for r in only] == [("r1", "retried"), ("r2", "w1")]


def test_a_reused_request_id_is_written_in_rounds_first_digest_first() -> None:
    batch = ServedBatch()
    batch.add(served_row(result("r1", request_digest="first")))
    batch.add(served_row(result("r2", request_digest="x")))
    batch.add(served_row(result("r1", request_digest="second")))
    batch.add(served_row(result("r1", request_digest=None)))
    rounds = batch.rounds()
    assert [[(r["request_id"], r["request_digest"]) for r in rows] for rows in rounds] == [
        [("r1", "first"), ("r2", "x")],
        [("r1", "second")],
        [("r1", None)],
    ]
    for rows in rounds:
        ids = [r["request_id"] for r in rows]
        assert len(ids) == len(set(ids))


def test_an_empty_batch_is_false() -> None:
    batch = ServedBatch()
    assert not batch
    batch.add(served_row(result()))
    assert batch
