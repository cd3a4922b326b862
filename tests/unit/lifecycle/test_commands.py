"""The rules of the operator commands (lifecycle.decide) and the argument parsers, no servers."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from tests.unit.lifecycle_events import recorded, registered_and_validated
from tidegate.core.errors import InvalidTransitionError, ModelNotFoundError, PromotionGateError
from tidegate.lifecycle.domain import decide
from tidegate.lifecycle.domain import events as ev
from tidegate.lifecycle.domain.parse import parse_at, parse_steps, parse_weights
from tidegate.lifecycle.domain.render import state_view, version_lineage
from tidegate.lifecycle.domain.state import ModelState, fold


def _state(*payloads: ev.Payload) -> ModelState:
    return fold("fraud", recorded("fraud", payloads))


def _live(*extra: ev.Payload) -> ModelState:
    """fraud 1 primary and warm, 2 validated and warm on a worker, 3 validated but cold."""
    return _state(
        *registered_and_validated("1", "2", "3"),
        ev.Promoted("1"),
        ev.VersionLoaded("1", "w1"),
        ev.VersionLoaded("2", "w1"),
        *extra,
    )


def _gate(agreement: float | None, samples: int, cosine: float | None = None) -> decide.GateResult:
    return decide.evaluate_gate(agreement, cosine, samples, min_agreement=0.9, min_samples=100)


# -- the promotion gate ------------------------------------------------------------------------


def test_gate_passes_on_enough_agreeing_samples() -> None:
    verdict = _gate(0.95, 500)
    assert verdict.passed
    assert (verdict.metric, verdict.value, verdict.samples) == ("agreement", 0.95, 500)


def test_gate_fails_below_the_agreement_or_on_too_few_samples() -> None:
    low = _gate(0.85, 500)
    assert not low.passed
    assert "0.8500 is below the gate 0.9000" in low.reason
    few = _gate(1.0, 99)
    assert not few.passed
    assert "99 shadow comparisons" in few.reason
    none = _gate(None, 0)
    assert not none.passed
    assert none.metric == "none"


def test_gate_judges_embeddings_by_mean_cosine() -> None:
    assert _gate(None, 200, cosine=0.97).passed
    verdict = _gate(None, 200, cosine=0.5)
    assert not verdict.passed
    assert verdict.metric == "cosine"


def test_promote_refuses_below_the_gate_unless_forced_and_records_the_force() -> None:
    state = _live()
    with pytest.raises(PromotionGateError, match="--force"):
        decide.promote(state, "2", _gate(0.5, 500), force=False)
    forced = decide.promote(state, "2", _gate(0.5, 500), force=True)
    assert forced == ev.Promoted("2", forced=True, previous="1", agreement=0.5)
    passed = decide.promote(state, "2", _gate(0.95, 500), force=True)
    assert passed == ev.Promoted("2", forced=False, previous="1", agreement=0.95)


def test_the_first_promotion_needs_no_gate_and_no_warm_up() -> None:
    state = _state(*registered_and_validated("1"))
    assert not decide.needs_gate(state, "1")
    assert decide.promote(state, "1", None, force=False) == ev.Promoted("1")


def test_a_cold_promotion_keeps_traffic_on_the_previous_primary_until_it_warms() -> None:
    promoted = decide.promote(_live(), "3", _gate(0.99, 500), force=False)
    state = _live(promoted)
    assert state.primary == "3"
    assert state.intended_weights() == {"3": 100}
    assert state.effective_weights() == {"1": 100}, "a cold primary must not get traffic"
    assert "1" in state.wanted(), "the previous primary stays loaded for an instant rollback"
    warm = _live(promoted, ev.VersionLoaded("3", "w9"))
    assert warm.effective_weights() == {"3": 100}


def test_the_warm_fallback_of_a_warming_primary_is_kept() -> None:
    warming = _live(ev.Promoted("3", previous="1"))
    with pytest.raises(InvalidTransitionError, match="warms up"):
        decide.retire(warming, "1")
    with pytest.raises(InvalidTransitionError, match="still warming up"):
        decide.promote(warming, "2", _gate(0.99, 500), force=True)
    warm = _live(ev.Promoted("3", previous="1"), ev.VersionLoaded("3", "w1"))
    assert decide.retire(warm, "1") == ev.Retired("1")


def test_promote_refuses_unvalidated_current_or_unknown_versions() -> None:
    state = _live(ev.ModelRegistered("4", "onnx", "u", {}), ev.ValidationFailed("4", "bad graph"))
    with pytest.raises(InvalidTransitionError, match="failed: bad graph"):
        decide.promote(state, "4", None, force=True)
    with pytest.raises(InvalidTransitionError, match="already the primary"):
        decide.promote(state, "1", None, force=True)
    with pytest.raises(ModelNotFoundError):
        decide.promote(state, "9", None, force=True)
    with pytest.raises(ModelNotFoundError):
        decide.promote(ModelState("nope"), "1", None, force=True)


def test_promote_of_another_version_during_a_canary_is_refused() -> None:
    state = _live(ev.CanaryStarted("3", [10, 100]))
    with pytest.raises(InvalidTransitionError, match="canary of version 3"):
        decide.promote(state, "2", _gate(0.99, 500), force=False)


# -- shadow and canary -------------------------------------------------------------------------


def test_shadow_needs_a_validated_non_primary_version_and_a_sane_rate() -> None:
    state = _live()
    assert decide.shadow_start(state, "2", 0.25) == ev.ShadowStarted("2", 0.25)
    with pytest.raises(InvalidTransitionError, match="sample rate"):
        decide.shadow_start(state, "2", 0.0)
    with pytest.raises(InvalidTransitionError, match="is the primary"):
        decide.shadow_start(state, "1", 1.0)
    with pytest.raises(InvalidTransitionError, match="no primary"):
        decide.shadow_start(_state(*registered_and_validated("1", "2")), "2", 1.0)
    with pytest.raises(InvalidTransitionError, match="not being shadowed"):
        decide.shadow_stop(state, "2")
    assert decide.shadow_stop(_live(ev.ShadowStarted("2")), "2") == ev.ShadowStopped(
        "2", "operator"
    )


def test_canary_rules() -> None:
    state = _live()
    started = decide.canary(state, "2", [10, 50, 100], 30.0, {"max_error_rate": 0.1})
    assert started == ev.CanaryStarted("2", [10, 50, 100], 30.0, {"max_error_rate": 0.1}, "1")
    assert decide.canary(state, "2", [100], 1.0, {}).steps == [100]  # blue-green
    for steps in ([], [50, 10, 100], [10, 50], [0, 100], [10, 10, 100], [10, 150]):
        with pytest.raises(InvalidTransitionError):
            decide.canary(state, "2", steps, 30.0, {})
    with pytest.raises(InvalidTransitionError, match="dwell"):
        decide.canary(state, "2", [100], 0.0, {})
    with pytest.raises(InvalidTransitionError, match="dwell"):
        decide.canary(state, "2", [100], float("nan"), {})
    with pytest.raises(InvalidTransitionError, match="finite"):
        decide.canary(state, "2", [100], 1.0, {"max_p99_ratio": float("inf")})
    assert decide.canary(state, "2", [100], 1.0, {"min_p99_gap_ms": 5.0}).thresholds == {
        "min_p99_gap_ms": 5.0
    }
    with pytest.raises(InvalidTransitionError, match="unknown thresholds"):
        decide.canary(state, "2", [100], 1.0, {"max_latency": 1.0})
    with pytest.raises(InvalidTransitionError, match="already has a canary"):
        decide.canary(_live(ev.CanaryStarted("3", [100])), "2", [100], 1.0, {})
    with pytest.raises(InvalidTransitionError, match="already the primary"):
        decide.canary(state, "1", [100], 1.0, {})
    with pytest.raises(InvalidTransitionError, match="no primary"):
        decide.canary(_state(*registered_and_validated("1", "2")), "2", [100], 1.0, {})


# -- rollback ------------------------------------------------------------------------------------


def test_rollback_of_a_running_canary_returns_to_its_baseline() -> None:
    state = _live(ev.CanaryStarted("2", [10, 100]), ev.TrafficShifted({"1": 90, "2": 10}))
    assert decide.rollback_target(state) == ("2", "1")
    event = decide.rollback(state, None, {"candidate_error_rate": 0.5})
    assert event == ev.RolledBack("2", "operator", {"candidate_error_rate": 0.5}, to_version="1")
    with pytest.raises(InvalidTransitionError, match="not 1"):
        decide.rollback(state, "1")


def test_rollback_after_a_promotion_returns_to_the_previous_primary() -> None:
    state = _live(ev.Promoted("2", previous="1"))
    assert decide.rollback(state) == ev.RolledBack("2", "operator", {}, to_version="1")
    after = fold("fraud", recorded("fraud", [*_events_of(state), decide.rollback(state)]))
    assert after.primary == "1"
    assert after.intended_weights() == {"1": 100}


def test_rollback_metrics_count_from_the_canary_start_or_the_promotion() -> None:
    payloads = [*_events_of(_live(ev.Promoted("2", previous="1")))]
    events = recorded("fraud", payloads)
    state = fold("fraud", events)
    assert decide.rollback_window(state, events) == events[-1].occurred_at
    canary = recorded("fraud", [*payloads, ev.CanaryStarted("3", [100])])
    during = fold("fraud", canary)
    assert during.canary is not None
    assert decide.rollback_window(during, canary) == during.canary.started_at


def test_rollback_with_nothing_to_return_to_is_refused() -> None:
    with pytest.raises(InvalidTransitionError, match="nothing to roll back"):
        decide.rollback(_live())
    retired_previous = _live(ev.Promoted("2"), ev.Retired("1"))
    with pytest.raises(InvalidTransitionError, match="nothing to roll back"):
        decide.rollback(retired_previous)


def _events_of(state: ModelState) -> list[ev.Payload]:
    """The payloads `_live` built `state` from, for re-folding with one more event."""
    assert state.primary == "2"
    return [
        *registered_and_validated("1", "2", "3"),
        ev.Promoted("1"),
        ev.VersionLoaded("1", "w1"),
        ev.VersionLoaded("2", "w1"),
        ev.Promoted("2", previous="1"),
    ]


# -- retire ---------------------------------------------------------------------------------------


def test_retire_refuses_the_primary_weighted_canaried_pinned_or_retired_versions() -> None:
    with pytest.raises(InvalidTransitionError, match="is the primary"):
        decide.retire(_live(), "1")
    split = _live(ev.TrafficShifted({"1": 90, "2": 10}))
    with pytest.raises(InvalidTransitionError, match="takes 10%"):
        decide.retire(split, "2")
    with pytest.raises(InvalidTransitionError, match="running canary"):
        decide.retire(_live(ev.CanaryStarted("3", [100])), "3")
    with pytest.raises(InvalidTransitionError, match="routing rules"):
        decide.retire(_live(ev.RoutingRuleSet("pin-acme", "acme", "3")), "3")
    with pytest.raises(InvalidTransitionError, match="already retired"):
        decide.retire(_live(ev.Retired("3")), "3")
    assert decide.retire(_live(), "3") == ev.Retired("3")


def test_a_failed_version_can_be_retired() -> None:
    state = _live(ev.ModelRegistered("4", "onnx", "u", {}), ev.ValidationFailed("4", "corrupt"))
    assert decide.retire(state, "4") == ev.Retired("4")


# -- rules ----------------------------------------------------------------------------------------


def test_pin_unpin_and_experiment_rules() -> None:
    state = _live()
    assert decide.pin(state, "pin-acme", "acme", "2") == ev.RoutingRuleSet(
        "pin-acme", tenant="acme", version="2"
    )
    with pytest.raises(InvalidTransitionError, match="needs a tenant"):
        decide.pin(state, "pin-", "", "2")
    with pytest.raises(InvalidTransitionError, match="no routing rule"):
        decide.unpin(state, "pin-acme")
    pinned = _live(ev.RoutingRuleSet("pin-acme", "acme", "2"))
    assert decide.unpin(pinned, "pin-acme") == ev.RoutingRuleSet("pin-acme")
    rule = decide.experiment(state, "exp", None, {"1": 50, "2": 50})
    assert rule == ev.RoutingRuleSet("exp", None, None, {"1": 50, "2": 50})


def test_experiment_weights_must_be_percentages_summing_to_100_over_servable_versions() -> None:
    state = _live()
    for weights in ({}, {"1": 60, "2": 50}, {"1": 120, "2": -20}, {"1": 99}):
        with pytest.raises(InvalidTransitionError):
            decide.experiment(state, "exp", None, weights)
    with pytest.raises(ModelNotFoundError):
        decide.experiment(state, "exp", None, {"1": 50, "9": 50})
    failed = _live(ev.ModelRegistered("4", "onnx", "u", {}), ev.ValidationFailed("4", "x"))
    with pytest.raises(InvalidTransitionError, match="failed"):
        decide.experiment(failed, "exp", "acme", {"1": 50, "4": 50})


# -- register -------------------------------------------------------------------------------------


def test_register_is_idempotent_for_the_same_content_and_refuses_other_content() -> None:
    sha = {"model.onnx": "a" * 64}
    registered = ev.ModelRegistered("1", "onnx", "u", sha)
    assert decide.register(ModelState("fraud"), "1", sha) == "register"
    # Registered but never validated (interrupted): validate only.
    assert decide.register(_state(registered), "1", sha) == "validate"
    validated = _state(registered, ev.ArtifactValidated("1"))
    assert decide.register(validated, "1", sha) == "unchanged"
    with pytest.raises(InvalidTransitionError, match="immutable"):
        decide.register(validated, "1", {"model.onnx": "b" * 64})
    failed = _state(registered, ev.ValidationFailed("1", "corrupt"))
    assert decide.register(failed, "1", {"model.onnx": "b" * 64}) == "register"
    with pytest.raises(InvalidTransitionError, match="immutable"):
        decide.register(_state(registered, ev.Retired("1")), "1", sha)


# -- views and parsing ----------------------------------------------------------------------------


def test_lineage_and_state_views_are_plain_json() -> None:
    events = recorded(
        "fraud",
        [
            *registered_and_validated("1", "2"),
            ev.Promoted("1"),
            ev.Promoted("2", forced=True, previous="1", agreement=0.5),
        ],
    )
    lineage = version_lineage(events, "2")
    assert lineage["registered_by"] == "test"
    assert lineage["forced"] is True
    assert [e["type"] for e in lineage["events"]] == [
        "ModelRegistered",
        "ArtifactValidated",
        "Promoted",
    ]
    view = state_view(fold("fraud", events))
    assert (view["primary"], view["previous_primary"], view["weights"]) == ("2", "1", {"2": 100})


def test_parse_at_accepts_iso_and_relative_times() -> None:
    now = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
    assert parse_at("-5m", now) == now - timedelta(minutes=5)
    assert parse_at("-90s", now) == now - timedelta(seconds=90)
    assert parse_at("-2h", now) == now - timedelta(hours=2)
    assert parse_at("now", now) == now
    assert parse_at("2026-01-01T10:00:00Z") == datetime(2026, 1, 1, 10, tzinfo=UTC)
    assert parse_at("2026-01-01T10:00:00") == datetime(2026, 1, 1, 10, tzinfo=UTC)
    assert parse_at("2026-01-01T11:00:00+01:00") == datetime(2026, 1, 1, 10, tzinfo=UTC)
    with pytest.raises(ValueError, match="ISO-8601"):
        parse_at("yesterday")


def test_parse_steps_and_weights() -> None:
    assert parse_steps("10, 50,100") == [10, 50, 100]
    assert parse_weights("1=90,2=10") == {"1": 90, "2": 10}
    with pytest.raises(ValueError, match="percentages"):
        parse_steps("10,half")
    for bad in ("1=90,1=10", "1:90", "=5", "1=x"):
        with pytest.raises(ValueError, match="weight"):
            parse_weights(bad)
