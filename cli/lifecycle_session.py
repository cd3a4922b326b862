"""Running one lifecycle command from the CLI: settings from the environment, a session over
PostgreSQL (and Kafka, for writes), output as a table or `--json`, and the exit codes.

Exit codes: 0 done; 1 refused (an invalid transition, the promotion gate, an unknown model) or
failed; 2 usage (typer's own, and malformed arguments); 3 conflict: the model changed since it
was read, nothing was written, look again and decide again.
"""

from __future__ import annotations

import asyncio
import getpass
import json
import os
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, NoReturn, TypeVar

import typer

from tidegate.core.errors import ConcurrencyConflictError, TidegateError
from tidegate.lifecycle.operations.commands import LifecycleCommands

__all__ = [
    "EXIT_CONFLICT",
    "EXIT_REFUSED",
    "actor",
    "emit",
    "parsed",
    "run",
    "session",
]

T = TypeVar("T")
EXIT_REFUSED = 1
EXIT_CONFLICT = 3
_OPEN_TIMEOUT_S = 15.0


def actor() -> str:
    """Who is acting: TIDEGATE_ACTOR, else the login name. Recorded on every event; an
    authenticated identity replaces it when the CLI goes through an authenticated API."""
    explicit = os.environ.get("TIDEGATE_ACTOR", "").strip()
    if explicit:
        return explicit
    try:
        return f"cli:{getpass.getuser()}"
    except (KeyError, OSError):
        return "cli:unknown"


@asynccontextmanager
async def session(*, write: bool) -> AsyncIterator[LifecycleCommands]:
    """Commands over the configured event store. Only writes open a Kafka producer (the outbox
    relay publishes each append at once); reads touch PostgreSQL alone."""
    from tidegate.core.db import make_pool
    from tidegate.core.errors import LifecycleUnavailableError
    from tidegate.core.settings import (
        KafkaSettings,
        PostgresSettings,
        SchemaRegistrySettings,
        TopicSettings,
    )
    from tidegate.lifecycle.eventstore.event_store import EventStore
    from tidegate.lifecycle.eventstore.lifecycle_log import LifecycleLog
    from tidegate.lifecycle.lifecycle_settings import LifecycleSettings
    from tidegate.models.model_settings import ModelSettings
    from tidegate.models.store import LocalArtifactStore

    pg, lc, models = PostgresSettings(), LifecycleSettings(), ModelSettings()
    store = LocalArtifactStore(models)
    if write:
        log = LifecycleLog.from_settings(
            pg, lc, KafkaSettings(), TopicSettings(), SchemaRegistrySettings()
        )
        async with log:
            # One store for reads and appends: one fold cache, so a command reads its stream once.
            yield LifecycleCommands(log, log.pool, store, lc, models=models, events=log.store)
        return
    pool = make_pool(pg, lc)
    try:
        await pool.open(wait=True, timeout=_OPEN_TIMEOUT_S)
    except Exception as exc:
        await pool.close()
        raise LifecycleUnavailableError(f"cannot reach the event store: {exc}") from exc
    try:
        # Reads append nothing; the store itself stands in for the log.
        events = EventStore(pool)
        yield LifecycleCommands(events, pool, store, lc, models=models, events=events)
    finally:
        await pool.close()


def run(action: Callable[[LifecycleCommands], Awaitable[T]], *, write: bool, as_json: bool) -> T:
    """Run `action` in a session; a refusal or conflict prints why and exits with its code."""

    async def go() -> T:
        async with session(write=write) as commands:
            return await action(commands)

    try:
        return asyncio.run(go())
    except ConcurrencyConflictError as exc:
        _fail(exc, as_json, EXIT_CONFLICT, "conflict")
    except TidegateError as exc:
        _fail(exc, as_json, EXIT_REFUSED, "refused")


def _fail(exc: TidegateError, as_json: bool, code: int, label: str) -> NoReturn:
    if as_json:
        body = {"error": str(exc), "code": exc.code, "retriable": exc.retriable}
        typer.echo(json.dumps(body))
    else:
        from rich.console import Console

        Console(stderr=True).print(f"[red]{label}:[/red] {exc}", highlight=False)
    raise typer.Exit(code)


def parsed(parse: Callable[[str], T], value: str, option: str) -> T:
    """A parsed argument, or exit 2 naming the option, like typer's own usage errors."""
    try:
        return parse(value)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint=option) from None


def emit(data: Any, as_json: bool, render: Callable[[Any], Any]) -> None:
    """`--json`: the JSON view on stdout. Otherwise the rich rendering of the same view."""
    if as_json:
        sys.stdout.write(json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")
        return
    from rich.console import Console

    Console().print(render(data))
