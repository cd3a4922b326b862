"""The canary policy (`tidegate.lifecycle.control.canary.decide`), its runner, and the live windows
it reads."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

import pytest

from tests.unit.lifecycle_events import at
from tests.unit.lifecycle_events import recorded as events_at
from tidegate.core.errors import ConcurrencyConflictError
from tidegate.lifecycle.control.canary import CanaryController, Thresholds, decide, wilson_lower
from tidegate.lifecycle.domain import events as ev
from tidegate.lifecycle.domain.state import ModelState, fold
from tidegate.lifecycle.domain.windows import (
    LiveWindows,
    ResultSample,
    WindowStats,
    is_error,
    percentile,
)
from tidegate.lifecycle.lifecycle_settings import LifecycleSettings

SETTINGS = LifecycleSettings(
    canary_max_error_rate=0.05,
    canary_max_error_rate_increase=0.02,
    canary_max_p99_ratio=2.0,
    canary_min_requests=20,
)


def recorded(
    items: Sequence[tuple[float, ev.Payload]], model: str = "fraud"
) -> list[ev.RecordedEvent]:
    return events_at(model, [p for _, p in items], times=[t for t, _ in items])


def base_history(
    steps: list[int] | None = None,
    thresholds: dict[str, float] | None = None,
    dwell_s: float = 60.0,
) -> list[tuple[float, ev.Payload]]:
    return [
        (0, ev.ModelRegistered("v1", "onnx", "store://fraud/v1", {"model.onnx": "a"})),
        (0, ev.ArtifactValidated("v1")),
        (1, ev.VersionLoaded("v1", "w1")),
        (2, ev.Promoted("v1")),
        (3, ev.ModelRegistered("v2", "onnx", "store://fraud/v2", {"model.onnx": "b"})),
        (4, ev.ArtifactValidated("v2")),
        (10, ev.CanaryStarted("v2", steps or [10, 50, 100], dwell_s, thresholds or {})),
    ]


def canary_at_step(
    share: int, step_at: float, thresholds: dict[str, float] | None = None
) -> list[tuple[float, ev.Payload]]:
    history = base_history(thresholds=thresholds)
    history.append((11, ev.VersionLoaded("v2", "w1")))
    weights = {"v2": share, "v1": 100 - share} if share < 100 else {"v2": 100}
    history.append((step_at, ev.TrafficShifted(weights, "canary step")))
    return history


def feed(
    windows: LiveWindows,
    version: str,
    *,
    start: float,
    n: int,
    errors: int = 0,
    ms: float = 10.0,
    status: str = "ERROR",
) -> None:
    windows.add(
        ResultSample("fraud", version, status if i < errors else "OK", ms, at(start + i * 0.01))
        for i in range(n)
    )


@pytest.fixture
def windows() -> LiveWindows:
    return LiveWindows(horizon_s=1e10)  # the test clock is fixed in the past


def test_waits_for_the_candidate_to_warm_then_takes_the_first_step(windows: LiveWindows) -> None:
    state = fold("fraud", recorded(base_history()))
    assert state.canary is not None
    assert state.canary.step == -1
    assert decide(state, windows.stats, at(500), SETTINGS) == []

    warm = fold("fraud", recorded([*base_history(), (11, ev.VersionLoaded("v2", "w1"))]))
    assert decide(warm, windows.stats, at(12), SETTINGS) == [
        ev.TrafficShifted({"v2": 10, "v1": 90}, reason="canary step 1/3")
    ]


def test_a_candidate_no_worker_warms_is_rolled_back_after_the_warm_timeout(
    windows: LiveWindows,
) -> None:
    state = fold("fraud", recorded(base_history()))
    limit = SETTINGS.canary_warm_timeout_s
    assert decide(state, windows.stats, at(10 + limit), SETTINGS) == []
    [rollback] = decide(state, windows.stats, at(11 + limit), SETTINGS)
    assert isinstance(rollback, ev.RolledBack)
    assert rollback.to_version == "v1"
    assert "no worker warmed" in rollback.reason


def test_steps_in_order_after_each_dwell_then_promotes(windows: LiveWindows) -> None:
    history = [*base_history(), (11, ev.VersionLoaded("v2", "w1"))]
    clock = 12.0
    expected: list[ev.Payload] = [
        ev.TrafficShifted({"v2": 10, "v1": 90}, reason="canary step 1/3"),
        ev.TrafficShifted({"v2": 50, "v1": 50}, reason="canary step 2/3"),
        ev.TrafficShifted({"v2": 100}, reason="canary step 3/3"),
        ev.Promoted("v2", previous="v1"),
    ]
    for want in expected:
        state = fold("fraud", recorded(history))
        if state.canary is not None and state.canary.step >= 0:
            # Healthy traffic during the step; one second short of the dwell nothing happens.
            feed(windows, "v2", start=clock - 59, n=30)
            feed(windows, "v1", start=clock - 59, n=30)
            assert decide(state, windows.stats, at(clock - 1), SETTINGS) == []
        assert decide(state, windows.stats, at(clock), SETTINGS) == [want]
        history.append((clock, want))
        clock += 60
    assert fold("fraud", recorded(history)).primary == "v2"


def test_a_step_is_held_past_its_dwell_until_enough_requests(windows: LiveWindows) -> None:
    state = fold("fraud", recorded(canary_at_step(10, 20)))
    feed(windows, "v2", start=21, n=19)
    assert decide(state, windows.stats, at(20 + 3600), SETTINGS) == []
    feed(windows, "v2", start=40, n=1)
    assert decide(state, windows.stats, at(20 + 3600), SETTINGS) == [
        ev.TrafficShifted({"v2": 50, "v1": 50}, reason="canary step 2/3")
    ]


def test_rolls_back_on_the_error_rate_with_a_metrics_snapshot(windows: LiveWindows) -> None:
    state = fold("fraud", recorded(canary_at_step(10, 20)))
    feed(windows, "v2", start=21, n=50, errors=10, ms=12.0)
    feed(windows, "v1", start=21, n=100, errors=1, ms=10.0)
    [rollback] = decide(state, windows.stats, at(25), SETTINGS)  # long before the dwell ends
    assert isinstance(rollback, ev.RolledBack)
    assert rollback.version == "v2"
    assert rollback.to_version == "v1"
    assert "max_error_rate 0.05" in rollback.reason
    assert "step 1/3 (10%)" in rollback.reason
    metrics = dict(rollback.metrics)
    assert metrics.pop("candidate_error_rate_lower_bound") == pytest.approx(
        wilson_lower(10, 50, 1.645)
    )
    assert metrics == {
        "candidate_error_rate": 0.2,
        "baseline_error_rate": 0.01,
        "candidate_requests": 50.0,
        "baseline_requests": 100.0,
        "candidate_errors": 10.0,
        "baseline_errors": 1.0,
        "candidate_p99_ms": 12.0,
        "baseline_p99_ms": 10.0,
        "max_error_rate": 0.05,
        "max_error_rate_increase": 0.02,
        "max_p99_ratio": 2.0,
        "min_requests": 20.0,
        "confidence_z": 1.645,
        "min_latency_samples": 100.0,
        "min_p99_gap_ms": 10.0,
    }
    after = fold("fraud", recorded([*canary_at_step(10, 20), (25, rollback)]))
    assert after.canary is None
    assert after.intended_weights() == {"v1": 100}


def test_not_judged_before_min_requests(windows: LiveWindows) -> None:
    state = fold("fraud", recorded(canary_at_step(10, 20)))
    feed(windows, "v2", start=21, n=19, errors=19)
    assert decide(state, windows.stats, at(30), SETTINGS) == []
    feed(windows, "v2", start=30, n=1, errors=1)
    [rollback] = decide(state, windows.stats, at(31), SETTINGS)
    assert isinstance(rollback, ev.RolledBack)


def test_results_before_the_step_are_not_judged(windows: LiveWindows) -> None:
    feed(windows, "v2", start=0, n=100, errors=100)  # before the step began
    state = fold("fraud", recorded(canary_at_step(10, 20)))
    feed(windows, "v2", start=21, n=30)
    assert decide(state, windows.stats, at(30), SETTINGS) == []


def test_rolls_back_on_an_error_rate_increase_over_the_baseline(windows: LiveWindows) -> None:
    history = canary_at_step(10, 20, thresholds={"max_error_rate": 0.5})
    state = fold("fraud", recorded(history))
    feed(windows, "v2", start=21, n=200, errors=10)
    feed(windows, "v1", start=21, n=200, errors=1)
    # 0.05 (at least 0.030) - 0.005 = 0.025 > 0.02, while under the absolute limit of 0.5.
    [rollback] = decide(state, windows.stats, at(30), SETTINGS)
    assert isinstance(rollback, ev.RolledBack)
    assert "max_error_rate_increase 0.02" in rollback.reason
    assert rollback.metrics["max_error_rate"] == 0.5


def test_within_the_allowed_increase_the_canary_goes_on(windows: LiveWindows) -> None:
    state = fold("fraud", recorded(canary_at_step(10, 20)))
    feed(windows, "v2", start=21, n=100, errors=3, status="UNAVAILABLE")
    feed(windows, "v1", start=21, n=100, errors=2, status="UNAVAILABLE")
    assert decide(state, windows.stats, at(30), SETTINGS) == []


def test_one_early_error_of_a_healthy_candidate_does_not_roll_back(windows: LiveWindows) -> None:
    state = fold("fraud", recorded(canary_at_step(10, 20)))
    feed(windows, "v2", start=21, n=20, errors=1)  # 5%, but at least only 0.9% at 95%
    feed(windows, "v1", start=21, n=200, errors=1)
    assert decide(state, windows.stats, at(25), SETTINGS) == []


def test_a_small_p99_gap_is_noise_whatever_the_ratio(windows: LiveWindows) -> None:
    state = fold("fraud", recorded(canary_at_step(10, 20)))
    feed(windows, "v2", start=21, n=150, ms=9.0)
    feed(windows, "v1", start=21, n=150, ms=3.0)
    assert decide(state, windows.stats, at(25), SETTINGS) == []


def test_rolls_back_on_the_p99_ratio(windows: LiveWindows) -> None:
    state = fold("fraud", recorded(canary_at_step(10, 20)))
    feed(windows, "v2", start=21, n=99, ms=250.0)
    feed(windows, "v1", start=21, n=150, ms=100.0)
    assert decide(state, windows.stats, at(30), SETTINGS) == [], "p99 of too few results"
    feed(windows, "v2", start=22, n=1, ms=250.0)
    [rollback] = decide(state, windows.stats, at(30), SETTINGS)
    assert isinstance(rollback, ev.RolledBack)
    assert "max_p99_ratio 2" in rollback.reason
    assert rollback.metrics["candidate_p99_ms"] == 250.0
    assert rollback.metrics["baseline_p99_ms"] == 100.0


def test_caller_faults_count_neither_as_errors_nor_in_the_p99(
    windows: LiveWindows,
) -> None:
    state = fold("fraud", recorded(canary_at_step(10, 20)))
    feed(windows, "v2", start=21, n=40, errors=20, status="INVALID", ms=190.0)
    feed(windows, "v1", start=21, n=40, errors=20, status="INVALID", ms=100.0)
    assert decide(state, windows.stats, at(30), SETTINGS) == []


def test_blue_green_is_one_step_and_compares_with_the_baseline_before_it(
    windows: LiveWindows,
) -> None:
    history = [*base_history(steps=[100]), (11, ev.VersionLoaded("v2", "w1"))]
    state = fold("fraud", recorded(history))
    assert decide(state, windows.stats, at(12), SETTINGS) == [
        ev.TrafficShifted({"v2": 100}, reason="canary step 1/1")
    ]
    history.append((12, ev.TrafficShifted({"v2": 100}, reason="canary step 1/1")))
    state = fold("fraud", recorded(history))
    # v1 served before the switch, within a dwell before the canary began: its window is that.
    feed(windows, "v1", start=-40, n=100, ms=10.0)
    feed(windows, "v2", start=13, n=150, ms=30.0)
    [rollback] = decide(state, windows.stats, at(14), SETTINGS)
    assert isinstance(rollback, ev.RolledBack)
    assert "max_p99_ratio" in rollback.reason
    assert rollback.metrics["baseline_requests"] == 100.0


def test_blue_green_promotes_after_its_dwell(windows: LiveWindows) -> None:
    history = [
        *base_history(steps=[100], dwell_s=5),
        (11, ev.VersionLoaded("v2", "w1")),
        (12, ev.TrafficShifted({"v2": 100}, reason="canary step 1/1")),
    ]
    state = fold("fraud", recorded(history))
    feed(windows, "v2", start=12, n=30)
    assert decide(state, windows.stats, at(16.9), SETTINGS) == []
    assert decide(state, windows.stats, at(17), SETTINGS) == [ev.Promoted("v2", previous="v1")]


def test_a_candidate_that_failed_validation_is_rolled_back(windows: LiveWindows) -> None:
    history = [*canary_at_step(10, 20), (21, ev.ValidationFailed("v2", "bad checksum"))]
    [rollback] = decide(fold("fraud", recorded(history)), windows.stats, at(22), SETTINGS)
    assert isinstance(rollback, ev.RolledBack)
    assert rollback.to_version == "v1"
    assert "failed" in rollback.reason


def test_no_canary_no_decision(windows: LiveWindows) -> None:
    state = fold("fraud", recorded(base_history()[:4]))
    assert decide(state, windows.stats, at(100), SETTINGS) == []


def test_thresholds_fall_back_to_the_settings() -> None:
    state = fold("fraud", recorded(base_history(thresholds={"min_requests": 5})))
    assert state.canary is not None
    assert Thresholds.of(state.canary, SETTINGS) == Thresholds(0.05, 0.02, 2.0, 5)


# --- the runner: load, decide, append with the expected version ---


class MemoryStore:
    """An in-memory event store with the same optimistic concurrency contract."""

    def __init__(self, items: Sequence[tuple[float, ev.Payload]]) -> None:
        self.events = recorded(items)
        self.race: ev.Payload | None = None

    async def load(self, stream: str, *, until: datetime | None = None) -> ModelState:
        return fold(stream, [e for e in self.events if e.stream == stream])

    async def append(
        self, stream: str, events: Sequence[ev.NewEvent], *, expected_version: int | None
    ) -> list[ev.RecordedEvent]:
        if self.race is not None:  # another writer gets in first
            self._add(stream, [ev.NewEvent(self.race, actor="operator")])
            self.race = None
        current = len(self.events)
        if expected_version is not None and expected_version != current:
            raise ConcurrencyConflictError(stream, expected_version, current)
        return self._add(stream, events)

    def _add(self, stream: str, events: Sequence[ev.NewEvent]) -> list[ev.RecordedEvent]:
        out = []
        for new in events:
            seq = len(self.events) + 1
            out.append(
                ev.RecordedEvent(uuid.uuid4(), stream, seq, seq, at(500), new.payload, new.actor)
            )
            self.events.append(out[-1])
        return out

    async def read_all(
        self, *, after_position: int = 0, limit: int = 1000
    ) -> list[ev.RecordedEvent]:
        return [e for e in self.events if e.position > after_position][:limit]

    async def streams(self) -> list[str]:
        return sorted({e.stream for e in self.events})


async def test_controller_appends_with_the_expected_version(windows: LiveWindows) -> None:
    store = MemoryStore([*base_history(), (11, ev.VersionLoaded("v2", "w1"))])
    controller = CanaryController(store, windows.stats, SETTINGS, clock=lambda: at(12))
    [shifted] = await controller.tick()
    assert shifted.type == "TrafficShifted"
    assert shifted.actor == "canary-controller"
    assert shifted.sequence == 9
    assert controller.active() == ["fraud"]
    assert await controller.tick() == []  # within the dwell


async def test_controller_decides_again_after_losing_a_race(windows: LiveWindows) -> None:
    store = MemoryStore([*base_history(), (11, ev.VersionLoaded("v2", "w1"))])
    store.race = ev.RolledBack("v2", reason="operator", to_version="v1")
    controller = CanaryController(store, windows.stats, SETTINGS, clock=lambda: at(12))
    assert await controller.tick() == []  # re-read: the operator's rollback ended the canary
    assert [e.type for e in store.events][-1] == "RolledBack"
    assert controller.active() == []


# --- the live windows ---


def test_which_statuses_are_the_versions_fault() -> None:
    assert {s for s in ("ERROR", "UNAVAILABLE", "UNKNOWN") if is_error(s)} == {
        "ERROR",
        "UNAVAILABLE",
        "UNKNOWN",
    }
    assert not any(is_error(s) for s in ("OK", "INVALID", "NOT_FOUND", "DEADLINE_EXCEEDED"))


def test_window_stats_since_a_time(windows: LiveWindows) -> None:
    feed(windows, "v1", start=0, n=10, errors=10)
    windows.add(
        ResultSample("fraud", "v1", "ERROR" if i % 4 == 0 else "OK", float(i), at(100 + i))
        for i in range(1, 101)
    )
    stats = windows.stats("fraud", "v1", at(100))
    assert stats.count == 100
    assert stats.errors == 25
    assert stats.error_rate == 0.25
    assert stats.p99_ms == pytest.approx(99.01)  # percentile_cont of 1..100
    assert windows.stats("fraud", "v1", at(0)).count == 110
    assert windows.stats("fraud", "v9", at(0)) == WindowStats()
    assert WindowStats().error_rate == 0.0


def test_windows_are_bounded_in_count_and_age() -> None:
    now = datetime.now(UTC)
    windows = LiveWindows(max_samples=50, horizon_s=60)
    windows.add(ResultSample("m", "v", "OK", 1.0, now) for _ in range(200))
    assert windows.stats("m", "v", now - timedelta(seconds=1)).count == 50
    windows.add([ResultSample("m", "old", "OK", 1.0, now - timedelta(seconds=120))])
    assert windows.keys() == [("m", "v")]


def test_percentile_interpolates_like_percentile_cont() -> None:
    assert percentile([], 0.99) is None
    assert percentile([5.0], 0.99) == 5.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 0.5) == 2.5
