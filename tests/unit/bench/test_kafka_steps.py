"""The Kafka steps' summary lists every step of a rate in order, so an A/B shows its spread."""

from __future__ import annotations

from tests.bench.kafka_steps import Step, summary


def test_each_rate_gets_one_line_with_every_step_and_the_medians() -> None:
    steps = [
        Step(2000, 30.0, 105.9, 0, 0.70),
        Step(1500, 25.0, 66.4, 0, 0.90),
        Step(2000, 40.0, 90.8, 2, 0.66),
        Step(2000, 35.0, 128.1, 0, 0.68),
    ]

    lines = summary(steps)

    assert len(lines) == 2
    assert lines[0].startswith(" 1,500/s")
    assert "p99 105.9, 90.8, 128.1 ms (median 105.9)" in lines[1]
    assert "p50 median 35.0 ms" in lines[1]
    assert "cpu ms/req median 0.680" in lines[1]
    assert lines[1].endswith("lost 2")
