"""The canary controller: steps a candidate's traffic up, and rolls it back by itself.

`decide` is the whole policy, pure: from a model's state, the live per-version stats and the
time, it says which events to append next (none, one TrafficShifted, a RolledBack or a
Promoted). `CanaryController` only runs it: each tick it loads the state of every model with an
active canary from the event store (the authority, not a feed that may lag), decides, and appends
with `expected_version` = the state's sequence, so a command that raced it (an operator's manual
rollback, say) wins and the controller re-reads and decides again on the new state.

The policy, per canary:
* step -1: wait until a worker reports the candidate loaded and warm (VersionLoaded), then shift
  to the first step; no weight ever reaches a cold version.
* at each step, judge the candidate's results since the step began against the baseline's: as
  soon as the candidate has `min_requests` results and crosses a threshold, roll back to the
  baseline with the metrics that crossed it.
* after `dwell_s` with at least `min_requests` candidate results, move to the next step; after the
  last step (100) has dwelt, promote. A step with too few results is held, however long: a
  version is never promoted without evidence.
Blue-green is the one-step canary, steps [100].
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Protocol

from prometheus_client import Counter

from tidegate.core.aio import Periodic
from tidegate.core.errors import ConcurrencyConflictError
from tidegate.lifecycle.domain.events import (
    NewEvent,
    Payload,
    Promoted,
    RecordedEvent,
    RolledBack,
    TrafficShifted,
)
from tidegate.lifecycle.domain.state import CanaryState, ModelState, apply
from tidegate.lifecycle.domain.windows import WindowStats
from tidegate.lifecycle.lifecycle_settings import LifecycleSettings

__all__ = [
    "CanaryController",
    "CanaryStore",
    "StatsFn",
    "Thresholds",
    "decide",
    "wilson_lower",
]

_log = logging.getLogger(__name__)

StatsFn = Callable[[str, str, datetime], WindowStats]
"""(model, version, since) -> stats of that version's results completed since then."""

ACTOR = "canary-controller"
_MAX_CONFLICTS = 5

_ACTIONS = Counter(
    "tidegate_canary_actions_total", "Events the canary controller appended.", ["action"]
)
_CONFLICTS = Counter(
    "tidegate_canary_conflicts_total", "Appends that lost a race and were decided again."
)


@dataclass(frozen=True, slots=True)
class Thresholds:
    max_error_rate: float
    max_error_rate_increase: float
    max_p99_ratio: float
    min_requests: int
    confidence_z: float = 1.645
    min_latency_samples: int = 100
    min_p99_gap_ms: float = 10.0

    @classmethod
    def of(cls, canary: CanaryState, settings: LifecycleSettings) -> Thresholds:
        """The canary's own thresholds (CanaryStarted.thresholds), the settings' for the rest."""
        given = dict(canary.thresholds)

        def pick(name: str) -> float:
            return float(given.get(name, getattr(settings, f"canary_{name}")))

        return cls(
            max_error_rate=pick("max_error_rate"),
            max_error_rate_increase=pick("max_error_rate_increase"),
            max_p99_ratio=pick("max_p99_ratio"),
            min_requests=int(pick("min_requests")),
            confidence_z=pick("confidence_z"),
            min_latency_samples=int(pick("min_latency_samples")),
            min_p99_gap_ms=pick("min_p99_gap_ms"),
        )


def wilson_lower(errors: int, count: int, z: float) -> float:
    """The lower end of the Wilson score interval of an error rate: with few results it stays
    well below the observed rate, so one unlucky error does not read as a regression."""
    if count <= 0:
        return 0.0
    p, z2 = errors / count, z * z
    centre = p + z2 / (2 * count)
    margin = z * math.sqrt(p * (1 - p) / count + z2 / (4 * count * count))
    return max(0.0, (centre - margin) / (1 + z2 / count))


def decide(
    state: ModelState, stats: StatsFn, now: datetime, settings: LifecycleSettings
) -> list[Payload]:
    """The events that move the model's active canary on; [] when there is nothing to do."""
    canary = state.canary
    if canary is None or not canary.steps:
        return []
    candidate = state.version(canary.version)
    if candidate is None or not candidate.servable:
        status = candidate.status.value if candidate else "unknown"
        reason = f"candidate {canary.version} is {status}, it cannot take traffic"
        return [RolledBack(canary.version, reason=reason, to_version=canary.baseline)]
    if canary.step < 0 or canary.step_at is None:
        if candidate.ready:
            return [_shift(canary, 0)]
        waited = (now - canary.started_at).total_seconds()
        if waited > settings.canary_warm_timeout_s:
            # Never warmed (every worker fails to load it, or none runs): the canary would
            # otherwise wait forever and block any other rollout of the model.
            reason = f"no worker warmed candidate {canary.version} in {waited:.0f} s"
            return [RolledBack(canary.version, reason=reason, to_version=canary.baseline)]
        return []

    limits = Thresholds.of(canary, settings)
    cand = stats(state.model, canary.version, canary.step_at)
    base = _baseline(state.model, canary, stats, limits)
    where = f"canary step {canary.step + 1}/{len(canary.steps)} ({canary.steps[canary.step]}%)"
    if cand.count >= limits.min_requests:
        breach = _breach(cand, base, limits)
        if breach is not None:
            return [
                RolledBack(
                    canary.version,
                    reason=f"{breach} at {where}",
                    metrics=_metrics(cand, base, limits),
                    to_version=canary.baseline,
                )
            ]
    if (now - canary.step_at).total_seconds() < canary.dwell_s:
        return []
    if cand.count < limits.min_requests:
        return []
    if canary.step + 1 < len(canary.steps):
        return [_shift(canary, canary.step + 1)]
    return [Promoted(canary.version, previous=state.primary)]


def _shift(canary: CanaryState, step: int) -> TrafficShifted:
    share = canary.steps[step]
    weights = {canary.version: share}
    if canary.baseline is not None and share < 100:
        weights[canary.baseline] = 100 - share
    reason = f"canary step {step + 1}/{len(canary.steps)}"
    return TrafficShifted(weights, reason=reason)


def _baseline(model: str, canary: CanaryState, stats: StatsFn, limits: Thresholds) -> WindowStats:
    """The baseline's stats over the same window as the candidate's or, when it served too few
    requests there (the last step gives it none), since one dwell before the canary began."""
    if canary.baseline is None or canary.step_at is None:
        return WindowStats()
    same = stats(model, canary.baseline, canary.step_at)
    if same.count >= limits.min_requests:
        return same
    return stats(model, canary.baseline, canary.started_at - timedelta(seconds=canary.dwell_s))


def _breach(cand: WindowStats, base: WindowStats, limits: Thresholds) -> str | None:
    low = wilson_lower(cand.errors, cand.count, limits.confidence_z)
    if low > limits.max_error_rate:
        return (
            f"candidate error rate {cand.error_rate:.3f} (at least {low:.3f} at "
            f"z={limits.confidence_z:g}) > max_error_rate {limits.max_error_rate:g}"
        )
    if base.count < limits.min_requests:
        return None  # nothing to compare with: only the absolute threshold applies
    increase = low - base.error_rate
    if increase > limits.max_error_rate_increase:
        return (
            f"candidate error rate {cand.error_rate:.3f} (at least {low:.3f}) exceeds "
            f"baseline's {base.error_rate:.3f} by {increase:.3f} > "
            f"max_error_rate_increase {limits.max_error_rate_increase:g}"
        )
    enough = min(cand.count, base.count) >= limits.min_latency_samples
    if enough and cand.p99_ms is not None and base.p99_ms is not None and base.p99_ms > 0:
        ratio = cand.p99_ms / base.p99_ms
        if ratio > limits.max_p99_ratio and cand.p99_ms - base.p99_ms > limits.min_p99_gap_ms:
            return (
                f"candidate p99 {cand.p99_ms:.1f} ms is {ratio:.2f}x baseline's "
                f"{base.p99_ms:.1f} ms > max_p99_ratio {limits.max_p99_ratio:g}"
            )
    return None


def _metrics(cand: WindowStats, base: WindowStats, limits: Thresholds) -> dict[str, float]:
    """The snapshot recorded in RolledBack: both sides' numbers and the limits they met. An
    unknown p99 (no latencies) is left out rather than written as a made-up number."""
    metrics = {
        "candidate_error_rate": cand.error_rate,
        "candidate_error_rate_lower_bound": wilson_lower(
            cand.errors, cand.count, limits.confidence_z
        ),
        "baseline_error_rate": base.error_rate,
        "candidate_requests": float(cand.count),
        "baseline_requests": float(base.count),
        "candidate_errors": float(cand.errors),
        "baseline_errors": float(base.errors),
        **{k: float(v) for k, v in dataclasses.asdict(limits).items()},
    }
    if cand.p99_ms is not None:
        metrics["candidate_p99_ms"] = cand.p99_ms
    if base.p99_ms is not None:
        metrics["baseline_p99_ms"] = base.p99_ms
    return metrics


class CanaryStore(Protocol):
    """What the controller needs of `tidegate.lifecycle.eventstore.event_store.EventStore`."""

    async def load(self, stream: str, *, until: datetime | None = None) -> ModelState: ...

    async def append(
        self, stream: str, events: Sequence[NewEvent], *, expected_version: int | None
    ) -> list[RecordedEvent]: ...

    async def read_all(
        self, *, after_position: int = 0, limit: int = 1000
    ) -> list[RecordedEvent]: ...

    async def streams(self) -> list[str]: ...


class CanaryController:
    """Runs `decide` for every model with an active canary, every `controller_tick_s`.

    Which models have a canary is kept cheaply: the controller folds the store's global log
    incrementally (`read_all` after the last position seen) and rescans every stream every
    `rescan_s`, which catches an event whose transaction committed after a later position had
    already been read. The state it decides on is always a fresh `load`.
    """

    def __init__(
        self,
        store: CanaryStore,
        stats: StatsFn,
        settings: LifecycleSettings,
        *,
        actor: str = ACTOR,
        rescan_s: float = 30.0,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self._store = store
        self._stats = stats
        self._settings = settings
        self._actor = actor
        self._rescan_s = rescan_s
        self._clock = clock
        self._states: dict[str, ModelState] = {}
        self._position = 0
        self._rescanned_at: float | None = None
        self._ticks = Periodic(self.tick, settings.controller_tick_s, name="canary-controller")

    def active(self) -> list[str]:
        """Models with an active canary, as last seen."""
        return sorted(m for m, s in self._states.items() if s.canary is not None)

    async def tick(self) -> list[RecordedEvent]:
        """One round over every active canary; the events appended."""
        await self._discover()
        appended: list[RecordedEvent] = []
        for model in self.active():
            appended.extend(await self.step(model))
        return appended

    async def step(self, model: str) -> list[RecordedEvent]:
        """Load, decide and append for one model, deciding again after a lost race."""
        for _ in range(_MAX_CONFLICTS):
            state = await self._store.load(model)
            self._states[model] = state
            payloads = decide(state, self._stats, self._clock(), self._settings)
            if not payloads:
                return []
            events = [NewEvent(p, actor=self._actor) for p in payloads]
            try:
                recorded = await self._store.append(model, events, expected_version=state.sequence)
            except ConcurrencyConflictError:
                _CONFLICTS.inc()
                continue
            for event in recorded:
                _ACTIONS.labels(event.type).inc()
                _log.info("%s: %s %s", model, event.type, _describe(event.payload))
                self._states[model] = apply(self._states[model], event)
            return recorded
        _log.warning("%s: gave up after %d conflicting appends", model, _MAX_CONFLICTS)
        return []

    def start(self) -> None:
        """Tick every `controller_tick_s` until `stop()`; a failing tick is logged and the next
        one tries again."""
        self._ticks.start()

    async def stop(self) -> None:
        await self._ticks.stop()

    async def _discover(self) -> None:
        now = asyncio.get_running_loop().time()
        if self._rescanned_at is None:
            self._rescanned_at = now  # the first read below starts from position 0 anyway
        elif now - self._rescanned_at >= self._rescan_s:
            self._rescanned_at = now
            for model in await self._store.streams():
                self._states[model] = await self._store.load(model)
        while True:
            events = await self._store.read_all(after_position=self._position, limit=1000)
            for event in events:
                current = self._states.get(event.stream) or ModelState(event.stream)
                self._states[event.stream] = apply(current, event)
                self._position = max(self._position, event.position)
            if len(events) < 1000:
                return


def _describe(payload: Payload) -> str:
    if isinstance(payload, TrafficShifted):
        return f"{payload.weights} ({payload.reason})"
    if isinstance(payload, RolledBack):
        return f"{payload.version} -> {payload.to_version}: {payload.reason}"
    if isinstance(payload, Promoted):
        return payload.version
    return repr(payload)
