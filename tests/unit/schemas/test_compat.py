"""The pure compatibility check: every level accepts and rejects, and messages name the field."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tidegate.core.errors import InvalidCompatibilityLevelError, InvalidSchemaError
from tidegate.schemas.registry.compat import check_compatibility


def record(*fields: dict[str, Any], name: str = "Request") -> str:
    return json.dumps({"type": "record", "name": name, "namespace": "t", "fields": list(fields)})


ID = {"name": "id", "type": "string"}
TENANT = {"name": "tenant", "type": "string"}
TENANT_DEFAULT = {"name": "tenant", "type": "string", "default": "acme"}

V_ID = record(ID)
V_TENANT = record(ID, TENANT)
V_TENANT_DEFAULT = record(ID, TENANT_DEFAULT)


@pytest.mark.parametrize(
    ("level", "new", "existing"),
    [
        ("NONE", record({"name": "id", "type": "int"}), [V_ID]),
        ("BACKWARD", V_TENANT_DEFAULT, [V_ID]),
        ("BACKWARD", V_TENANT, [V_ID, V_TENANT_DEFAULT]),  # only the latest counts
        ("BACKWARD_TRANSITIVE", V_TENANT_DEFAULT, [V_ID, V_TENANT]),
        ("FORWARD", V_TENANT, [V_ID]),
        ("FORWARD", V_ID, [V_TENANT, V_TENANT_DEFAULT]),
        ("FORWARD_TRANSITIVE", V_TENANT_DEFAULT, [V_ID, V_TENANT_DEFAULT]),
        ("FULL", V_TENANT_DEFAULT, [V_ID]),
        ("FULL", V_TENANT, [V_ID, V_TENANT_DEFAULT]),
        ("FULL_TRANSITIVE", V_TENANT_DEFAULT, [V_ID, V_TENANT_DEFAULT]),
    ],
)
def test_level_accepts(level: str, new: str, existing: list[str]) -> None:
    assert check_compatibility(new, existing, level) == []


@pytest.mark.parametrize(
    ("level", "new", "existing", "field"),
    [
        ("BACKWARD", V_TENANT, [V_ID], "tenant"),
        ("BACKWARD_TRANSITIVE", V_TENANT, [V_ID, V_TENANT_DEFAULT], "tenant"),
        ("FORWARD", V_ID, [V_TENANT], "tenant"),
        ("FORWARD_TRANSITIVE", V_ID, [V_TENANT, V_TENANT_DEFAULT], "tenant"),
        ("FULL", V_TENANT, [V_ID], "tenant"),
        ("FULL", V_ID, [V_TENANT], "tenant"),
        ("FULL_TRANSITIVE", V_TENANT, [V_ID, V_TENANT_DEFAULT], "tenant"),
        ("BACKWARD", record({"name": "id", "type": "int"}), [V_ID], "id"),
    ],
)
def test_level_rejects_naming_the_field(
    level: str, new: str, existing: list[str], field: str
) -> None:
    messages = check_compatibility(new, existing, level)
    assert messages
    assert all(f"field '{field}'" in m for m in messages), messages
    assert all(level in m for m in messages)


def test_none_still_refuses_an_invalid_schema() -> None:
    with pytest.raises(InvalidSchemaError):
        check_compatibility('{"type": "record"}', [V_ID], "NONE")


def test_missing_default_message_says_so_and_where() -> None:
    [message] = check_compatibility(V_TENANT, [V_ID], "BACKWARD", labels=["version 7"])
    assert "field 'tenant' of the new schema has no default" in message
    assert "missing from version 7" in message
    assert "/fields/1" in message


def test_forward_message_names_the_old_version_as_reader() -> None:
    [message] = check_compatibility(V_ID, [V_TENANT], "FORWARD")
    assert "field 'tenant' of version 1 has no default" in message
    assert "version 1 must read data written by the new schema" in message


def test_nested_fields_are_named_by_path() -> None:
    def with_items(item_type: str) -> str:
        item = {"type": "record", "name": "Item", "fields": [{"name": "qty", "type": item_type}]}
        return record(ID, {"name": "items", "type": {"type": "array", "items": item}})

    [message] = check_compatibility(with_items("int"), [with_items("string")], "BACKWARD")
    assert "field 'items[].qty'" in message
    assert "reader type: int not compatible with writer type: string" in message


def test_promotions_and_union_branches() -> None:
    assert check_compatibility('"long"', ['"int"'], "BACKWARD") == []
    [message] = check_compatibility('["null", "int"]', ['["null", "string"]'], "BACKWARD")
    assert "union" in message
    assert "STRING" in message


def test_enum_symbols_and_record_names() -> None:
    two = json.dumps({"type": "enum", "name": "E", "symbols": ["A", "B"]})
    one = json.dumps({"type": "enum", "name": "E", "symbols": ["A"]})
    assert check_compatibility(two, [one], "BACKWARD") == []
    [message] = check_compatibility(one, [two], "BACKWARD")
    assert "enum lacks" in message
    assert "B" in message
    [renamed] = check_compatibility(record(ID, name="Other"), [V_ID], "BACKWARD")
    assert "record name t.Other differs from t.Request" in renamed


def test_several_problems_give_one_message_each() -> None:
    new = record({"name": "id", "type": "int"}, TENANT)
    messages = check_compatibility(new, [V_ID], "BACKWARD")
    assert len(messages) == 2
    assert any("field 'id'" in m for m in messages)
    assert any("field 'tenant'" in m for m in messages)


def test_no_existing_schema_is_compatible() -> None:
    assert check_compatibility(V_TENANT, [], "FULL_TRANSITIVE") == []


def test_levels_are_case_insensitive_and_checked() -> None:
    assert check_compatibility(V_TENANT_DEFAULT, [V_ID], "full") == []
    with pytest.raises(InvalidCompatibilityLevelError):
        check_compatibility(V_ID, [V_ID], "SIDEWAYS")
