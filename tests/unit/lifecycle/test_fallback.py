"""A model's declared fallback: the rule of the command, the fold, the routing table, the views
and the event's Avro form (the envelope's union takes the new branch)."""

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


def state(model: str, *payloads: ev.Payload) -> ModelState:
    return fold(model, recorded(model, payloads))


FRAUD = (*registered_and_validated("1"), ev.Promoted("1"))
LITE = state("fraud-lite", *registered_and_validated("7"), ev.Promoted("7"))


def test_a_fallback_is_declared_folded_and_cleared() -> None:
    fraud = state("fraud", *FRAUD)
    declared = decide.fallback(fraud, LITE, reason="lite is good enough")
    assert declared == ev.FallbackSet("fraud-lite", "lite is good enough")
    after = state("fraud", *FRAUD, declared)
    assert after.fallback_model == "fraud-lite"
    assert RoutingTable.from_state(after).fallback_model == "fraud-lite"
    cleared = decide.fallback(after, None)
    assert cleared == ev.FallbackSet(None, "operator")
    assert state("fraud", *FRAUD, declared, cleared).fallback_model is None


def test_the_fallback_must_be_another_registered_model_with_a_primary() -> None:
    fraud = state("fraud", *FRAUD)
    with pytest.raises(InvalidTransitionError, match="not a registered model"):
        decide.fallback(fraud, ModelState("nobody"))
    with pytest.raises(InvalidTransitionError, match="its own fallback"):
        decide.fallback(fraud, fraud)
    no_primary = state("fraud-lite", *registered_and_validated("7"))
    with pytest.raises(InvalidTransitionError, match="no primary"):
        decide.fallback(fraud, no_primary)
    with pytest.raises(InvalidTransitionError, match="no fallback to clear"):
        decide.fallback(fraud, None)
    with pytest.raises(ModelNotFoundError):
        decide.fallback(ModelState("fraud"), LITE)
    declared = state("fraud", *FRAUD, ev.FallbackSet("fraud-lite"))
    with pytest.raises(InvalidTransitionError, match="already"):
        decide.fallback(declared, LITE)


def test_the_fallback_is_shown_wherever_the_state_is() -> None:
    declared = state("fraud", *FRAUD, ev.FallbackSet("fraud-lite"))
    assert state_view(declared)["fallback"] == "fraud-lite"
    assert summary_view(declared)["fallback"] == "fraud-lite"
    assert table_view(RoutingTable.from_state(declared))["fallback"] == "fraud-lite"
    assert state_view(state("fraud", *FRAUD))["fallback"] is None
    assert describe(ev.FallbackSet("fraud-lite", "why")) == "fallback set to fraud-lite (why)"
    assert describe(ev.FallbackSet(None)) == "fallback cleared"


def test_the_event_is_a_branch_of_the_envelope_with_the_dataclass_fields() -> None:
    name = "dev.tidegate.lifecycle.FallbackSet"
    # Appended after the branches it found: old readers' branches keep their indexes.
    names = event_schemas()
    assert names.index(name) == names.index("dev.tidegate.lifecycle.VersionUnloaded") + 1
    fields = [f["name"] for f in load_schema(name).parsed["fields"]]
    assert fields == ["fallback", "reason"]
    assert Schema(load_schema(name).text, "AVRO").schema_str
