"""Registering the project's schemas with any Confluent-compatible registry.

Compatibility is checked first with the registry's verbose compatibility endpoint, so a refusal
names the field at fault instead of surfacing a bare 409.

Besides the topic subjects it is given, `register_all` registers every lifecycle event type under
its own subject and pins that subject's level (BACKWARD) rather than trusting the registry's
global default: the lifecycle topic is replayed from its first event, so each type must stay
readable by every later reader whatever the registry is configured with.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal
from urllib.parse import quote

import httpx

from tidegate.core.errors import (
    IncompatibleSchemaError,
    InvalidSchemaError,
    RegistryUnavailableError,
)
from tidegate.core.settings import SchemaRegistrySettings
from tidegate.schemas.catalog import (
    EVENT_SUBJECT_COMPATIBILITY,
    SCHEMA_DIR,
    event_subjects,
    load_schema,
)

__all__ = ["Outcome", "RegistryHttp", "register_all"]

_CONTENT_TYPE = "application/vnd.schemaregistry.v1+json"


@dataclass(frozen=True)
class Outcome:
    subject: str
    fullname: str
    schema_id: int
    version: int
    action: Literal["registered", "unchanged"]
    compatibility: str | None = None
    """The subject-level compatibility `register_all` pinned; None where the registry's global
    level applies."""


class RegistryHttp:
    """The few registry calls whose full answers confluent-kafka's client does not return to us."""

    def __init__(self, settings: SchemaRegistrySettings) -> None:
        auth = None
        if settings.basic_auth_user and settings.basic_auth_password:
            auth = (settings.basic_auth_user, settings.basic_auth_password.get_secret_value())
        self._http = httpx.Client(
            base_url=settings.url,
            auth=auth,
            timeout=settings.timeout_s,
            headers={"Content-Type": _CONTENT_TYPE, "Accept": _CONTENT_TYPE},
        )

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> RegistryHttp:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def lookup(self, subject: str, text: str) -> tuple[int, int] | None:
        """(id, version) when `text` is already registered under `subject`."""
        resp = self._post(f"/subjects/{quote(subject, safe='')}", text)
        if resp.status_code == 404:
            return None
        body = self._json(resp)
        return int(body["id"]), int(body["version"])

    def incompatibilities(self, subject: str, text: str) -> list[str]:
        """Why `text` breaks the subject's compatibility level; empty when it does not."""
        path = f"/compatibility/subjects/{quote(subject, safe='')}/versions?verbose=true"
        resp = self._post(path, text)
        if resp.status_code == 404:  # no such subject yet: nothing to be compatible with
            return []
        body = self._json(resp)
        if body.get("is_compatible", False):
            return []
        return [str(m) for m in body.get("messages", [])] or ["incompatible (no details given)"]

    def compatibility(self, subject: str) -> str | None:
        """The subject's own compatibility level; None when it follows the global one."""
        try:
            resp = self._http.get(f"/config/{quote(subject, safe='')}")
        except httpx.HTTPError as exc:
            raise RegistryUnavailableError(f"schema registry unreachable: {exc}") from exc
        if resp.status_code == 404:
            return None
        return str(self._json(resp)["compatibilityLevel"])

    def set_compatibility(self, subject: str, level: str) -> None:
        try:
            resp = self._http.put(
                f"/config/{quote(subject, safe='')}", json={"compatibility": level}
            )
        except httpx.HTTPError as exc:
            raise RegistryUnavailableError(f"schema registry unreachable: {exc}") from exc
        self._json(resp)

    def register(self, subject: str, text: str) -> int:
        resp = self._post(f"/subjects/{quote(subject, safe='')}/versions", text)
        return int(self._json(resp)["id"])

    def _post(self, path: str, text: str) -> httpx.Response:
        try:
            return self._http.post(path, json={"schema": text, "schemaType": "AVRO"})
        except httpx.HTTPError as exc:
            raise RegistryUnavailableError(f"schema registry unreachable: {exc}") from exc

    @staticmethod
    def _json(resp: httpx.Response) -> dict[str, Any]:
        body = resp.json() if resp.content else {}
        if resp.is_success:
            return dict(body)
        message = str(body.get("message", resp.text))
        code = int(body.get("error_code", resp.status_code))
        if code == IncompatibleSchemaError.error_code:
            raise IncompatibleSchemaError(message, [message])
        if code == InvalidSchemaError.error_code:
            raise InvalidSchemaError(message)
        raise RegistryUnavailableError(f"registry answered {resp.status_code}: {message}")


def register_all(
    registry: RegistryHttp,
    subjects: Mapping[str, str],
    *,
    directory: Path = SCHEMA_DIR,
    dry_run: bool = False,
    events: bool = True,
) -> Iterable[Outcome]:
    """Register each subject's schema, refusing the first incompatible one with its reasons.

    With `events`, the lifecycle event types follow the given subjects, each under its full name
    with its level pinned to BACKWARD (a dry run pins nothing).
    """
    plan: list[tuple[str, str, str | None]] = [(s, f, None) for s, f in subjects.items()]
    if events:
        plan += [(s, f, EVENT_SUBJECT_COMPATIBILITY) for s, f in event_subjects(directory).items()]
    for subject, fullname, level in plan:
        schema = load_schema(fullname, directory)
        # Pinned before the compatibility check, so the check applies the level meant for it.
        if level is not None and not dry_run and registry.compatibility(subject) != level:
            registry.set_compatibility(subject, level)
        existing = registry.lookup(subject, schema.text)
        if existing is not None:
            yield Outcome(subject, fullname, existing[0], existing[1], "unchanged", level)
            continue
        problems = registry.incompatibilities(subject, schema.text)
        if problems:
            raise IncompatibleSchemaError(
                f"{fullname} is incompatible with what {subject} already holds", problems
            )
        if dry_run:
            yield Outcome(subject, fullname, -1, -1, "registered", level)
            continue
        schema_id = registry.register(subject, schema.text)
        found = registry.lookup(subject, schema.text)
        version = found[1] if found else -1
        yield Outcome(subject, fullname, schema_id, version, "registered", level)
