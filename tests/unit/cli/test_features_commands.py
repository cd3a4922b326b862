"""`tidegate features put` arguments: named features, or a declared row in order."""

from __future__ import annotations

import pytest
import typer

from tidegate.agents.stages.feature_settings import FeatureSettings
from tidegate.cli.features_commands import parse_assignments, row_values

SETTINGS = FeatureSettings(
    declared={"fraud": {"features": ("a", "b")}, "fraud@2": {"features": ("b", "a")}}
)


def test_named_features_are_name_equals_number() -> None:
    assert parse_assignments(["a=1.5", "b=-2"]) == {"a": 1.5, "b": -2.0}
    for bad in (["a"], ["=1"], ["a=x"], ["a=1", "a=2"]):
        with pytest.raises(typer.BadParameter):
            parse_assignments(bad)


def test_a_row_is_named_by_the_declared_features_in_order() -> None:
    assert row_values(SETTINGS, "fraud", None, "1, 2") == {"a": 1.0, "b": 2.0}
    assert row_values(SETTINGS, "fraud", "2", "1,2") == {"b": 1.0, "a": 2.0}
    for model, row in (("other", "1,2"), ("fraud", "1"), ("fraud", "1,x")):
        with pytest.raises(typer.BadParameter):
            row_values(SETTINGS, model, None, row)


def test_declarations_are_checked() -> None:
    for bad in ({"m": {"x": ()}}, {"m": {"x": ("a", "a")}}, {"m": {"x": ("_updated_at",)}}):
        with pytest.raises(ValueError, match="m: "):
            FeatureSettings(declared=bad)
