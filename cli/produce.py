"""`tidegate produce FILE.jsonl`: publish the requests of a JSON Lines file, one request a line.

The line format is in `tidegate.clients.jsonl`. A bad line is reported with its number and skipped;
the rest are published. With `--wait` every result is awaited and summarised by status. The exit
status is 1 when any line was bad, not delivered, or (with `--wait`) got no result in time.
`--lane batch` publishes to the batch lane's topic (docs/lanes.md): a bulk job's lines then queue
there instead of ahead of real-time requests.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from tidegate.clients.jsonl import parse_line
from tidegate.clients.producer import Lane, TidegateProducer
from tidegate.core.errors import TidegateError
from tidegate.schemas.records import ResultRecord

if TYPE_CHECKING:
    from rich.console import Console

    from tidegate.clients.producer import TidegateProducer

__all__ = ["produce"]


def _count_lines(path: Path) -> int:
    with path.open(encoding="utf-8") as handle:
        return sum(1 for text in handle if text.strip())


def _publish_file(
    producer: TidegateProducer, path: Path, tenant: str, err: Console, console: Console
) -> tuple[dict[str, int], list[int], dict[str, str]]:
    """Publish every good line: (request id -> line number, bad line numbers, failed deliveries)."""
    from rich.progress import Progress

    published: dict[str, int] = {}
    bad: list[int] = []
    failed: dict[str, str] = {}

    def report(request_id: str, error: Exception | None) -> None:
        if error is not None:
            failed[request_id] = str(error)

    with Progress(console=console) as progress, path.open(encoding="utf-8") as handle:
        task = progress.add_task("publishing", total=_count_lines(path))
        for number, text in enumerate(handle, start=1):
            if not text.strip():
                continue
            try:
                request_id = producer.publish(**parse_line(text, tenant), on_delivery=report)
            except TidegateError as exc:
                bad.append(number)
                err.print(f"line {number}: {exc}", markup=False)
            else:
                published[request_id] = number
            progress.advance(task)
    return published, bad, failed


def _await(
    producer: TidegateProducer, ids: list[str], timeout: float, console: Console
) -> dict[str, ResultRecord]:
    from rich.progress import Progress

    with Progress(console=console) as progress:
        task = progress.add_task("awaiting results", total=len(ids))
        return producer.await_results(ids, timeout, progress=lambda _r: progress.advance(task))


def _percentile(values: list[float], q: float) -> str:
    if not values:
        return "-"
    ordered = sorted(values)
    return f"{ordered[min(len(ordered) - 1, int(q * len(ordered)))]:.1f}"


def produce(
    file: Annotated[
        Path,
        typer.Argument(
            exists=True, dir_okay=False, readable=True, help="JSON Lines file, one request a line."
        ),
    ],
    wait: Annotated[bool, typer.Option("--wait", help="Await every result and summarise.")] = False,
    timeout: Annotated[
        float, typer.Option(min=0.1, help="Seconds to wait for delivery, and for results.")
    ] = 60.0,
    tenant: Annotated[str, typer.Option(help="Tenant of the lines that name none.")] = "default",
    lane: Annotated[
        Lane,
        typer.Option(help="`batch` queues the lines behind real-time traffic (docs/lanes.md)."),
    ] = "realtime",
) -> None:
    """Publish the requests of FILE to the requests topic, with a progress bar and a summary."""
    from collections import Counter

    from rich.console import Console
    from rich.table import Table

    console, err = Console(), Console(stderr=True)
    producer = TidegateProducer(await_results=wait, lane=lane)
    try:
        producer.start(timeout)
    except TidegateError as exc:
        err.print(f"cannot publish: {exc}", markup=False)
        raise typer.Exit(2) from exc
    try:
        published, bad, failed = _publish_file(producer, file, tenant, err, console)
        queued = producer.flush(timeout)
        delivered = [rid for rid in published if rid not in failed]
        results = _await(producer, delivered, timeout, console) if wait and delivered else {}
    finally:
        producer.stop()

    for request_id, reason in failed.items():
        err.print(f"line {published[request_id]}: not delivered: {reason}", markup=False)
    table = Table("lines", "published", "bad lines", "not delivered", title=str(file))
    table.add_row(
        str(len(published) + len(bad)),
        str(len(delivered)),
        str(len(bad)),
        str(len(failed) + queued),
    )
    console.print(table)
    missing = 0
    if wait:
        statuses = Counter(str(r["status"]) for r in results.values())
        total_ms = [float(r["timings"]["total_ms"]) for r in results.values()]
        missing = len(delivered) - len(results)
        summary = Table("status", "results", title="results")
        for status, count in sorted(statuses.items()):
            summary.add_row(status, str(count))
        summary.add_row("no result in time", str(missing))
        console.print(summary)
        console.print(
            f"total latency ms: p50 {_percentile(total_ms, 0.5)}, p99 {_percentile(total_ms, 0.99)}"
        )
    if bad or failed or queued or missing:
        raise typer.Exit(1)
