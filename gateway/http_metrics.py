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
    "ADMISSION_LIMIT",
    "AUDIT_DROPPED",
    "ESTIMATED_DELAY",
    "FALLBACKS",
    "IN_FLIGHT",
    "KAFKA_LAG",
    "LATENCY",
    "REPLIES",
    "REQUESTS",
    "SHED",
    "count_reply",
    "count_request",
    "observe_latency",
    "set_admission",
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
    "tidegate_gateway_shed_total",
    "Calls refused with 503 by admission control: too many in flight, or an estimated queueing "
    "delay past their budget (docs/overload.md).",
)
AUDIT_DROPPED = Counter(
    "tidegate_gateway_audit_refusals_dropped_total",
    "Refused-credential and denied-permission audit entries not written, past the per-source or "
    "overall rate the trail takes them at (docs/audit.md), by action.",
    ["action"],
)
ADMISSION_LIMIT = Gauge(
    "tidegate_gateway_admission_limit",
    "A model's adaptive in-flight limit in this replica (the gradient of its calls' latency "
    "over the no-load latency, decision 020).",
    ["model"],
)
ESTIMATED_DELAY = Gauge(
    "tidegate_gateway_estimated_delay_seconds",
    "Estimated queueing delay of a new real-time call of a model in this replica.",
    ["model"],
)
KAFKA_LAG = Gauge(
    "tidegate_gateway_worker_lag",
    "The workers' consumer lag on the requests topic, as this replica's lag probe last read it.",
)
FALLBACKS = Counter(
    "tidegate_gateway_fallbacks_total",
    "Calls sent to the model's declared fallback instead, by model, fallback and reason "
    "(breaker-open: every servable version's breaker is open; overloaded: admission would have "
    "refused the call).",
    ["model", "fallback", "reason"],
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
_admission: dict[str, tuple[Any, Any]] = {}


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


def set_admission(model: str, limit: float, delay_s: float) -> None:
    """A model's admission numbers, once per tick."""
    children = _admission.get(model)
    if children is None:
        children = _admission[model] = (
            ADMISSION_LIMIT.labels(model),
            ESTIMATED_DELAY.labels(model),
        )
    children[0].set(limit)
    children[1].set(delay_s)
