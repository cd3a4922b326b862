"""Routing decisions over a routing table: explicit versions, rules, sticky weighted splits."""

from __future__ import annotations

from collections import Counter

import pytest

from tests.unit.lifecycle_events import recorded, registered_and_validated
from tidegate.core.errors import ModelNotFoundError
from tidegate.lifecycle.domain import events as ev
from tidegate.lifecycle.domain.routing import RoutingTable, choose_weighted, sampled
from tidegate.lifecycle.domain.state import fold


def _table(*payloads: ev.Payload) -> RoutingTable:
    base = [*registered_and_validated("1", "2", "3"), ev.Promoted("1")]
    loaded = [ev.VersionLoaded(v, "w") for v in ("1", "2", "3")]
    return RoutingTable.from_state(fold("fraud", recorded("fraud", [*base, *loaded, *payloads])))


def test_split_matches_the_weights_within_tolerance() -> None:
    table = _table(ev.TrafficShifted({"1": 70, "2": 30}))
    counts = Counter(table.route(tenant="t", key=f"k{i}").version for i in range(20_000))
    assert abs(counts["2"] / 20_000 - 0.30) < 0.015


def test_keys_are_sticky_and_raising_a_weight_only_moves_keys_onto_that_version() -> None:
    t10 = _table(ev.TrafficShifted({"1": 90, "2": 10}))
    t50 = _table(ev.TrafficShifted({"1": 50, "2": 50}))
    keys = [f"user-{i}" for i in range(5_000)]
    first = {k: t10.route(tenant="t", key=k).version for k in keys}
    assert first == {k: t10.route(tenant="t", key=k).version for k in keys}
    moved_off_candidate = [
        k for k in keys if first[k] == "2" and t50.route(tenant="t", key=k).version != "2"
    ]
    assert moved_off_candidate == []


def test_the_rule_names_the_table_sequence() -> None:
    table = _table(ev.TrafficShifted({"1": 50, "2": 50}))
    assert table.route(tenant="t", key="k").rule == f"split@{table.sequence}"


def test_explicit_version_is_honoured_only_when_servable() -> None:
    table = _table(ev.Retired("3"))
    assert table.route(tenant="t", key="k", requested="2").rule == "explicit-version"
    with pytest.raises(ModelNotFoundError, match="retired"):
        table.route(tenant="t", key="k", requested="3")
    with pytest.raises(ModelNotFoundError, match="unknown"):
        table.route(tenant="t", key="k", requested="9")


def test_pins_then_experiments_come_before_the_split() -> None:
    table = _table(
        ev.RoutingRuleSet("acme-pin", tenant="acme", version="3"),
        ev.RoutingRuleSet("exp", tenant="beta", weights={"2": 100}),
    )
    assert table.route(tenant="acme", key="k").version == "3"
    assert table.route(tenant="acme", key="k").rule == "pin:acme-pin"
    assert table.route(tenant="beta", key="k").rule == "experiment:exp"
    assert table.route(tenant="other", key="k").version == "1"


def test_an_unwarmed_version_never_gets_a_request_while_the_primary_is_warm() -> None:
    table = _table(ev.TrafficShifted({"1": 50, "2": 50}))
    decisions = [table.route(tenant="t", key=f"k{i}", ready=lambda v: v == "1") for i in range(500)]
    assert {d.version for d in decisions} == {"1"}
    assert any(d.rule.startswith("warming-fallback@") for d in decisions)


def test_no_version_with_weight_is_not_found() -> None:
    table = RoutingTable.from_state(fold("fraud", recorded("fraud", registered_and_validated("1"))))
    with pytest.raises(ModelNotFoundError):
        table.route(tenant="t", key="k")


def test_shadow_sampling_follows_the_rate_and_is_stable() -> None:
    hits = sum(sampled("fraud\x002", f"r{i}", 0.25) for i in range(20_000))
    assert abs(hits / 20_000 - 0.25) < 0.015
    assert sampled("fraud\x002", "r1", 0.25) == sampled("fraud\x002", "r1", 0.25)
    table = _table(ev.ShadowStarted("2", 1.0))
    assert table.shadow_targets("r1", served="1") == ["2"]
    assert table.shadow_targets("r1", served="2") == []


def test_weighted_choice_ignores_zero_weights() -> None:
    assert {choose_weighted("m", f"k{i}", [("1", 0), ("2", 100)]) for i in range(200)} == {"2"}


def test_a_worker_that_has_not_warmed_a_new_primary_keeps_serving_the_previous_one() -> None:
    table = _table(ev.Promoted("2"))
    warm_here = {"1"}
    decisions = [
        table.route(tenant="t", key=f"k{i}", ready=lambda v: v in warm_here) for i in range(200)
    ]
    assert {d.version for d in decisions} == {"1"}
    assert {d.rule.split("@")[0] for d in decisions} == {"warming-fallback"}
    warm_here.add("2")
    assert {table.route(tenant="t", key=f"k{i}").version for i in range(200)} == {"2"}


def test_an_experiment_arm_that_is_not_warm_here_gets_no_requests() -> None:
    table = _table(ev.RoutingRuleSet("exp", tenant="beta", weights={"1": 50, "2": 50}))
    decisions = [
        table.route(tenant="beta", key=f"k{i}", ready=lambda v: v == "1") for i in range(200)
    ]
    assert {d.version for d in decisions} == {"1"}
    cold_everywhere = [table.route(tenant="beta", key="k", ready=lambda v: False)]
    assert cold_everywhere[0].rule.startswith("split@"), "no warm arm: the split decides"


def test_a_tenants_own_rule_wins_over_a_rule_for_everyone() -> None:
    table = _table(
        ev.RoutingRuleSet("a-everyone", version="2"),
        ev.RoutingRuleSet("z-acme", tenant="acme", version="3"),
        ev.RoutingRuleSet("b-exp-all", weights={"1": 100}),
        ev.RoutingRuleSet("y-exp-beta", tenant="beta", weights={"2": 100}),
    )
    assert table.route(tenant="acme", key="k").rule == "pin:z-acme"
    assert table.route(tenant="other", key="k").rule == "pin:a-everyone"
    only_experiments = _table(
        ev.RoutingRuleSet("b-exp-all", weights={"1": 100}),
        ev.RoutingRuleSet("y-exp-beta", tenant="beta", weights={"2": 100}),
    )
    assert only_experiments.route(tenant="beta", key="k").rule == "experiment:y-exp-beta"
    assert only_experiments.route(tenant="gamma", key="k").rule == "experiment:b-exp-all"
