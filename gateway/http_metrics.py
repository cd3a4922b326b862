"""Prometheus metrics of the gateway, in prometheus-client's default registry.

Declared once per process: replicas started side by side in one process (as tests do) share them.
Label values come from known models only, so a flood of requests for made-up names cannot blow
up the series count. `labels()` costs a lock and a tuple of strings per call, so the children of
the per-call metrics are looked up once per label set and kept (the label sets are few for the
same reason).
"""

from __future__ import annotations

from typing import Any

from prometheus_client import Counter, Gauge, Histogram

__all__ = [
    "IN_FLIGHT",
    "LATENCY",
    "REPLIES",
    "REQUESTS",
    "SHED",
    "count_reply",
    "count_request",
    "observe_latency",
]

REQUESTS = Counter(
    "tidegate_gateway_requests_total",
    "Inference calls answered, by model, version that served and HTTP status.",
    ["model", "version", "status"],
)
LATENCY = Histogram(
    "tidegate_gateway_request_duration_seconds",
    "End-to-end latency of synchronous inference calls, body read to response.",
    ["model"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0),
)
IN_FLIGHT = Gauge(
    "tidegate_gateway_in_flight",
    "Published requests (synchronous and asynchronous) whose results have not arrived yet.",
)
SHED = Counter(
    "tidegate_gateway_shed_total", "Calls refused with 503 because too many were in flight."
)
REPLIES = Counter(
    "tidegate_gateway_replies_total",
    "Results read from this replica's reply partition: awaited by a call, stored for a later "
    "fetch (asynchronous or timed out), or claimed by no call of this replica.",
    ["outcome"],
)

_requests: dict[tuple[str, str, int], Any] = {}
_latencies: dict[str, Any] = {}
_replies: dict[str, Any] = {}


def count_request(model: str, version: str, status: int) -> None:
    child = _requests.get((model, version, status))
    if child is None:
        child = _requests[model, version, status] = REQUESTS.labels(model, version, str(status))
    child.inc()


def observe_latency(model: str, seconds: float) -> None:
    child = _latencies.get(model)
    if child is None:
        child = _latencies[model] = LATENCY.labels(model)
    child.observe(seconds)


def count_reply(outcome: str) -> None:
    child = _replies.get(outcome)
    if child is None:
        child = _replies[outcome] = REPLIES.labels(outcome=outcome)
    child.inc()
