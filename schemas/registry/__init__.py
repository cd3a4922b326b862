"""tidegate's embedded schema registry: Confluent Schema Registry semantics over a compacted topic.

`SchemaRegistry` holds the operations; it reads and writes state through a `SchemaLog`:
`KafkaLog` in production (the `_schemas` topic, in Confluent's record format) or `MemoryLog` in
tests. `check_compatibility` is the pure compatibility check behind registration. The HTTP adapter
is `tidegate.gateway.admin.registry_api`.
"""

from __future__ import annotations

from tidegate.schemas.registry.compat import check_compatibility
from tidegate.schemas.registry.log import MemoryLog, SchemaLog
from tidegate.schemas.registry.parsing import SUPPORTED_SCHEMA_TYPES
from tidegate.schemas.registry.registry_errors import (
    BadRequestError,
    CompatibilityNotConfiguredError,
    SchemaVersionNotSoftDeletedError,
    SubjectNotSoftDeletedError,
)
from tidegate.schemas.registry.registry_state import SchemaVersion
from tidegate.schemas.registry.service import SchemaRegistry

__all__ = [
    "SUPPORTED_SCHEMA_TYPES",
    "BadRequestError",
    "CompatibilityNotConfiguredError",
    "MemoryLog",
    "SchemaLog",
    "SchemaRegistry",
    "SchemaVersion",
    "SchemaVersionNotSoftDeletedError",
    "SubjectNotSoftDeletedError",
    "check_compatibility",
]
