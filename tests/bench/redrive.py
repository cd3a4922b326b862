"""How fast a redrive sends a dead-letter backlog (`python -m tests.bench redrive`): 10,000 letters
on a failed topic of the run's own, redriven at 5,000/s against the real Kafka and registry.

Bar (moved from tests/integration/dlq/test_dlq_redrive.py, which keeps the behaviour: never
faster than the rate): at least 2,000/s achieved (40% of the rate). The best of `ROUNDS` counts.
"""

from __future__ import annotations

import asyncio

from tests.integration.dlq.dlq_fixtures import backlog, dlq_stack_of
from tests.support import unique
from tidegate.core.kafka import make_admin
from tidegate.core.settings import KafkaSettings, SchemaRegistrySettings
from tidegate.dlq.redrive import Redrive
from tidegate.dlq.redrive_report import RedriveOptions

__all__ = ["run"]

ROUNDS = 3
COUNT = 10_000
RATE = 5_000.0
BAR = 2_000.0


def _round() -> float:
    kafka = KafkaSettings()
    with dlq_stack_of(make_admin(kafka), kafka, SchemaRegistrySettings()) as stack:
        backlog(stack, COUNT)
        options = RedriveOptions(source=stack.topics.failed, run_id=unique("bench"), rate=RATE)
        report = asyncio.run(Redrive(stack.kafka, stack.topics, stack.registry, options).run())
    assert report.ok, report
    assert report.progress.redriven == COUNT, report.progress
    assert report.achieved_rate is not None
    return report.achieved_rate


def run() -> None:
    print(f"\nredrive: {COUNT:,} dead letters at {RATE:,.0f}/s")
    rates = []
    for k in range(ROUNDS):
        rates.append(_round())
        print(f"  round {k + 1}: {rates[-1]:,.0f}/s")
    best = max(rates)
    verdict = "met" if best >= BAR else "missed"
    print(f"  achieved {best:,.0f}/s  bar >= {BAR:,.0f}/s  {verdict}")
