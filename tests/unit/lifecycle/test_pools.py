"""A model's pool: the rule of the command, the fold, the routing table, the views and the
event's Avro form (the envelope's union takes the new branch at its end)."""

from __future__ import annotations

import pytest
from confluent_kafka.schema_registry import Schema

from tests.unit.lifecycle_events import recorded, registered_and_validated
from tidegate.core.errors import InvalidTransitionError, ModelNotFoundError
from tidegate.lifecycle.domain import decide
from tidegate.lifecycle.domain import events as ev
from tidegate.lifecycle.domain.render import state_view, summary_view, table_view
from tidegate.lifecycle.domain.routing import RoutingTable
from tidegate.lifecycle.domain.state import ModelState, fold
from tidegate.lifecycle.domain.views import describe
from tidegate.schemas.catalog import event_schemas, load_schema

FRAUD = (*registered_and_validated("1"), ev.Promoted("1"))


def state(*payloads: ev.Payload) -> ModelState:
    return fold("fraud", recorded("fraud", payloads))


def test_a_model_is_placed_in_a_pool_and_back_in_the_default_one() -> None:
    fraud = state(*FRAUD)
    assert fraud.pool is None
    placed = decide.place(fraud, "tabular", reason="plan")
    assert placed == ev.PoolAssigned("tabular", "plan")
    after = state(*FRAUD, placed)
    assert after.pool == "tabular"
    assert RoutingTable.from_state(after).pool == "tabular"
    back = decide.place(after, None)
    assert back == ev.PoolAssigned(None, "operator")
    assert state(*FRAUD, placed, back).pool is None


def test_a_placement_names_a_valid_pool_and_changes_something() -> None:
    fraud = state(*FRAUD)
    for bad in ("", "Tabular", "-x", "a.b", "x" * 41, "tab_ular"):
        with pytest.raises(InvalidTransitionError, match="not valid"):
            decide.place(fraud, bad)
    with pytest.raises(InvalidTransitionError, match="already in the default pool"):
        decide.place(fraud, None)
    with pytest.raises(InvalidTransitionError, match="already in pool tabular"):
        decide.place(state(*FRAUD, ev.PoolAssigned("tabular")), "tabular")
    with pytest.raises(ModelNotFoundError):
        decide.place(ModelState("fraud"), "tabular")


def test_the_pool_is_shown_wherever_the_state_is() -> None:
    placed = state(*FRAUD, ev.PoolAssigned("tabular"))
    assert state_view(placed)["pool"] == "tabular"
    assert summary_view(placed)["pool"] == "tabular"
    assert table_view(RoutingTable.from_state(placed))["pool"] == "tabular"
    assert state_view(state(*FRAUD))["pool"] is None
    assert describe(ev.PoolAssigned("tabular", "plan")) == "placed in pool tabular (plan)"
    assert describe(ev.PoolAssigned(None)) == "placed in the default pool"


def test_the_event_is_the_last_branch_of_the_envelope() -> None:
    name = "dev.tidegate.lifecycle.PoolAssigned"
    assert event_schemas()[-1] == name  # appended: old readers' branches keep their indexes
    assert [f["name"] for f in load_schema(name).parsed["fields"]] == ["pool", "reason"]
    assert Schema(load_schema(name).text, "AVRO").schema_str


def test_a_model_is_warm_in_a_pool_once_a_worker_there_loaded_its_traffic_versions() -> None:
    placed = (*FRAUD, ev.PoolAssigned("tabular"))
    assert not state(*placed).warm_in("tabular")
    loaded = ev.VersionLoaded("1", "w-default")  # a worker older than pools, or the default's
    assert state(*placed, loaded).warm_in(None)
    assert not state(*placed, loaded).warm_in("tabular")
    there = ev.VersionLoaded("1", "w-tab", pool="tabular")
    assert state(*placed, there).warm_in("tabular")
    # A canary's version takes traffic too: it must be loaded there as well.
    canary = (*registered_and_validated("2"), ev.TrafficShifted({"1": 90, "2": 10}))
    assert not state(*placed, *canary, there).warm_in("tabular")
    assert state(*placed, *canary, there, ev.VersionLoaded("2", "w-tab", pool="tabular")).warm_in(
        "tabular"
    )
    gone = ev.VersionUnloaded("1", "w-tab", "evicted")
    assert not state(*placed, there, gone).warm_in("tabular")
    assert state(*placed, there, gone).version("1").loaded_in == frozenset()  # type: ignore[union-attr]
