"""The registry's in-memory state: a pure function of the records applied to it, in log order.

Nothing else mutates it, so replaying the topic from the beginning rebuilds exactly the subjects,
versions, ids and levels the registry had.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from tidegate.schemas.registry.parsing import identity_of
from tidegate.schemas.registry.topic_records import (
    ConfigRecord,
    DeleteSubjectRecord,
    Record,
    SchemaRecord,
    SchemaTombstone,
)

__all__ = ["RegistryState", "SchemaVersion"]


@dataclass(frozen=True)
class SchemaVersion:
    """One version of one subject."""

    subject: str
    version: int
    schema_id: int
    schema: str
    schema_type: str
    deleted: bool


class RegistryState:
    """Subjects, versions, global ids and compatibility levels; the log's lock guards it."""

    def __init__(self) -> None:
        self.subjects: dict[str, dict[int, SchemaVersion]] = {}
        self.configs: dict[str | None, str] = {}
        self.max_id = 0
        self._schemas: dict[int, tuple[str, str]] = {}  # id -> (schema, schema type)
        self._identities: dict[int, str] = {}
        self._ids: dict[str, int] = {}  # identity -> id

    def apply(self, record: Record) -> None:
        if isinstance(record, SchemaRecord):
            self._apply_schema(record)
        elif isinstance(record, SchemaTombstone):
            self._apply_tombstone(record)
        elif isinstance(record, ConfigRecord):
            if record.level is None:
                self.configs.pop(record.subject, None)
            else:
                self.configs[record.subject] = record.level
        elif isinstance(record, DeleteSubjectRecord):
            versions = self.subjects.get(record.subject, {})
            for number, found in versions.items():
                if number <= record.version and not found.deleted:
                    versions[number] = replace(found, deleted=True)

    def _apply_schema(self, record: SchemaRecord) -> None:
        self.max_id = max(self.max_id, record.schema_id)
        if record.schema_id not in self._schemas:
            self._schemas[record.schema_id] = (record.schema, record.schema_type)
            identity = identity_of(record.schema, record.schema_type)
            self._identities[record.schema_id] = identity
            self._ids.setdefault(identity, record.schema_id)
        self.subjects.setdefault(record.subject, {})[record.version] = SchemaVersion(
            subject=record.subject,
            version=record.version,
            schema_id=record.schema_id,
            schema=self._schemas[record.schema_id][0],
            schema_type=record.schema_type,
            deleted=record.deleted,
        )

    def _apply_tombstone(self, record: SchemaTombstone) -> None:
        versions = self.subjects.get(record.subject, {})
        gone = versions.pop(record.version, None)
        if not versions:
            self.subjects.pop(record.subject, None)
        if gone is not None and not self.usages(gone.schema_id):
            # After compaction the tombstoned value is gone from the log too; forgetting the id
            # here keeps a replay of the compacted topic identical to this state.
            identity = self._identities.pop(gone.schema_id, "")
            self._schemas.pop(gone.schema_id, None)
            if self._ids.get(identity) == gone.schema_id:
                del self._ids[identity]

    def versions(self, subject: str, *, include_deleted: bool = False) -> list[SchemaVersion]:
        """The subject's versions, oldest first."""
        found = self.subjects.get(subject, {})
        return [v for _, v in sorted(found.items()) if include_deleted or not v.deleted]

    def subject_names(self, *, include_deleted: bool = False) -> list[str]:
        return sorted(s for s in self.subjects if self.versions(s, include_deleted=include_deleted))

    def schema(self, schema_id: int) -> tuple[str, str] | None:
        """(schema, schema type) of a global id still used by some version, soft-deleted or not."""
        return self._schemas.get(schema_id)

    def id_of(self, identity: str) -> int | None:
        return self._ids.get(identity)

    def usages(self, schema_id: int) -> list[SchemaVersion]:
        """Every version, soft-deleted ones included, that uses the id, by subject and version."""
        return [
            v
            for subject in sorted(self.subjects)
            for _, v in sorted(self.subjects[subject].items())
            if v.schema_id == schema_id
        ]
