"""vegeta's results read as the overload benchmark reads its own generator's: latency from when
each call was due, by status."""

from __future__ import annotations

import pytest

from tests.bench.vegeta import _answers, load_result

START = 1_796_400_000_000_000_000


def row(seq: int, began_ns: int, code: int, latency_ms: float, error: str = "") -> str:
    return (
        f"{began_ns},{code},{int(latency_ms * 1e6)},402,200,{error},,,{seq},POST,"
        "http://127.0.0.1:8080/v2/models/fraud/infer,"
    )


def test_a_late_start_counts_in_the_latency() -> None:
    # At 100/s call 1 was due 10 ms after call 0, and began 30 ms late: its latency runs from
    # when it was due, as the Python generator counts it.
    encoded = "\n".join(
        [
            row(1, START + 40_000_000, 200, 5.0),  # CSV rows come in completion order
            row(0, START, 200, 20.0),
            row(2, START + 20_000_000, 503, 1.0),
        ]
    )
    answers = _answers(encoded, rate=100.0, seconds=1.0)
    assert answers.by_status["200"] == pytest.approx([0.020, 0.035])
    assert answers.by_status["503"] == pytest.approx([0.001])
    assert answers.started_late == pytest.approx([0.0, 0.030, 0.0])
    assert answers.first("503") == pytest.approx(0.02)


def test_transport_errors_are_their_own_status() -> None:
    encoded = row(0, START, 0, 30_000.0, "Post http://127.0.0.1:8080: connection refused")
    answers = _answers(encoded, rate=10.0, seconds=1.0)
    assert list(answers.by_status) == ["connection refused"]
    result = load_result("http", answers)
    assert (result.sent, result.ok, result.errors) == (1, 0, 1)
    assert result.statuses == {"connection refused": 1}


def test_statuses_read_as_the_sweeps_read_them() -> None:
    encoded = "\n".join([row(0, START, 200, 10.0), row(1, START + 10**8, 503, 1.0)])
    result = load_result("http", _answers(encoded, rate=10.0, seconds=1.0))
    assert result.statuses == {"OK": 1, "HTTP 503": 1}
    assert (result.ok, result.errors, result.sent) == (1, 1, 2)
