"""`tidegate audit`: read the audit trail back, with filters.

The audit topic (`audit-log`) holds every admin action, authentication failure and key change
(`tidegate.clients.audit`). This command reads it without joining or committing any consumer
group (`tidegate.clients.audit_reader`), so reading it changes nothing. It prints a table, or with
`--json` one JSON object per line (JSON Lines), so `--follow --json` streams into `jq`.

Settings come from the environment (TIDEGATE_KAFKA_*, TIDEGATE_TOPICS_*,
TIDEGATE_SCHEMA_REGISTRY_*). Exit codes: 0 done; 1 failed (Kafka or the registry unreachable,
the topic missing); 2 usage.
"""

from __future__ import annotations

import json
import signal
import sys
import threading
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from tidegate.clients.audit_reader import AuditFilter, AuditReader
from tidegate.core.errors import InvalidInputError, TidegateError
from tidegate.core.settings import KafkaSettings, SchemaRegistrySettings, TopicSettings
from tidegate.lifecycle.domain.parse import parse_at

__all__ = ["audit", "entry_view"]


def _when(value: str | None, option: str) -> datetime | None:
    if value is None:
        return None
    try:
        return parse_at(value)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint=option) from None


def entry_view(event: Mapping[str, Any]) -> dict[str, Any]:
    """An entry as plain JSON values: `at` in ISO-8601 UTC with milliseconds."""
    view = dict(event)
    view["at"] = event["at"].isoformat(timespec="milliseconds")
    view["details"] = dict(event.get("details") or {})
    return view


def _cell(value: Any) -> str:
    return "-" if value is None or value == "" else str(value)


def _table(views: Iterable[Mapping[str, Any]]) -> Table:
    table = Table("at", "actor", "action", "target", "outcome", "source", "service")
    table.add_column("details", overflow="fold")
    for v in views:
        outcome = Text(v["outcome"], style="green" if v["outcome"] == "success" else "red")
        details = " ".join(f"{k}={val}" for k, val in sorted(v["details"].items()))
        table.add_row(
            v["at"],
            v["actor"],
            v["action"],
            _cell(v["target"]),
            outcome,
            _cell(v["source"]),
            v["service"],
            _cell(details),
        )
    return table


def _print_line(view: Mapping[str, Any]) -> None:
    sys.stdout.write(json.dumps(view, sort_keys=True) + "\n")
    sys.stdout.flush()


def _follow(reader: AuditReader, where: AuditFilter, limit: int, as_json: bool) -> None:
    """Print entries as they come until Ctrl-C (or SIGTERM), which ends with exit 0."""
    stop = threading.Event()
    previous = {
        sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)
    }
    try:
        for event in reader.follow(where, limit=limit or None, stop=stop):
            view = entry_view(event)
            if as_json:
                _print_line(view)
            else:
                # One line per entry: a table would need every row before it could print.
                fields = ("at", "actor", "action", "target", "outcome", "source", "service")
                details = " ".join(f"{k}={v}" for k, v in sorted(view["details"].items()))
                text = "  ".join(_cell(view[f]) for f in fields)
                sys.stdout.write(f"{text}  {details}".rstrip() + "\n")
                sys.stdout.flush()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def audit(
    since: Annotated[
        str | None,
        typer.Option(help="At or after: ISO-8601 (2026-01-01T12:00:00Z) or a time ago (-1h)."),
    ] = None,
    until: Annotated[str | None, typer.Option(help="Before: ISO-8601 or a time ago (-5m).")] = None,
    actor: Annotated[str | None, typer.Option(help="Only this identity.")] = None,
    action: Annotated[
        str | None, typer.Option(help="Only actions starting with this, e.g. auth. or keys.create.")
    ] = None,
    outcome: Annotated[
        str | None, typer.Option(help="Only this outcome: success, denied or failure.")
    ] = None,
    target: Annotated[str | None, typer.Option(help="Only this target: a model, a key id.")] = None,
    limit: Annotated[int, typer.Option(min=0, help="Only the newest this many (0: all).")] = 100,
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Keep printing new entries until Ctrl-C.")
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="JSON Lines instead of a table.")] = False,
) -> None:
    """Who did what, when, from where, and the outcome: admin actions, authentication
    failures and key changes, oldest first."""
    try:
        where = AuditFilter(
            since=_when(since, "--since"),
            until=_when(until, "--until"),
            actor=actor,
            action=action,
            outcome=outcome,
            target=target,
        )
    except InvalidInputError as exc:
        raise typer.BadParameter(str(exc), param_hint="--until") from None
    topics = TopicSettings()
    try:
        with AuditReader(KafkaSettings(), topics, SchemaRegistrySettings()) as reader:
            if follow:
                _follow(reader, where, limit, as_json)
                return
            views = [entry_view(e) for e in reader.read(where, limit=limit or None)]
            skipped = reader.skipped
    except TidegateError as exc:
        if as_json:
            _print_line({"error": str(exc), "code": exc.code, "retriable": exc.retriable})
        else:
            Console(stderr=True).print(f"[red]failed:[/red] {exc}", highlight=False)
        raise typer.Exit(1) from None
    if as_json:
        for view in views:
            _print_line(view)
        return
    console = Console(width=200)
    console.print(_table(views) if views else Text(f"no audit entries match in {topics.audit}"))
    if limit and len(views) == limit:
        console.print(f"showing the newest {limit} (--limit 0 shows all)")
    if skipped:
        console.print(f"{skipped} messages of {topics.audit} were not audit entries", style="red")
