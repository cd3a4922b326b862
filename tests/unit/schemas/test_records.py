"""The typed records of schemas/records.py are the `.avsc` files, field for field: a field added,
renamed, retyped or given a default in one and not the other fails here."""

from __future__ import annotations

import json
import typing
from pathlib import Path
from typing import Any, Literal, NotRequired, get_args, get_origin

import fastavro
import pytest

from tidegate.schemas import records
from tidegate.schemas.catalog import INFERENCE_REQUEST, INFERENCE_RESULT, load_schema
from tidegate.schemas.records import RequestRecord, ResultRecord

AVRO = Path(__file__).resolve().parents[3] / "schemas" / "avro"

# Each Avro record by full name, and the TypedDict that mirrors it.
MIRRORS: dict[str, Any] = {
    "dev.tidegate.common.Tensor": records.TensorRecord,
    "dev.tidegate.common.ErrorInfo": records.ErrorRecord,
    "dev.tidegate.common.SourcePosition": records.SourcePositionRecord,
    "dev.tidegate.common.Redelivery": records.RedeliveryRecord,
    "dev.tidegate.inference.ReplyTo": records.ReplyToRecord,
    "dev.tidegate.inference.Timings": records.TimingsRecord,
    "dev.tidegate.inference.InferenceRequest": records.RequestRecord,
    "dev.tidegate.inference.InferenceResult": records.ResultRecord,
}
_PRIMITIVES: dict[str, Any] = {
    "string": str,
    "int": int,
    "long": int,
    "float": float,
    "double": float,
    "boolean": bool,
    "bytes": bytes,
    "null": type(None),
}


def _avro_records() -> dict[str, dict[str, Any]]:
    """Every record schema of the .avsc files, nested ones included, by full name."""
    found: dict[str, dict[str, Any]] = {}

    def walk(schema: Any, namespace: str) -> None:
        if isinstance(schema, list):
            for member in schema:
                walk(member, namespace)
        elif isinstance(schema, dict):
            kind = schema.get("type")
            if kind == "record":
                space = schema.get("namespace", namespace)
                found[f"{space}.{schema['name']}"] = schema
                for field in schema["fields"]:
                    walk(field["type"], space)
            elif kind in ("array", "map"):
                walk(schema.get("items", schema.get("values")), namespace)

    for path in AVRO.glob("*.avsc"):
        schema = json.loads(path.read_text())
        walk(schema, schema.get("namespace", ""))
    return found


def _expected(avro: Any, namespace: str) -> Any:
    """The Python annotation an Avro type reads as."""
    if isinstance(avro, str):
        if avro in _PRIMITIVES:
            return _PRIMITIVES[avro]
        return MIRRORS[avro if "." in avro else f"{namespace}.{avro}"]
    if isinstance(avro, list):
        return typing.Union[tuple(_expected(member, namespace) for member in avro)]  # noqa: UP007
    kind = avro["type"]
    if avro.get("logicalType") == "timestamp-millis":
        return records.Timestamp
    if kind == "array":
        return list[_expected(avro["items"], namespace)]  # type: ignore[misc]
    if kind == "map":
        return dict[str, _expected(avro["values"], namespace)]  # type: ignore[misc]
    if kind == "enum":
        return Literal[tuple(avro["symbols"])]
    if kind == "record":
        return MIRRORS[f"{avro.get('namespace', namespace)}.{avro['name']}"]
    return _expected(kind, namespace)


def _flatten(annotation: Any) -> Any:
    """`X | None` and `Union[X, None]` compare equal; a nested union reads as one."""
    if get_origin(annotation) in (typing.Union, type(int | None)):
        return typing.Union[tuple(_flatten(arg) for arg in get_args(annotation))]  # noqa: UP007
    return annotation


@pytest.mark.parametrize("full_name", sorted(MIRRORS))
def test_each_typed_record_has_the_schemas_fields_types_and_defaults(full_name: str) -> None:
    schema = _avro_records()[full_name]
    mirror = MIRRORS[full_name]
    namespace = full_name.rpartition(".")[0]
    hints = typing.get_type_hints(mirror, include_extras=True)
    assert list(hints) == [field["name"] for field in schema["fields"]], "fields and their order"
    for field in schema["fields"]:
        hint = hints[field["name"]]
        optional = get_origin(hint) is NotRequired
        assert optional == ("default" in field), (
            f"{field['name']}: NotRequired iff it has a default"
        )
        declared = get_args(hint)[0] if optional else hint
        assert _flatten(declared) == _flatten(_expected(field["type"], namespace)), field["name"]


def test_every_record_the_pipeline_carries_has_a_mirror() -> None:
    carried = {
        name
        for name in _avro_records()
        if name.startswith(("dev.tidegate.inference.", "dev.tidegate.common."))
    }
    assert carried == set(MIRRORS)


def test_a_built_request_and_a_minimal_result_encode_with_the_schemas() -> None:
    # What the type admits the encoder takes: the NotRequired fields are the defaulted ones.
    request: RequestRecord = {
        "request_id": "r-1",
        "model": "fraud",
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [1], "data": b"\0\0\0\0"}],
        "created_at": 1_700_000_000_000,
    }
    result: ResultRecord = {
        "request_id": "r-1",
        "model": "fraud",
        "status": "OK",
        "completed_at": 1,
    }
    for value, name in ((request, INFERENCE_REQUEST), (result, INFERENCE_RESULT)):
        assert fastavro.validate(dict(value), load_schema(name).parsed, raise_errors=True)
