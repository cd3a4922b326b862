"""Parsing and normalising the schema text clients send.

Only Avro is supported. A schema is stored as compact JSON (whitespace removed, the client's key
order kept) and recognised by its *identity*: Apache Avro's full JSON form with sorted keys, so that
whitespace, key order and `{"type": "string"}` versus `"string"` do not make two schemas differ,
while docs, defaults, aliases and names still do.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import avro.errors
import avro.schema

from tidegate.core.errors import InvalidSchemaError

__all__ = ["AVRO", "SUPPORTED_SCHEMA_TYPES", "ParsedSchema", "identity_of", "parse_schema"]

AVRO = "AVRO"
SUPPORTED_SCHEMA_TYPES: tuple[str, ...] = (AVRO,)

# avro's parser raises more than AvroException on structurally odd JSON (a number as a name, ...).
_PARSE_ERRORS = (avro.errors.AvroException, TypeError, ValueError, KeyError, AttributeError)


@dataclass(frozen=True)
class ParsedSchema:
    text: str
    identity: str
    avro: avro.schema.Schema


def parse_schema(text: object, schema_type: str | None = AVRO) -> ParsedSchema:
    """Validate `text` as an Avro schema; raises `InvalidSchemaError` with a message for humans."""
    kind = (schema_type or AVRO).upper()
    if kind not in SUPPORTED_SCHEMA_TYPES:
        raise InvalidSchemaError(
            f"schemaType {schema_type!r} is not supported: "
            "tidegate's registry stores AVRO schemas only"
        )
    if not isinstance(text, str) or not text.strip():
        raise InvalidSchemaError("Invalid schema: 'schema' must be a non-empty string of Avro JSON")
    try:
        document = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidSchemaError(
            f"Invalid schema: not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})"
        ) from None
    try:
        parsed = avro.schema.make_avsc_object(document)
    except _PARSE_ERRORS as exc:
        raise InvalidSchemaError(f"Invalid Avro schema: {exc}") from None
    if not isinstance(parsed, avro.schema.Schema):
        raise InvalidSchemaError("Invalid Avro schema: the JSON does not describe an Avro type")
    problem = _first_bad_default(parsed, set())
    if problem:
        raise InvalidSchemaError(f"Invalid Avro schema: {problem}")
    compact = json.dumps(document, separators=(",", ":"), ensure_ascii=False)
    return ParsedSchema(text=compact, identity=_identity(parsed), avro=parsed)


def identity_of(text: str, schema_type: str | None = AVRO) -> str:
    """The identity of stored text; text that no longer parses is recognised verbatim."""
    try:
        return parse_schema(text, schema_type).identity
    except Exception:  # records written by other registries must never stop state replay
        return f"{schema_type}:{text}"


def _identity(parsed: avro.schema.Schema) -> str:
    return json.dumps(parsed.to_json(), sort_keys=True, separators=(",", ":"))


def _first_bad_default(schema: avro.schema.Schema, seen: set[int]) -> str | None:
    # Java's parser (so Confluent's registry) refuses defaults that do not match the field type;
    # Python's avro does not check them, so we do, to refuse what Confluent refuses.
    if id(schema) in seen:
        return None
    seen.add(id(schema))
    children: list[avro.schema.Schema] = []
    if isinstance(schema, avro.schema.RecordSchema):
        for field in schema.fields:
            if field.has_default and not _default_fits(field.type, field.default):
                default, kind = json.dumps(field.default), json.dumps(field.type.to_json())
                return (
                    f"the default {default} of field '{field.name}' in '{schema.fullname}' does "
                    f"not match its type {kind} (a union default must match the union's first type)"
                )
            children.append(field.type)
    elif isinstance(schema, avro.schema.ArraySchema):
        children.append(schema.items)
    elif isinstance(schema, avro.schema.MapSchema):
        children.append(schema.values)
    elif isinstance(schema, avro.schema.UnionSchema):
        children.extend(schema.schemas)
    for child in children:
        problem = _first_bad_default(child, seen)
        if problem:
            return problem
    return None


def _default_fits(schema: avro.schema.Schema, value: Any) -> bool:
    kind = schema.type
    if isinstance(schema, avro.schema.UnionSchema):
        return bool(schema.schemas) and _default_fits(schema.schemas[0], value)
    if kind == "null":
        return value is None
    if kind == "boolean":
        return isinstance(value, bool)
    if kind in ("int", "long"):
        return isinstance(value, int) and not isinstance(value, bool)
    if kind in ("float", "double"):
        return isinstance(value, int | float) and not isinstance(value, bool)
    if kind in ("string", "bytes", "fixed"):
        return isinstance(value, str)
    if isinstance(schema, avro.schema.EnumSchema):
        return isinstance(value, str) and value in schema.symbols
    if isinstance(schema, avro.schema.ArraySchema):
        return isinstance(value, list) and all(_default_fits(schema.items, v) for v in value)
    if isinstance(schema, avro.schema.MapSchema):
        return isinstance(value, dict) and all(
            _default_fits(schema.values, v) for v in value.values()
        )
    if isinstance(schema, avro.schema.RecordSchema):
        if not isinstance(value, dict):
            return False
        return all(
            _default_fits(f.type, value[f.name]) if f.name in value else f.has_default
            for f in schema.fields
        )
    return True
