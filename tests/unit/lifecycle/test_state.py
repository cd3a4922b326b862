"""The fold: what each lifecycle event means for a model's state."""

from __future__ import annotations

from tests.unit.lifecycle_events import at, recorded, registered_and_validated
from tidegate.lifecycle.domain import events as ev
from tidegate.lifecycle.domain.state import ModelState, VersionStatus, apply, fold


def _state(*payloads: ev.Payload) -> ModelState:
    return fold("fraud", recorded("fraud", payloads))


def test_register_validate_promote_gives_all_traffic_to_the_version() -> None:
    s = _state(*registered_and_validated("1"), ev.Promoted("1"))
    assert s.primary == "1"
    assert s.intended_weights() == {"1": 100}
    assert s.sequence == 3
    version = s.version("1")
    assert version is not None
    assert version.status is VersionStatus.VALIDATED


def test_a_failed_version_is_never_servable_or_weighted() -> None:
    s = _state(
        ev.ModelRegistered("1", "onnx", "u", {}),
        ev.ValidationFailed("1", "checksum mismatch"),
        ev.TrafficShifted({"1": 100}),
    )
    v = s.version("1")
    assert v is not None
    assert not v.servable
    assert v.weight == 0
    assert v.reason == "checksum mismatch"
    assert s.wanted() == frozenset()


def test_unwarmed_versions_give_their_share_to_the_primary() -> None:
    base = [*registered_and_validated("1", "2"), ev.Promoted("1"), ev.VersionLoaded("1", "w1")]
    s = _state(*base, ev.TrafficShifted({"1": 90, "2": 10}))
    assert s.intended_weights() == {"1": 90, "2": 10}
    assert s.effective_weights() == {"1": 100}
    s = _state(*base, ev.TrafficShifted({"1": 90, "2": 10}), ev.VersionLoaded("2", "w2"))
    assert s.effective_weights() == {"1": 90, "2": 10}
    s = _state(
        *base,
        ev.VersionLoaded("2", "w2"),
        ev.VersionUnloaded("2", "w2"),
        ev.TrafficShifted({"1": 90, "2": 10}),
    )
    assert s.effective_weights() == {"1": 100}


def test_canary_steps_follow_the_traffic_shifts() -> None:
    s = _state(
        *registered_and_validated("1", "2"),
        ev.Promoted("1"),
        ev.CanaryStarted("2", [10, 50, 100], dwell_s=5.0),
    )
    assert s.canary is not None
    assert s.canary.baseline == "1"
    assert s.canary.step == -1
    assert "2" in s.wanted()
    s = apply(
        s, recorded("fraud", [ev.TrafficShifted({"1": 50, "2": 50})], start=s.sequence + 1)[0]
    )
    assert s.canary is not None
    assert s.canary.step == 1
    assert s.canary.step_at is not None


def test_rollback_of_a_canary_returns_traffic_to_the_baseline() -> None:
    s = _state(
        *registered_and_validated("1", "3"),
        ev.Promoted("1"),
        ev.CanaryStarted("3", [10, 100]),
        ev.TrafficShifted({"1": 90, "3": 10}),
        ev.RolledBack("3", "error rate 0.2 > 0.05", {"candidate_error_rate": 0.2}),
    )
    assert s.canary is None
    assert s.primary == "1"
    assert s.intended_weights() == {"1": 100}


def test_rollback_after_promotion_returns_to_the_previous_primary() -> None:
    s = _state(*registered_and_validated("1", "2"), ev.Promoted("1"), ev.Promoted("2"))
    assert (s.primary, s.previous_primary) == ("2", "1")
    s = _state(
        *registered_and_validated("1", "2"),
        ev.Promoted("1"),
        ev.Promoted("2"),
        ev.RolledBack("2", "operator"),
    )
    assert s.primary == "1"
    assert s.intended_weights() == {"1": 100}


def test_shadow_start_stop_and_promotion_ends_the_shadow() -> None:
    s = _state(*registered_and_validated("1", "2"), ev.Promoted("1"), ev.ShadowStarted("2", 0.25))
    assert s.shadows() == {"2": 0.25}
    assert (
        _state(
            *registered_and_validated("1", "2"),
            ev.Promoted("1"),
            ev.ShadowStarted("2"),
            ev.ShadowStopped("2"),
        ).shadows()
        == {}
    )
    assert (
        _state(
            *registered_and_validated("1", "2"),
            ev.Promoted("1"),
            ev.ShadowStarted("2"),
            ev.Promoted("2"),
        ).shadows()
        == {}
    )


def test_retired_version_loses_weight_rules_and_wanted_status() -> None:
    s = _state(
        *registered_and_validated("1", "2"),
        ev.Promoted("2"),
        ev.RoutingRuleSet("acme-pin", tenant="acme", version="1"),
        ev.Retired("1"),
    )
    v = s.version("1")
    assert v is not None
    assert v.status is VersionStatus.RETIRED
    assert "1" not in s.wanted()


def test_rules_are_set_replaced_and_cleared() -> None:
    s = _state(
        *registered_and_validated("1", "2"), ev.RoutingRuleSet("r", tenant="acme", version="1")
    )
    assert [(r.rule_id, r.kind) for r in s.rules] == [("r", "pin")]
    s = apply(
        s, recorded("fraud", [ev.RoutingRuleSet("r", weights={"1": 50, "2": 50})], start=6)[0]
    )
    assert [(r.kind, r.tenant, r.weights) for r in s.rules] == [
        ("experiment", None, (("1", 50), ("2", 50)))
    ]
    s = apply(s, recorded("fraud", [ev.RoutingRuleSet("r")], start=7)[0])
    assert s.rules == ()


def test_duplicates_from_an_outbox_republish_change_nothing() -> None:
    events = recorded("fraud", [*registered_and_validated("1"), ev.Promoted("1")])
    once = fold("fraud", events)
    twice = fold("fraud", [*events[:2], *events, events[-1]])
    assert once == twice


def test_the_fold_is_deterministic_and_time_ordered() -> None:
    events = recorded(
        "fraud", [*registered_and_validated("1", "2"), ev.Promoted("1"), ev.Promoted("2")]
    )
    assert fold("fraud", events) == fold("fraud", list(events))
    before = fold("fraud", [e for e in events if e.occurred_at <= at(5)])
    assert before.primary == "1"
    assert fold("fraud", events).primary == "2"


def test_a_canary_ends_the_candidates_shadow() -> None:
    s = _state(
        *registered_and_validated("1", "2"),
        ev.Promoted("1"),
        ev.ShadowStarted("2"),
        ev.CanaryStarted("2", [10, 100]),
    )
    assert s.shadows() == {}
