"""Prometheus metrics of the worker agents (prometheus-client's default registry).

Model load time is `tidegate_model_load_seconds`, observed by the runtime loader, not here.
"""

from __future__ import annotations

import functools
from bisect import bisect_left
from collections.abc import Iterable, Sequence

from prometheus_client import Counter, Gauge, Histogram

__all__ = [
    "BATCH_SIZE",
    "BATCH_WAIT",
    "BREAKER_REFUSED",
    "BREAKER_STATE",
    "BREAKER_TRANSITIONS",
    "COMPUTE",
    "CONSUMER_LAG",
    "DEAD_LETTERS",
    "END_TO_END",
    "EVICTIONS",
    "FALLBACKS",
    "IN_FLIGHT",
    "LOADED_BYTES",
    "LOADED_VERSIONS",
    "MODEL_TIMEOUTS",
    "POOL_INFO",
    "QUEUE",
    "QUEUE_WAITS",
    "REPLIES_UNDELIVERED",
    "REQUESTS",
    "RETRIES",
    "SHADOW_COMPARED",
    "SHADOW_SKIPPED",
    "SUB_BATCH_SIZE",
    "TRANSACTION_ABORTS",
    "TRANSACTION_COMMIT",
    "Observations",
    "PrometheusBatchObserver",
    "compute",
    "end_to_end",
    "observe_all",
    "requests",
    "sub_batch_size",
]

_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)
MODEL_TIMEOUTS = Counter(
    "tidegate_worker_model_timeouts",
    "Batches that ran past their model's timeout, by model and version.",
    ["model", "version"],
)
RETRIES = Counter(
    "tidegate_worker_retries",
    "Requests sent to a retry topic, by model, error code and retry level.",
    ["model", "code", "level"],
)
_FAST = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
_SLOW = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)

REPLIES_UNDELIVERED = Counter(
    "tidegate_worker_replies_undelivered",
    "Replies Kafka refused for good (the result itself is on the results topic), by error.",
    ["reason"],
)
REQUESTS = Counter(
    "tidegate_worker_requests",
    "Requests answered by this worker, by model, serving version and result status.",
    ["model", "version", "status"],
)
END_TO_END = Histogram(
    "tidegate_worker_request_seconds",
    "From the request's creation by its producer to its result, by model.",
    ["model"],
    buckets=_SLOW,
)
QUEUE = Histogram(
    "tidegate_worker_queue_seconds",
    "From the request's produce to its consume (Kafka time).",
    buckets=_SLOW,
)
BATCH_WAIT = Histogram(
    "tidegate_worker_batch_wait_seconds",
    "How long each request waited in its partition's batch queue.",
    buckets=_FAST,
)
BATCH_SIZE = Histogram(
    "tidegate_worker_batch_size",
    "Requests per partition batch.",
    buckets=_SIZES,
)
SUB_BATCH_SIZE = Histogram(
    "tidegate_worker_model_batch_size",
    "Requests per model run (a partition batch split by model and version).",
    ["model", "version"],
    buckets=_SIZES,
)
COMPUTE = Histogram(
    "tidegate_worker_compute_seconds",
    "Wall time of one model run, by model and version.",
    ["model", "version"],
    buckets=_FAST,
)
IN_FLIGHT = Gauge(
    "tidegate_worker_in_flight",
    "Requests consumed whose results are not yet delivered.",
)
CONSUMER_LAG = Gauge(
    "tidegate_worker_consumer_lag",
    "High watermark minus this worker's position, per assigned partition.",
    ["topic", "partition"],
)
LOADED_VERSIONS = Gauge(
    "tidegate_worker_loaded_versions",
    "Model versions loaded and warm on this worker.",
)
EVICTIONS = Counter(
    "tidegate_worker_evictions",
    "Versions unloaded to make room: `count` past max_loaded_versions, `memory` past the "
    "worker's memory budget (a later request for one loads it again, counted in cold_loads).",
    ["model", "version", "reason"],
)
LOADED_BYTES = Gauge(
    "tidegate_worker_loaded_bytes",
    "Resident memory the loaded versions account for: each one's measured growth of the "
    "process's RSS at its load (the average of the measured ones where a load overlapped "
    "another); what the memory budget is held against.",
)
POOL_INFO = Gauge(
    "tidegate_worker_pool_info",
    "1, labelled with the model pool this worker serves (`default` for the default pool): what "
    "joins a worker's metrics to its pool.",
    ["pool"],
)
COLD_LOADS = Counter(
    "tidegate_worker_cold_loads",
    "Versions loaded while a request waited for them: an explicit or pinned old version asked "
    "for on demand. Routed traffic never waits on a load, so a split never adds to it.",
    ["model", "version"],
)
SHADOW_COMPARED = Counter(
    "tidegate_worker_shadow_comparisons",
    "Requests run on a shadow candidate and compared with the primary, by model and candidate.",
    ["model", "candidate"],
)
SHADOW_SKIPPED = Counter(
    "tidegate_worker_shadow_skipped",
    "Requests sampled for a shadow candidate but not run on it: `full` when "
    "shadow_max_in_flight runs were already going, `cold` when the candidate is not loaded here, "
    "`queue-full` when the producer's queue had no room for the comparison.",
    ["model", "candidate", "reason"],
)
TRANSACTION_COMMIT = Histogram(
    "tidegate_worker_transaction_commit_seconds",
    "Exactly-once: how long committing one transaction (offsets and results) took.",
    buckets=_FAST,
)
TRANSACTION_ABORTS = Counter(
    "tidegate_worker_transaction_aborts",
    "Exactly-once: transactions aborted (a failed commit, lost partitions); their partitions "
    "were rewound and redone.",
)
DEAD_LETTERS = Counter(
    "tidegate_worker_dead_letters",
    "Dead-letter envelopes published, by topic and error code.",
    ["topic", "code"],
)


def observe_all(histogram: Histogram, amounts: Iterable[float]) -> None:
    """What `histogram.observe` of each amount records, with one lock taken per bucket it
    touches and one for the sum, where each observation takes two and scans the bounds in Python.
    prometheus-client has no call for many amounts; a batch's requests each have one, three
    times on the worker's path (docs/benchmarks.md, "A batch's observations together")."""
    bounds: list[float] = histogram._upper_bounds
    counts: dict[int, int] = {}
    total = 0.0
    for amount in amounts:
        # observe() counts an amount in the first bucket whose bound is >= it.
        index = bisect_left(bounds, amount)
        counts[index] = counts.get(index, 0) + 1
        total += amount
    if not counts:
        return
    histogram._sum.inc(total)
    buckets = histogram._buckets
    for index, count in counts.items():
        buckets[index].inc(count)


class Observations:
    """Amounts gathered for one histogram over a batch, observed together by `flush`."""

    __slots__ = ("amounts", "histogram")

    def __init__(self, histogram: Histogram) -> None:
        self.histogram = histogram
        self.amounts: list[float] = []

    def add(self, amount: float) -> None:
        self.amounts.append(amount)

    def flush(self) -> None:
        if self.amounts:
            amounts, self.amounts = self.amounts, []
            observe_all(self.histogram, amounts)


QUEUE_WAITS = Observations(QUEUE)
"""Each consumed request's Kafka time, observed once per poll (`InferenceWorker._ingest`)."""


class PrometheusBatchObserver:
    """Records each partition batch's size and each member's wait."""

    def observe_batch(self, size: int, waits_ms: Sequence[float]) -> None:
        BATCH_SIZE.observe(size)
        observe_all(BATCH_WAIT, [wait / 1000.0 for wait in waits_ms])


# Labelled children are looked up once: `labels()` costs more than the observation itself.
@functools.lru_cache(maxsize=1024)
def requests(model: str, version: str, status: str) -> Counter:
    return REQUESTS.labels(model, version, status)


@functools.lru_cache(maxsize=256)
def end_to_end(model: str) -> Histogram:
    return END_TO_END.labels(model)


@functools.lru_cache(maxsize=256)
def compute(model: str, version: str) -> Histogram:
    return COMPUTE.labels(model, version)


@functools.lru_cache(maxsize=256)
def sub_batch_size(model: str, version: str) -> Histogram:
    return SUB_BATCH_SIZE.labels(model, version)


BREAKER_STATE = Gauge(
    "tidegate_worker_breaker_state",
    "The circuit breaker of each model version on this worker: 0 closed, 1 half-open, 2 open.",
    ["model", "version"],
)
BREAKER_TRANSITIONS = Counter(
    "tidegate_worker_breaker_transitions",
    "Circuit-breaker state changes, by model, version and the state entered.",
    ["model", "version", "state"],
)
BREAKER_REFUSED = Counter(
    "tidegate_worker_breaker_refused",
    "Requests not sent to a version because its breaker was open (or its half-open probes "
    "were taken): they went to the fallback or were answered UNAVAILABLE.",
    ["model", "version"],
)
FALLBACKS = Counter(
    "tidegate_worker_fallbacks",
    "Requests served by the model's declared fallback instead, by model, fallback and reason.",
    ["model", "fallback", "reason"],
)
