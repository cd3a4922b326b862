"""`tidegate dlq ...`: inspect the dead-letter and poison topics, and redrive them after a fix.

`list`, `show` and `stats` read the topics without joining or committing any consumer group
(`tidegate.dlq.inspect`); `redrive` republishes the selected letters at a bounded rate, with a
progress bar on stderr, and prints what happened to each (`tidegate.dlq.redrive`). Every command
prints tables, or with `--json` the same views the admin API answers with (docs/dlq.md).

Settings come from the environment (TIDEGATE_KAFKA_*, TIDEGATE_TOPICS_*,
TIDEGATE_SCHEMA_REGISTRY_*). Exit codes: 0 done; 1 failed (Kafka or the registry unreachable, a
letter not found, a redrive with failed or unacknowledged messages, or stopped early); 2 usage.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from collections.abc import Callable, Coroutine
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text

from tidegate.core.errors import InvalidInputError, TidegateError
from tidegate.core.settings import KafkaSettings, SchemaRegistrySettings, TopicSettings
from tidegate.dlq.inspect import dead_letter_topics, find_letter, letter_stats, list_letters
from tidegate.dlq.letters import LetterFilter, letter_view
from tidegate.dlq.redelivery import parse_position
from tidegate.dlq.redrive import Redrive, redrive_source
from tidegate.dlq.redrive_report import DEFAULT_RATE, RedriveOptions, RedriveProgress, new_run_id
from tidegate.lifecycle.domain.parse import parse_at

__all__ = ["app"]

T = TypeVar("T")
app = typer.Typer(no_args_is_help=True)
_SHOWN_FAILURES = 20

TopicOpt = Annotated[
    str,
    typer.Option(
        "--topic", help="failed, poison, all (both), or a failed, poison or retry topic's name."
    ),
]
ModelOpt = Annotated[
    list[str] | None, typer.Option("--model", help="Only this model (repeat for several).")
]
VersionOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--version",
        help="Only this model version (repeat for several). A letter's version is known when "
        "the error names it or the request pinned one; letters of unknown version never match.",
    ),
]
CodeOpt = Annotated[
    list[str] | None,
    typer.Option("--code", help="Only this error code, e.g. MODEL_ERROR (repeat for several)."),
]
SinceOpt = Annotated[
    str | None,
    typer.Option(help="Failed at or after: ISO-8601 (2026-01-01T12:00:00Z) or a time ago (-1h)."),
]
UntilOpt = Annotated[str | None, typer.Option(help="Failed at or before: ISO-8601 or -5m.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON instead of tables.")]


def _settings() -> tuple[KafkaSettings, TopicSettings, SchemaRegistrySettings]:
    return KafkaSettings(), TopicSettings(), SchemaRegistrySettings()


def _when(value: str | None, option: str) -> Any:
    if value is None:
        return None
    try:
        return parse_at(value)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint=option) from None


def _filter(
    model: list[str] | None,
    version: list[str] | None,
    code: list[str] | None,
    since: str | None,
    until: str | None,
) -> LetterFilter:
    return _guard(
        lambda: LetterFilter.build(
            models=model,
            versions=version,
            codes=code,
            since=_when(since, "--since"),
            until=_when(until, "--until"),
        )
    )


def _guard(action: Callable[[], T]) -> T:
    """Input errors are usage errors (exit 2), naming the option."""
    try:
        return action()
    except InvalidInputError as exc:
        hint = f"--{exc.field.replace('_', '-')}" if exc.field else None
        raise typer.BadParameter(str(exc), param_hint=hint) from None


def _run(coro: Callable[[], Coroutine[Any, Any, T]], as_json: bool) -> T:
    try:
        return asyncio.run(coro())
    except InvalidInputError as exc:
        hint = f"--{exc.field.replace('_', '-')}" if exc.field else None
        raise typer.BadParameter(str(exc), param_hint=hint) from None
    except TidegateError as exc:
        if as_json:
            typer.echo(
                json.dumps({"error": str(exc), "code": exc.code, "retriable": exc.retriable})
            )
        else:
            Console(stderr=True).print(f"[red]failed:[/red] {exc}", highlight=False)
        raise typer.Exit(1) from None


def _print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")


def _cell(value: Any, width: int | None = None) -> str:
    text = "-" if value is None or value == "" else str(value)
    if width is not None and len(text) > width:
        return text[: width - 1] + "…"
    return text


# -- list, show, stats ----------------------------------------------------------------------------


@app.command("list")
def list_command(
    topic: TopicOpt = "all",
    model: ModelOpt = None,
    version: VersionOpt = None,
    code: CodeOpt = None,
    since: SinceOpt = None,
    until: UntilOpt = None,
    limit: Annotated[int, typer.Option(min=0, help="Show at most this many (0: all).")] = 100,
    as_json: JsonOpt = False,
) -> None:
    """List dead letters, oldest first per partition."""
    kafka, topics, registry = _settings()
    names = _guard(lambda: dead_letter_topics(topics, topic))
    letters = _filter(model, version, code, since, until)
    found, more = _run(
        lambda: list_letters(kafka, registry, names, letters, limit=limit or None), as_json
    )
    views = [letter_view(letter) for letter in found]
    if as_json:
        _print_json({"topics": names, "count": len(views), "truncated": more, "messages": views})
        return
    table = Table("position", "failed at", "model", "version", "code", "request id", "attempt")
    table.add_column("message", overflow="fold")
    for v in views:
        table.add_row(
            f"{v['topic']}:{v['partition']}:{v['offset']}",
            _cell(v["failed_at"]),
            _cell(v["model"]),
            _cell(v["version"]),
            v["code"],
            _cell(v["request_id"]),
            _cell(v["attempt"]),
            _cell(v["message"], 80),
        )
    console = Console(width=200)
    console.print(table if views else Text(f"no dead letters match in {', '.join(names)}"))
    if more:
        console.print(f"showing the first {len(views)}; more match (--limit 0 shows all)")


@app.command("show")
def show(
    position: Annotated[str, typer.Argument(help="The letter's TOPIC:PARTITION:OFFSET.")],
    as_json: JsonOpt = False,
) -> None:
    """Everything about one dead letter: the error, its history, the original key, value,
    headers and decoded request."""
    kafka, topics, registry = _settings()
    try:
        where = parse_position(position)
    except ValueError:
        raise typer.BadParameter(
            f"{position!r} is not TOPIC:PARTITION:OFFSET", param_hint="POSITION"
        ) from None
    try:
        dead_letter_topics(topics, where["topic"])
    except InvalidInputError as exc:
        raise typer.BadParameter(str(exc), param_hint="POSITION") from None
    letter = _run(
        lambda: find_letter(kafka, registry, where["topic"], where["partition"], where["offset"]),
        as_json,
    )
    if letter is None:
        if as_json:
            typer.echo(json.dumps({"error": f"no dead letter at {position}", "code": "NOT_FOUND"}))
        else:
            Console(stderr=True).print(f"no dead letter at {position}", highlight=False)
        raise typer.Exit(1)
    view = letter_view(letter, full=True)
    if as_json:
        _print_json(view)
        return
    Console(width=200).print(_show_render(view))


def _show_render(view: dict[str, Any]) -> RenderableType:
    fields = Table(
        "field",
        "value",
        show_header=False,
        title=f"{view['topic']}:{view['partition']}:{view['offset']}",
    )
    for name in (
        "request_id",
        "model",
        "version",
        "code",
        "message",
        "retriable",
        "attempt",
        "failed_at",
        "first_failed_at",
        "source",
        "origin",
        "worker_id",
        "timestamp",
        "original_timestamp",
    ):
        value = view.get(name)
        fields.add_row(name, json.dumps(value) if isinstance(value, dict) else _cell(value))
    error = view.get("error") or {}
    fields.add_row("error class", _cell(error.get("error_class")))
    fields.add_row("field", _cell(error.get("field")))
    fields.add_row("details", json.dumps(error.get("details") or {}, sort_keys=True))
    key, value = view.get("original_key") or {}, view.get("original_value") or {}
    fields.add_row("original key", _cell(key.get("text", key.get("base64"))))
    fields.add_row("original value", f"{value.get('size', 0)} bytes")
    parts: list[RenderableType] = [fields]
    headers = Table("header", "value", title="original headers")
    for h in view.get("original_headers") or ():
        v = h.get("value") or {}
        headers.add_row(h["key"], _cell(v.get("text", v.get("base64")), 120))
    if view.get("original_headers"):
        parts.append(headers)
    if view.get("history"):
        history = Table("kind", "at", "from", "run id", "reason", title="history")
        for item in view["history"]:
            source = item.get("from")
            history.add_row(
                item["kind"],
                _cell(item.get("at")),
                f"{source['topic']}:{source['partition']}:{source['offset']}" if source else "-",
                _cell(item.get("id")),
                _cell(item.get("reason")),
            )
        parts.append(history)
    request = view.get("request")
    if request is not None:
        parts.append(Text(f"request: {json.dumps(request, sort_keys=True)}"))
    return Group(*parts)


@app.command("stats")
def stats(
    topic: TopicOpt = "all",
    model: ModelOpt = None,
    version: VersionOpt = None,
    code: CodeOpt = None,
    since: SinceOpt = None,
    until: UntilOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Count dead letters by topic, model, version and error code, with the oldest and newest."""
    kafka, topics, registry = _settings()
    names = _guard(lambda: dead_letter_topics(topics, topic))
    letters = _filter(model, version, code, since, until)
    view = _run(lambda: letter_stats(kafka, registry, names, letters), as_json).view()
    view["topics"] = names
    if as_json:
        _print_json(view)
        return
    console = Console(width=200)
    console.print(
        f"{view['count']} dead letters match of {view['scanned']} read in {', '.join(names)}"
        f" (oldest {_cell(view['oldest'])}, newest {_cell(view['newest'])}"
        + (f", {view['unreadable']} not readable as envelopes)" if view["unreadable"] else ")"),
        highlight=False,
    )
    for title, key in (
        ("by topic", "by_topic"),
        ("by model", "by_model"),
        ("by model:version", "by_version"),
        ("by error code", "by_code"),
    ):
        if not view[key]:
            continue
        table = Table(title.split(" ", 1)[1], "count", "oldest", "newest", title=title)
        for name, tally in view[key].items():
            table.add_row(name, str(tally["count"]), _cell(tally["oldest"]), _cell(tally["newest"]))
        console.print(table)


# -- redrive --------------------------------------------------------------------------------------


@app.command("redrive")
def redrive(
    source: Annotated[
        str, typer.Option("--from", help="The topic to redrive: failed or poison.")
    ] = "failed",
    model: ModelOpt = None,
    version: VersionOpt = None,
    code: CodeOpt = None,
    since: SinceOpt = None,
    until: UntilOpt = None,
    rate: Annotated[
        float, typer.Option(help="Messages per second, at most (bursts of 1/20 s).")
    ] = DEFAULT_RATE,
    limit: Annotated[
        int | None, typer.Option(min=1, help="Redrive at most this many letters.")
    ] = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Show what would be redriven; produce nothing.")
    ] = False,
    run_id: Annotated[
        str | None,
        typer.Option(help="Names this run in the redriven requests' history and its checkpoint."),
    ] = None,
    resume: Annotated[
        bool,
        typer.Option(
            "--resume", help="Skip what an earlier run with this --run-id already redrove."
        ),
    ] = False,
    timeout: Annotated[
        float, typer.Option(min=1, help="Seconds to wait for each delivery report.")
    ] = 30.0,
    as_json: JsonOpt = False,
) -> None:
    """Republish dead letters to the topic their requests came from, after their cause is fixed.

    Requests keep their bytes (so their request ids) and headers, plus lineage headers recording
    this redrive. Redriving the same letters twice sends them twice: use --run-id and --resume to
    continue an interrupted run instead."""
    kafka, topics, registry = _settings()
    if resume and run_id is None:
        raise typer.BadParameter("--resume needs the --run-id of the run to resume")
    options = _guard(
        lambda: RedriveOptions(
            source=redrive_source(topics, source),
            letters=_filter(model, version, code, since, until),
            run_id=run_id or new_run_id(),
            rate=rate,
            dry_run=dry_run,
            resume=resume,
            limit=limit,
            delivery_timeout_s=timeout,
        )
    )
    report = _run(lambda: _redrive(kafka, topics, registry, options), as_json)
    view = report.view()
    if as_json:
        _print_json(view)
    else:
        Console(width=200).print(_redrive_render(view))
    if not report.ok:
        raise typer.Exit(1)


async def _redrive(
    kafka: KafkaSettings,
    topics: TopicSettings,
    registry: SchemaRegistrySettings,
    options: RedriveOptions,
) -> Any:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    label = "dry run" if options.dry_run else f"redrive {options.run_id}"
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[counts]}"),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        transient=False,
    ) as bar:
        task = bar.add_task(label, total=None, counts="")

        def advance(p: RedriveProgress) -> None:
            counts = (
                f"would {p.would_redrive}"
                if options.dry_run
                else f"redriven {p.redriven}, in flight {p.in_flight}"
            )
            bar.update(
                task,
                total=p.total,
                completed=p.scanned,
                counts=f"{counts}, skipped {p.skipped}, failed {p.failed}",
            )

        run = Redrive(kafka, topics, registry, options, on_progress=advance)
        loop = asyncio.get_running_loop()

        def interrupt() -> None:
            bar.console.print("stopping: waiting for what was sent, saving the checkpoint")
            run.stop()
            loop.remove_signal_handler(signal.SIGINT)  # a second Ctrl-C interrupts at once

        loop.add_signal_handler(signal.SIGINT, interrupt)
        try:
            return await run.run()
        finally:
            loop.remove_signal_handler(signal.SIGINT)


def _redrive_render(view: dict[str, Any]) -> RenderableType:
    counts = view["counts"]
    title = f"{'dry run' if view['dry_run'] else 'redrive'} {view['run_id']} of {view['source']}"
    summary = Table("outcome", "messages", title=title)
    for outcome in ("would_redrive", "redriven", "skipped", "failed"):
        if outcome == "would_redrive" and not view["dry_run"]:
            continue
        if outcome == "redriven" and view["dry_run"]:
            continue
        summary.add_row(outcome.replace("_", " "), str(counts[outcome]))
    summary.add_row("read", f"{counts['scanned']} of {counts['total']}")
    parts: list[RenderableType] = [summary]
    rate, seconds = view["achieved_rate"], view["send_seconds"]
    if rate is not None and seconds >= 1:  # a shorter run is one burst: its rate says nothing
        parts.append(Text(f"sent in {seconds:.1f} s at {rate:.0f}/s (limit {view['rate']:g}/s)"))
    if view["stopped"]:
        parts.append(Text(f"stopped early; resume with --run-id {view['run_id']} --resume"))
    listed = [o for o in view["outcomes"] if o["outcome"] in ("failed", "would_redrive")]
    if listed:
        table = Table("position", "outcome", "request id", "model", "code", "target")
        table.add_column("reason", overflow="fold")
        for o in listed[:_SHOWN_FAILURES]:
            table.add_row(
                f"{o['topic']}:{o['partition']}:{o['offset']}",
                o["outcome"].replace("_", " "),
                _cell(o["request_id"]),
                _cell(o["model"]),
                _cell(o["code"]),
                _cell(o["target"]),
                _cell(o["reason"]),
            )
        parts.append(table)
        if len(listed) > _SHOWN_FAILURES:
            parts.append(Text(f"… and {len(listed) - _SHOWN_FAILURES} more (--json lists all)"))
    return Group(*parts)
