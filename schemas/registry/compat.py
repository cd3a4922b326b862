"""Schema compatibility by level, with messages that name the field at fault.

The verdict is always Apache Avro's `ReaderWriterCompatibilityChecker`. Its result merges every
incompatibility into unordered sets of messages and locations, which loses which message belongs to
which field, so when a record pair is incompatible we ask the checker again field by field (and
through arrays and maps) to say exactly which field breaks and why.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

import avro.schema
from avro.compatibility import (
    ReaderWriterCompatibilityChecker,
    SchemaCompatibilityType,
    SchemaIncompatibilityType,
    lookup_writer_field,
    schema_name_equals,
)

from tidegate.core.errors import InvalidCompatibilityLevelError
from tidegate.core.settings import COMPATIBILITY_LEVELS
from tidegate.schemas.registry.parsing import parse_schema

__all__ = ["NEW_SCHEMA", "check_compatibility", "checked_level", "is_compatible"]

NEW_SCHEMA = "the new schema"

_PHRASES = {
    SchemaIncompatibilityType.name_mismatch: "the type name differs",
    SchemaIncompatibilityType.fixed_size_mismatch: "the fixed size differs",
    SchemaIncompatibilityType.missing_enum_symbols: "the reader's enum lacks writer symbols",
}


def check_compatibility(
    new: str,
    existing: Sequence[str],
    level: str,
    *,
    labels: Sequence[str] | None = None,
) -> list[str]:
    """Why `new` breaks `level` against `existing` (oldest first); empty when compatible.

    BACKWARD: the new schema reads data written by the latest one. FORWARD: the latest reads data
    written by the new one. FULL: both. The *_TRANSITIVE levels hold against every schema given.
    `labels` names the existing schemas in messages (default "version 1", "version 2", ...).
    """
    mode = checked_level(level)
    new_avro = parse_schema(new).avro
    if mode == "NONE" or not existing:
        return []
    names = (
        list(labels) if labels is not None else [f"version {i + 1}" for i in range(len(existing))]
    )
    pairs = list(zip(existing, names, strict=True))
    if not mode.endswith("_TRANSITIVE"):
        pairs = pairs[-1:]
    base = mode.removesuffix("_TRANSITIVE")
    messages: list[str] = []
    for text, name in reversed(pairs):
        old_avro = parse_schema(text).avro
        if base in ("BACKWARD", "FULL"):
            messages += _explain_pair(new_avro, old_avro, NEW_SCHEMA, name, mode)
        if base in ("FORWARD", "FULL"):
            messages += _explain_pair(old_avro, new_avro, name, NEW_SCHEMA, mode)
    return messages


def checked_level(level: object) -> str:
    """`level` upper-cased if it is a valid level, else raises `InvalidCompatibilityLevelError`."""
    text = level.upper() if isinstance(level, str) else ""
    if text not in COMPATIBILITY_LEVELS:
        valid = ", ".join(COMPATIBILITY_LEVELS)
        raise InvalidCompatibilityLevelError(
            f"Invalid compatibility level {level!r}; valid levels are {valid}"
        )
    return text


def is_compatible(reader: avro.schema.Schema, writer: avro.schema.Schema) -> bool:
    """Whether `reader` can read everything `writer` writes."""
    result = _checker().get_compatibility(reader, writer)
    return bool(result.compatibility is not SchemaCompatibilityType.incompatible)


def _checker() -> ReaderWriterCompatibilityChecker:
    # One checker per question: its memo table is meant for a single top-level comparison.
    return ReaderWriterCompatibilityChecker()  # type: ignore[no-untyped-call]


def _explain_pair(
    reader: avro.schema.Schema,
    writer: avro.schema.Schema,
    reader_name: str,
    writer_name: str,
    mode: str,
) -> list[str]:
    if is_compatible(reader, writer):
        return []
    found = _explain(reader, writer, "", "", reader_name, writer_name)
    why = f" [{mode}: {reader_name} must read data written by {writer_name}]"
    return [message + why for message in found]


def _explain(
    reader: avro.schema.Schema,
    writer: avro.schema.Schema,
    path: str,
    location: str,
    reader_name: str,
    writer_name: str,
) -> list[str]:
    """Describe why `reader` cannot read `writer`; `path` is a dotted field path, `location` a JSON
    pointer into the reader schema."""
    if isinstance(reader, avro.schema.RecordSchema) and isinstance(
        writer, avro.schema.RecordSchema
    ):
        found = _explain_fields(reader, writer, path, location, reader_name, writer_name)
        if not schema_name_equals(reader, writer):
            found.insert(
                0,
                f"{_where(path)} in {reader_name}: the record name {reader.fullname} differs from "
                f"{writer.fullname} in {writer_name} (add an alias to rename), at {location}/name",
            )
        if found:
            return found
    elif isinstance(reader, avro.schema.ArraySchema) and isinstance(
        writer, avro.schema.ArraySchema
    ):
        return _explain(
            reader.items, writer.items, f"{path}[]", f"{location}/items", reader_name, writer_name
        )
    elif isinstance(reader, avro.schema.MapSchema) and isinstance(writer, avro.schema.MapSchema):
        return _explain(
            reader.values,
            writer.values,
            f"{path}{{}}",
            f"{location}/values",
            reader_name,
            writer_name,
        )
    result = _checker().get_compatibility(reader, writer)
    details = "; ".join(sorted(result.messages)) or "incompatible types"
    kinds = set(result.incompatibilities)
    if len(kinds) == 1 and (phrase := _PHRASES.get(kinds.pop())):
        details = f"{phrase} ({details})"
    # Compatible sub-results keep the root "/" in the merged set; it names nothing.
    pointers = {loc for loc in result.locations if loc != "/"} or {"/"}
    at = ", ".join(sorted(location + (loc if loc != "/" else "") or "/" for loc in pointers))
    return [f"{_where(path)} in {reader_name}: {details}, at {at}"]


def _where(path: str) -> str:
    if not path:
        return "top-level type"
    if path[0] in "[{":
        return f"top-level element '{path}'"
    return f"field '{path}'"


def _explain_fields(
    reader: avro.schema.RecordSchema,
    writer: avro.schema.RecordSchema,
    path: str,
    location: str,
    reader_name: str,
    writer_name: str,
) -> list[str]:
    found: list[str] = []
    for index, field in enumerate(reader.fields):
        field = cast(avro.schema.Field, field)
        field_path = f"{path}.{field.name}" if path else field.name
        field_location = f"{location}/fields/{index}"
        writer_field = lookup_writer_field(writer_schema=writer, reader_field=field)
        if writer_field is None:
            if not field.has_default:
                found.append(
                    f"field '{field_path}' of {reader_name} has no default and is missing from "
                    f"{writer_name}, at {field_location}"
                )
        elif not is_compatible(field.type, writer_field.type):
            found += _explain(
                field.type,
                writer_field.type,
                field_path,
                f"{field_location}/type",
                reader_name,
                writer_name,
            )
    return found
