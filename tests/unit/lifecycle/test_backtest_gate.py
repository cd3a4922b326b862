"""The backtest promotion gate (lifecycle.decide.evaluate_backtest, and promote with it), no
database: a recorded backtest is a plain record here."""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta

import pytest

from tests.unit.lifecycle_events import recorded, registered_and_validated
from tidegate.core.errors import PromotionGateError
from tidegate.lifecycle.domain import decide
from tidegate.lifecycle.domain import events as ev
from tidegate.lifecycle.domain.state import ModelState, fold
from tidegate.lifecycle.lifecycle_settings import LifecycleSettings

NOW = datetime(2026, 3, 1, 12, tzinfo=UTC)


@dataclass(frozen=True)
class Facts:
    created_at: datetime = NOW - timedelta(hours=1)
    baseline_versions: tuple[str, ...] = ("1",)
    rows_compared: int = 500
    agreement: float | None = 0.97
    mean_cosine: float | None = None
    max_abs_diff: float | None = 0.2
    error_rate: float = 0.0


def _judge(found: Facts | None, max_abs_diff: float | None = None) -> decide.GateResult:
    return decide.evaluate_backtest(
        found,
        primary="1",
        now=NOW,
        min_agreement=0.9,
        min_rows=100,
        max_age_h=24.0,
        max_error_rate=0.0,
        max_abs_diff=max_abs_diff,
    )


def _live() -> ModelState:
    return fold(
        "fraud",
        recorded(
            "fraud",
            [
                *registered_and_validated("1", "2"),
                ev.Promoted("1"),
                ev.VersionLoaded("1", "w1"),
                ev.VersionLoaded("2", "w1"),
            ],
        ),
    )


def _shadow_ok() -> decide.GateResult:
    return decide.evaluate_gate(0.99, None, 500, min_agreement=0.9, min_samples=100)


def test_a_recent_agreeing_backtest_against_the_primary_passes() -> None:
    verdict = _judge(Facts())
    assert verdict.passed
    assert (verdict.metric, verdict.value, verdict.samples) == ("agreement", 0.97, 500)


@pytest.mark.parametrize(
    ("facts", "max_abs_diff", "reason"),
    [
        (None, None, "no backtest of the candidate is recorded"),
        (Facts(created_at=NOW - timedelta(hours=25)), None, "25.0 h old"),
        (Facts(baseline_versions=("0",)), None, "compared with 0, not the primary 1"),
        (Facts(rows_compared=99), None, "99 rows, fewer than 100"),
        (Facts(error_rate=0.01), None, "error rate 0.0100 exceeds"),
        (Facts(agreement=0.85), None, "agreement 0.8500 is below the gate 0.9000"),
        (Facts(max_abs_diff=0.6), 0.5, "max abs diff 0.6 exceeds 0.5"),
        (Facts(max_abs_diff=float("inf")), 0.5, "max abs diff inf"),
        (Facts(agreement=None), None, "no agreement or cosine"),
    ],
)
def test_the_gate_fails_with_a_reason(
    facts: Facts | None, max_abs_diff: float | None, reason: str
) -> None:
    verdict = _judge(facts, max_abs_diff)
    assert not verdict.passed
    assert reason in verdict.reason


def test_embeddings_are_judged_by_cosine_and_other_models_by_max_abs_diff() -> None:
    cosine = _judge(Facts(agreement=None, mean_cosine=0.95))
    assert (cosine.passed, cosine.metric) == (True, "cosine")
    assert not _judge(Facts(agreement=None, mean_cosine=0.5)).passed
    other = _judge(Facts(agreement=None, max_abs_diff=0.01), 0.05)
    assert (other.passed, other.metric, other.value) == (True, "max_abs_diff", 0.01)


def test_promote_refuses_a_failed_backtest_unless_forced_and_records_the_force() -> None:
    state = _live()
    failed = _judge(None)
    with pytest.raises(PromotionGateError, match=r"no backtest of the candidate.*--force"):
        decide.promote(state, "2", _shadow_ok(), force=False, backtest=failed)
    forced = decide.promote(state, "2", _shadow_ok(), force=True, backtest=failed)
    assert forced == ev.Promoted("2", forced=True, previous="1", agreement=0.99)
    passed = decide.promote(state, "2", _shadow_ok(), force=False, backtest=_judge(Facts()))
    assert passed == ev.Promoted("2", forced=False, previous="1", agreement=0.99)


def test_both_failed_gates_are_named_in_the_refusal() -> None:
    shadow = decide.evaluate_gate(0.5, None, 500, min_agreement=0.9, min_samples=100)
    with pytest.raises(PromotionGateError) as raised:
        decide.promote(
            _live(), "2", shadow, force=False, backtest=_judge(replace(Facts(), rows_compared=3))
        )
    assert "shadow agreement 0.5000" in str(raised.value)
    assert "compared 3 rows" in str(raised.value)


def test_the_backtest_gate_is_off_by_default_and_read_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert LifecycleSettings().require_backtest is False
    monkeypatch.setenv("TIDEGATE_LIFECYCLE_REQUIRE_BACKTEST", "true")
    monkeypatch.setenv("TIDEGATE_LIFECYCLE_BACKTEST_MAX_AGE_H", "2")
    settings = LifecycleSettings()
    assert (settings.require_backtest, settings.backtest_max_age_h) == (True, 2.0)
