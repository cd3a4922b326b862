"""Running one lifecycle command from the CLI: settings from the environment, a session over
PostgreSQL (and Kafka, for writes), output as a table or `--json`, and the exit codes.

Exit codes: 0 done; 1 refused (an invalid transition, the promotion gate, an unknown model) or
failed; 2 usage (typer's own, and malformed arguments); 3 conflict: the model changed since it
was read, nothing was written, look again and decide again.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Awaitable, Callable
from typing import Any, NoReturn, TypeVar

import typer

from tidegate.cli.actor import ACTOR_ENV, act_as, actor
from tidegate.core.errors import ConcurrencyConflictError, TidegateError
from tidegate.lifecycle.operations.commands import LifecycleCommands
from tidegate.lifecycle.operations.sessions import command_session

__all__ = [
    "ACTOR_ENV",
    "EXIT_CONFLICT",
    "EXIT_REFUSED",
    "act_as",
    "actor",
    "emit",
    "parsed",
    "run",
]

T = TypeVar("T")
EXIT_REFUSED = 1
EXIT_CONFLICT = 3


def run(action: Callable[[LifecycleCommands], Awaitable[T]], *, write: bool, as_json: bool) -> T:
    """Run `action` in a session; a refusal or conflict prints why and exits with its code."""

    async def go() -> T:
        async with command_session(write=write) as commands:
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
