"""`tidegate served`'s table: the version, rule, status, worker, schema id, source, origin, attempt,
every redelivery step and a visible CONFLICT warning naming the other digests."""

from __future__ import annotations

from typing import Any

from rich.console import Console

from tidegate.cli.lifecycle_tables import served_render
from tidegate.lifecycle.domain.render import state_view, table_view
from tidegate.lifecycle.domain.routing import RoutingTable
from tidegate.lifecycle.domain.state import fold

REQUESTS = {"topic": "inference-requests", "partition": 3, "offset": 41}
FAILED = {"topic": "inference-failed-requests", "partition": 0, "offset": 9}


def view(**request: Any) -> dict[str, Any]:
    """The JSON `served_view` returns, for a model with no events."""
    state = fold("fraud", [])
    base: dict[str, Any] = {
        "request_id": "req-1",
        "model": "fraud",
        "version": "2",
        "status": "OK",
        "worker_id": "worker-a",
        "routing_rule": "split@7",
        "tenant": "acme",
        "routing_key": None,
        "completed_at": "2026-05-01T12:00:00+00:00",
        "total_ms": 4.5,
        "error_code": None,
        "source": {"topic": "inference-requests", "partition": 5, "offset": 1200},
        "request_schema_id": 17,
        "request_digest": "d" * 32,
        "attempt": 1,
        "origin": None,
        "history": [],
        "conflicts": [],
    }
    return {
        "request": {**base, **request},
        "state_at": "2026-05-01T12:00:00+00:00",
        "state": state_view(state),
        "table": table_view(RoutingTable.from_state(state)),
        "lineage": None,
    }


def text(data: dict[str, Any]) -> str:
    console = Console(width=240, record=True, color_system=None)
    console.print(served_render(data))
    return console.export_text()


def test_the_table_shows_version_rule_status_worker_schema_source_and_attempt() -> None:
    out = text(view())
    for expected in ("split@7", "worker-a", "request schema id", "17", "d" * 32):
        assert expected in out
    assert "inference-requests:5:1200" in out
    assert "attempt" in out
    assert "origin" not in out  # a first delivery: the origin is the source
    assert "CONFLICT" not in out
    assert "redelivery history" not in out


def test_a_redriven_result_shows_its_origin_and_every_step() -> None:
    history = [
        {"kind": "replay", "at": "2026-05-01T11:00:00+00:00", "from": REQUESTS,
         "id": "replay-7", "reason": None},
        {"kind": "redrive", "at": "2026-05-01T11:30:00.250000+00:00", "from": FAILED,
         "id": "redrive-2", "reason": "MODEL_ERROR"},
    ]  # fmt: skip
    out = text(view(attempt=3, origin=REQUESTS, history=history))
    assert "origin" in out
    assert "inference-requests:3:41" in out
    assert "redelivery history" in out
    replay = next(line for line in out.splitlines() if "replay-7" in line)
    assert "replay" in replay
    assert "2026-05-01 11:00:00" in replay
    redrive = next(line for line in out.splitlines() if "redrive-2" in line)
    for expected in ("redrive", "2026-05-01 11:30:00.250", "inference-failed-requests:0:9"):
        assert expected in redrive
    assert "MODEL_ERROR" in redrive


def test_a_reused_request_id_is_a_visible_conflict_naming_the_other_digests() -> None:
    conflicts = [
        {"digest": "e" * 32, "first_digest": "d" * 32, "model": "fraud", "version": "1",
         "status": "ERROR", "worker_id": "worker-b", "source": REQUESTS,
         "completed_at": "2026-05-01T12:01:00+00:00", "detected_at": "2026-05-01T12:01:01+00:00"},
        {"digest": "f" * 32, "first_digest": "d" * 32, "model": "fraud", "version": None,
         "status": "NOT_FOUND", "worker_id": "", "source": None,
         "completed_at": "2026-05-01T12:02:00+00:00", "detected_at": "2026-05-01T12:02:01+00:00"},
    ]  # fmt: skip
    out = text(view(conflicts=conflicts))
    assert "CONFLICT" in out
    warning = out[out.index("CONFLICT") :]
    assert "d" * 32 in warning  # the served digest
    assert "e" * 32 in warning
    assert "f" * 32 in warning
    assert "inference-requests:3:41" in warning
    assert "worker-b" in warning


def test_a_row_indexed_before_sources_were_recorded_still_renders() -> None:
    old = view()
    for key in ("source", "request_schema_id", "request_digest", "origin", "history", "conflicts"):
        del old["request"][key]
    out = text(old)
    assert "split@7" in out
    assert "CONFLICT" not in out
