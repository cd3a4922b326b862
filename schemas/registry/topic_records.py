"""The records of the registry topic, in the format Confluent Schema Registry and Karapace use.

Keys are compact JSON with Confluent's key order, so the topic compacts the same way and a Confluent
or Karapace registry can adopt it:

- `{"keytype":"SCHEMA","subject":S,"version":V,"magic":1}` ->
  `{"subject":S,"version":V,"id":N,"schema":"...","deleted":false}` (+ `schemaType` if not AVRO);
  a null value (tombstone) is a permanent delete of that version.
- `{"keytype":"CONFIG","subject":S or null,"magic":0}` -> `{"compatibilityLevel":"..."}`; null
  value removes the subject's (or the global) level.
- `{"keytype":"DELETE_SUBJECT","subject":S,"magic":0}` -> `{"subject":S,"version":V}`: versions up
  to V are soft-deleted.

Other key types (NOOP, MODE, CONTEXT, ...) are decoded as `None` and ignored.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from tidegate.schemas.registry.parsing import AVRO

__all__ = [
    "ConfigRecord",
    "DeleteSubjectRecord",
    "Record",
    "SchemaRecord",
    "SchemaTombstone",
    "decode_record",
    "encode_record",
]


@dataclass(frozen=True)
class SchemaRecord:
    subject: str
    version: int
    schema_id: int
    schema: str
    deleted: bool = False
    schema_type: str = AVRO


@dataclass(frozen=True)
class SchemaTombstone:
    subject: str
    version: int


@dataclass(frozen=True)
class ConfigRecord:
    subject: str | None
    level: str | None  # None removes the level


@dataclass(frozen=True)
class DeleteSubjectRecord:
    subject: str
    version: int


Record = SchemaRecord | SchemaTombstone | ConfigRecord | DeleteSubjectRecord


def _dump(data: dict[str, Any]) -> bytes:
    return json.dumps(data, separators=(",", ":"), ensure_ascii=False).encode()


def encode_record(record: Record) -> tuple[bytes, bytes | None]:
    """The (key, value) bytes of `record`; value None is a tombstone."""
    if isinstance(record, SchemaRecord | SchemaTombstone):
        key = _dump(
            {"keytype": "SCHEMA", "subject": record.subject, "version": record.version, "magic": 1}
        )
        if isinstance(record, SchemaTombstone):
            return key, None
        value: dict[str, Any] = {
            "subject": record.subject,
            "version": record.version,
            "id": record.schema_id,
            "schema": record.schema,
            "deleted": record.deleted,
        }
        if record.schema_type != AVRO:
            value["schemaType"] = record.schema_type
        return key, _dump(value)
    if isinstance(record, ConfigRecord):
        key = _dump({"keytype": "CONFIG", "subject": record.subject, "magic": 0})
        if record.level is None:
            return key, None
        return key, _dump({"compatibilityLevel": record.level})
    key = _dump({"keytype": "DELETE_SUBJECT", "subject": record.subject, "magic": 0})
    return key, _dump({"subject": record.subject, "version": record.version})


def decode_record(key: bytes | None, value: bytes | None) -> Record | None:
    """Decode one topic record; `None` for key types the registry does not use.

    Raises `ValueError` (or `KeyError`/`TypeError`) on a record that is not valid JSON of its type.
    """
    if not key:
        raise ValueError("record without a key")
    key_data = json.loads(key)
    keytype = key_data["keytype"]
    value_data = json.loads(value) if value else None
    if keytype == "SCHEMA":
        subject, version = str(key_data["subject"]), int(key_data["version"])
        if not isinstance(value_data, dict):
            return SchemaTombstone(subject, version)
        return SchemaRecord(
            subject=str(value_data.get("subject", subject)),
            version=int(value_data.get("version", version)),
            schema_id=int(value_data["id"]),
            schema=str(value_data["schema"]),
            deleted=bool(value_data.get("deleted", False)),
            schema_type=str(value_data.get("schemaType") or AVRO),
        )
    if keytype == "CONFIG":
        subject = key_data.get("subject")
        level = value_data.get("compatibilityLevel") if isinstance(value_data, dict) else None
        return ConfigRecord(
            None if subject is None else str(subject), str(level) if level else None
        )
    if keytype == "DELETE_SUBJECT":
        if not isinstance(value_data, dict):
            return None
        return DeleteSubjectRecord(str(key_data["subject"]), int(value_data["version"]))
    return None
