"""The per-call metrics look their children up once per label set."""

from __future__ import annotations

from typing import Any

import pytest

from tidegate.gateway import http_metrics as metrics


def counting(monkeypatch: pytest.MonkeyPatch, metric: Any) -> list[tuple[Any, ...]]:
    looked_up: list[tuple[Any, ...]] = []
    labels = metric.labels

    def spy(*values: Any, **named: Any) -> Any:
        looked_up.append((*values, *named.values()))
        return labels(*values, **named)

    monkeypatch.setattr(metric, "labels", spy)
    return looked_up


def test_children_are_looked_up_once_per_label_set(monkeypatch: pytest.MonkeyPatch) -> None:
    for cache in ("_requests", "_latencies", "_replies"):
        monkeypatch.setattr(metrics, cache, {})
    requests = counting(monkeypatch, metrics.REQUESTS)
    latencies = counting(monkeypatch, metrics.LATENCY)
    replies = counting(monkeypatch, metrics.REPLIES)
    before = metrics.REQUESTS.labels("cached", "1", "200")._value.get()
    requests.clear()

    for _ in range(3):
        metrics.count_request("cached", "1", 200)
        metrics.observe_latency("cached", 0.01)
        metrics.count_reply("awaited")
    metrics.count_request("cached", "1", 504)

    assert requests == [("cached", "1", "200"), ("cached", "1", "504")]
    assert latencies == [("cached",)]
    assert replies == [("awaited",)]
    assert metrics.REQUESTS.labels("cached", "1", "200")._value.get() == before + 3
