"""Live per-version result statistics: what the canary controller judges a version by.

The indexer feeds every result it stores exactly once (only rows its INSERT actually added), and
the controller asks for one version's stats over the results completed since a time, usually the
current canary step's start. Canary windows are short (a dwell of seconds to minutes), so each
version keeps its recent results in a bounded deque: `max_samples` results at most and nothing
older than `horizon_s`. Past the cap, stats cover the most recent `max_samples` results of the
window; by then the `min_requests` gate is long passed and the rates stay representative.

Which statuses count as the version's fault matters: a canary must not be rolled back because
clients sent bad inputs. ERROR (the model failed) and UNAVAILABLE (the version could not serve)
are the version's fault; INVALID and NOT_FOUND are the caller's; DEADLINE_EXCEEDED is queueing
before the model ran (a slow version shows in its p99 instead). UNKNOWN, a status newer than this
reader, counts as an error: a canary judge should not let an unrecognised failure pass.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import NamedTuple

__all__ = [
    "CALLER_FAULT",
    "NOT_ERRORS",
    "LiveWindows",
    "ResultSample",
    "WindowStats",
    "is_error",
    "percentile",
]

NOT_ERRORS = frozenset({"OK", "INVALID", "NOT_FOUND", "DEADLINE_EXCEEDED"})
"""Statuses that are not the serving version's fault."""

CALLER_FAULT = frozenset({"INVALID", "NOT_FOUND"})
"""Rejected before the model ran: their latency says nothing about the version."""


def is_error(status: str) -> bool:
    return status not in NOT_ERRORS


class ResultSample(NamedTuple):
    """The part of an InferenceResult the windows keep (a tuple: the indexer makes one per
    result, and a frozen dataclass took several times as long to build)."""

    model: str
    version: str
    status: str
    total_ms: float
    completed_at: datetime


@dataclass(frozen=True, slots=True)
class WindowStats:
    count: int = 0
    errors: int = 0
    p99_ms: float | None = None

    @property
    def error_rate(self) -> float:
        return self.errors / self.count if self.count else 0.0


def percentile(ordered: list[float], q: float) -> float | None:
    """The q-quantile (0..1) of sorted values, linearly interpolated like PostgreSQL's
    percentile_cont, so live windows and SQL lineage stats agree."""
    if not ordered:
        return None
    pos = q * (len(ordered) - 1)
    low = math.floor(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


# (completed_at as epoch seconds, error, total_ms or None when the latency is not the version's)
_Entry = tuple[float, bool, float | None]


class LiveWindows:
    """Thread-safe: the indexer adds from its task, the controller reads from its own."""

    def __init__(self, *, max_samples: int = 50_000, horizon_s: float = 3600.0) -> None:
        self.max_samples = max_samples
        self._max_samples = max_samples
        self._horizon_s = horizon_s
        self._entries: dict[tuple[str, str], deque[_Entry]] = {}
        self._lock = threading.Lock()

    def add(self, samples: Iterable[ResultSample]) -> None:
        with self._lock:
            for s in samples:
                key = (s.model, s.version)
                entries = self._entries.get(key)
                if entries is None:
                    entries = self._entries[key] = deque(maxlen=self._max_samples)
                latency = None if s.status in CALLER_FAULT else s.total_ms
                entries.append((s.completed_at.timestamp(), is_error(s.status), latency))
            self._prune(time.time() - self._horizon_s)

    def stats(self, model: str, version: str, since: datetime) -> WindowStats:
        """Stats of the version's results completed at or after `since`."""
        start = since.timestamp()
        with self._lock:
            entries = list(self._entries.get((model, version), ()))
        count = errors = 0
        latencies: list[float] = []
        for at, error, latency in entries:
            if at < start:
                continue  # results arrive roughly, not strictly, in completion order
            count += 1
            errors += error
            if latency is not None:
                latencies.append(latency)
        latencies.sort()
        return WindowStats(count, errors, percentile(latencies, 0.99))

    def keys(self) -> list[tuple[str, str]]:
        with self._lock:
            return sorted(self._entries)

    def _prune(self, oldest: float) -> None:
        # Entries are appended in arrival order, which is close to completion order: dropping
        # from the left while too old keeps memory bounded without a full scan.
        for key in list(self._entries):
            entries = self._entries[key]
            while entries and entries[0][0] < oldest:
                entries.popleft()
            if not entries:
                del self._entries[key]
