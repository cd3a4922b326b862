"""Version ids as the REST API spells them: 1..2^31-1, "latest" or -1."""

from __future__ import annotations

from tidegate.core.errors import InvalidVersionError, SubjectNotFoundError, VersionNotFoundError
from tidegate.schemas.registry.registry_state import RegistryState, SchemaVersion

__all__ = ["parse_version", "resolve_version"]

_MAX_VERSION = 2**31 - 1


def parse_version(value: str | int) -> int | None:
    """The version number, or None for the latest; raises `InvalidVersionError` otherwise."""
    if isinstance(value, str) and value.strip().lower() == "latest":
        return None
    try:
        number = int(value)
    except (TypeError, ValueError):
        number = 0
    if number == -1:
        return None
    if not 1 <= number <= _MAX_VERSION:
        raise InvalidVersionError(
            f"The specified version '{value}' is not a valid version id. "
            f'Allowed values are between [1, 2^31-1] and the string "latest"'
        )
    return number


def resolve_version(
    state: RegistryState, subject: str, number: int | None, *, deleted: bool = False
) -> SchemaVersion:
    """Version `number` (None: the latest live one) of `subject`; soft-deleted ones only if
    `deleted`. A subject whose versions are all soft-deleted is not found unless `deleted`."""
    every = state.versions(subject, include_deleted=True)
    live = [v for v in every if not v.deleted]
    if not every or not (live or deleted):
        raise SubjectNotFoundError(f"Subject '{subject}' not found.")
    if number is None:
        if not live:
            raise VersionNotFoundError(f"Subject '{subject}' has no live version.")
        return live[-1]
    for found in every if deleted else live:
        if found.version == number:
            return found
    raise VersionNotFoundError(f"Version {number} not found.")
