"""The schema registry's operations, in Confluent Schema Registry's semantics.

Reads look at the state under the log's lock. Writes hold one lock from reading the state to the
log having applied the record, so ids and versions are allocated without races. Every state change
is a record in the log; nothing here mutates the state directly.
"""

from __future__ import annotations

import threading
from contextlib import AbstractContextManager

from tidegate.core.errors import (
    IncompatibleSchemaError,
    SchemaNotFoundError,
    SchemaVersionSoftDeletedError,
    SubjectNotFoundError,
    SubjectSoftDeletedError,
)
from tidegate.schemas.registry.compat import check_compatibility, checked_level
from tidegate.schemas.registry.log import SchemaLog
from tidegate.schemas.registry.parsing import AVRO, parse_schema
from tidegate.schemas.registry.registry_errors import (
    CompatibilityNotConfiguredError,
    SchemaVersionNotSoftDeletedError,
    SubjectNotSoftDeletedError,
)
from tidegate.schemas.registry.registry_state import RegistryState, SchemaVersion
from tidegate.schemas.registry.topic_records import (
    ConfigRecord,
    DeleteSubjectRecord,
    Record,
    SchemaRecord,
    SchemaTombstone,
)
from tidegate.schemas.registry.versions import parse_version, resolve_version

__all__ = ["SchemaRegistry"]


class SchemaRegistry:
    def __init__(self, log: SchemaLog, *, default_compatibility: str = "BACKWARD") -> None:
        self._log = log
        self._default = checked_level(default_compatibility)
        self._write_lock = threading.Lock()

    # lifecycle

    @property
    def ready(self) -> bool:
        return self._log.ready

    def start(self) -> None:
        self._log.start()

    def wait_ready(self, timeout: float) -> bool:
        return self._log.wait_ready(timeout)

    def stop(self) -> None:
        self._log.stop()

    # reads

    def subjects(
        self, *, deleted: bool = False, deleted_only: bool = False, prefix: str | None = None
    ) -> list[str]:
        with self._reading() as state:
            names = state.subject_names(include_deleted=deleted or deleted_only)
            if deleted_only:
                live = set(state.subject_names())
                names = [n for n in names if n not in live]
        return [n for n in names if not prefix or prefix == ":*:" or n.startswith(prefix)]

    def versions(
        self, subject: str, *, deleted: bool = False, deleted_only: bool = False
    ) -> list[int]:
        with self._reading() as state:
            found = state.versions(subject, include_deleted=True)
        live = [v.version for v in found if not v.deleted]
        if not found or not (live or deleted or deleted_only):
            raise SubjectNotFoundError(f"Subject '{subject}' not found.")
        if deleted_only:
            return [v.version for v in found if v.deleted]
        return [v.version for v in found] if deleted else live

    def get_version(
        self, subject: str, version: str | int, *, deleted: bool = False
    ) -> SchemaVersion:
        number = parse_version(version)
        with self._reading() as state:
            return resolve_version(state, subject, number, deleted=deleted)

    def get_schema(self, schema_id: int) -> tuple[str, str]:
        """(schema, schema type) of a global id."""
        with self._reading() as state:
            found = state.schema(schema_id)
        if found is None:
            raise SchemaNotFoundError(f"Schema {schema_id} not found")
        return found

    def max_id(self) -> int:
        with self._reading() as state:
            return state.max_id

    def usages(self, schema_id: int, *, deleted: bool = False) -> list[SchemaVersion]:
        """The (subject, version) pairs that use a global id."""
        self.get_schema(schema_id)
        with self._reading() as state:
            return [v for v in state.usages(schema_id) if deleted or not v.deleted]

    def lookup(
        self, subject: str, schema: object, schema_type: str | None = AVRO, *, deleted: bool = False
    ) -> SchemaVersion:
        """The version of `subject` holding `schema` (whitespace and key order do not matter)."""
        parsed = parse_schema(schema, schema_type)
        with self._reading() as state:
            found = state.versions(subject, include_deleted=deleted)
            schema_id = state.id_of(parsed.identity)
        if not found:
            raise SubjectNotFoundError(f"Subject '{subject}' not found.")
        matches = [v for v in found if v.schema_id == schema_id]
        if not matches:
            raise SchemaNotFoundError(f"Schema not found under subject '{subject}'")
        return matches[-1]

    def get_compatibility(
        self, subject: str | None = None, *, default_to_global: bool = False
    ) -> str:
        with self._reading() as state:
            if subject is not None and subject in state.configs:
                return state.configs[subject]
            if subject is not None and not default_to_global:
                raise CompatibilityNotConfiguredError(
                    f"Subject '{subject}' does not have subject-level compatibility configured"
                )
            return state.configs.get(None, self._default)

    def test_compatibility(
        self,
        subject: str,
        schema: object,
        schema_type: str | None = AVRO,
        version: str | None = None,
    ) -> list[str]:
        """Why `schema` breaks the subject's level: against `version`, or (None) against the
        versions the level names. Empty when compatible, or when there is nothing to compare to."""
        parsed = parse_schema(schema, schema_type)
        number = parse_version(version) if version is not None else None
        with self._reading() as state:
            level = self._level(state, subject)
            live = state.versions(subject)
            if version is not None and (number is not None or live):
                live = [resolve_version(state, subject, number)]
        return check_compatibility(
            parsed.text,
            [v.schema for v in live],
            level,
            labels=[f"version {v.version}" for v in live],
        )

    # writes

    def register(
        self, subject: str, schema: object, schema_type: str | None = AVRO
    ) -> SchemaVersion:
        """Register `schema` under `subject`; an equal schema already there is returned as is."""
        parsed = parse_schema(schema, schema_type)
        with self._write_lock:
            self._log.settle()
            with self._reading() as state:
                every = state.versions(subject, include_deleted=True)
                live = [v for v in every if not v.deleted]
                known_id = state.id_of(parsed.identity)
                for found in live:
                    if found.schema_id == known_id:
                        return found
                level = self._level(state, subject)
                stored = state.schema(known_id) if known_id is not None else None
                schema_id = known_id if known_id is not None else state.max_id + 1
                version = every[-1].version + 1 if every else 1
            problems = check_compatibility(
                parsed.text,
                [v.schema for v in live],
                level,
                labels=[f"version {v.version}" for v in live],
            )
            if problems:
                raise IncompatibleSchemaError(
                    f"Schema being registered is incompatible with an earlier schema for subject "
                    f"'{subject}' (compatibility {level}): " + "; ".join(problems),
                    problems,
                )
            text = stored[0] if stored else parsed.text
            self._log.append(SchemaRecord(subject, version, schema_id, text, False, AVRO))
            with self._log.view() as state:
                return state.subjects[subject][version]

    def set_compatibility(self, subject: str | None, level: object) -> str:
        checked = checked_level(level)
        with self._write_lock:
            self._log.settle()
            self._log.append(ConfigRecord(subject, checked))
        return checked

    def delete_compatibility(self, subject: str | None = None) -> str:
        """Remove a subject's (or the global) level, returning the level it had."""
        with self._write_lock:
            self._log.settle()
            old = self.get_compatibility(subject)
            self._log.append(ConfigRecord(subject, None))
        return old

    def delete_subject(self, subject: str, *, permanent: bool = False) -> list[int]:
        """Soft-delete a subject, or permanently delete a soft-deleted one; returns its versions."""
        with self._write_lock:
            self._log.settle()
            with self._reading() as state:
                every = state.versions(subject, include_deleted=True)
                live = [v for v in every if not v.deleted]
                has_config = subject in state.configs
            if not every:
                raise SubjectNotFoundError(f"Subject '{subject}' not found.")
            records: list[Record]
            if permanent:
                if live:
                    raise SubjectNotSoftDeletedError(
                        f"Subject '{subject}' was not deleted first before being permanently "
                        "deleted; delete it without permanent=true first"
                    )
                records = [SchemaTombstone(subject, v.version) for v in every]
                deleted = every
            else:
                if not live:
                    raise SubjectSoftDeletedError(
                        f"Subject '{subject}' was soft deleted. "
                        "Set permanent=true to delete permanently"
                    )
                records = [DeleteSubjectRecord(subject, live[-1].version)]
                deleted = live
            if has_config:  # Confluent drops the subject's level along with the subject
                records.append(ConfigRecord(subject, None))
            for record in records:
                self._log.append(record)
        return [v.version for v in deleted]

    def delete_version(self, subject: str, version: str | int, *, permanent: bool = False) -> int:
        number = parse_version(version)
        with self._write_lock:
            self._log.settle()
            with self._reading() as state:
                found = resolve_version(
                    state, subject, number, deleted=permanent or number is not None
                )
            if permanent and not found.deleted:
                raise SchemaVersionNotSoftDeletedError(
                    f"Subject '{subject}' Version {found.version} was not deleted first before "
                    "being permanently deleted; delete it without permanent=true first"
                )
            if not permanent and found.deleted:
                raise SchemaVersionSoftDeletedError(
                    f"Subject '{subject}' Version {found.version} was soft deleted. "
                    "Set permanent=true to delete permanently"
                )
            record: Record = (
                SchemaTombstone(subject, found.version)
                if permanent
                else SchemaRecord(
                    subject, found.version, found.schema_id, found.schema, True, found.schema_type
                )
            )
            self._log.append(record)
        return found.version

    # helpers

    def _reading(self) -> AbstractContextManager[RegistryState]:
        self._log.ensure_ready()
        return self._log.view()

    def _level(self, state: RegistryState, subject: str) -> str:
        return state.configs.get(subject) or state.configs.get(None) or self._default
