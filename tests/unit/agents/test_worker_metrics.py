"""A batch's observations recorded together (`observe_all`) must read as if each had been
observed alone: the same buckets, count and sum, on any amount, bounds and infinity included."""

from __future__ import annotations

import math

import pytest
from prometheus_client import CollectorRegistry, Histogram

from tidegate.agents import worker_metrics as metrics

BUCKETS = (0.005, 0.01, 0.1, 1.0)
AMOUNTS = [0.0, -1.0, 0.004, 0.005, 0.0051, 0.01, 0.05, 0.1, 0.99, 1.0, 1.5, 1e9, math.inf]


def exposition(histogram: Histogram) -> dict[tuple[str, str], float]:
    return {
        (s.name, s.labels.get("le", "")): s.value
        for family in histogram.collect()
        for s in family.samples
        if not s.name.endswith("_created")
    }


def fresh(name: str) -> Histogram:
    return Histogram(name, "test", buckets=BUCKETS, registry=CollectorRegistry())


@pytest.mark.parametrize("amounts", [AMOUNTS, [0.05], [], [0.01] * 7])
def test_observe_all_reads_as_each_observed_alone(amounts: list[float]) -> None:
    one_by_one = fresh("one_by_one")
    for amount in amounts:
        one_by_one.observe(amount)
    together = fresh("one_by_one")
    metrics.observe_all(together, amounts)
    assert exposition(together) == exposition(one_by_one)


def test_a_labelled_child_takes_them_too() -> None:
    family = Histogram(
        "per_model", "test", ["model"], buckets=BUCKETS, registry=CollectorRegistry()
    )
    metrics.observe_all(family.labels("fraud"), [0.002, 0.5, 0.5])
    samples = exposition(family)
    assert samples["per_model_bucket", "0.005"] == 1
    assert samples["per_model_bucket", "1.0"] == 3
    assert samples["per_model_count", ""] == 3


def test_observations_wait_for_their_flush() -> None:
    histogram = fresh("gathered")
    gathered = metrics.Observations(histogram)
    gathered.add(0.003)
    gathered.add(0.2)
    assert exposition(histogram)["gathered_count", ""] == 0
    gathered.flush()
    assert exposition(histogram)["gathered_count", ""] == 2
    gathered.flush()
    assert exposition(histogram)["gathered_count", ""] == 2, "each amount once"
