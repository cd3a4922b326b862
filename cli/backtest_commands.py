"""`tidegate backtest MODEL --candidate V --from T1 --to T2`: re-score a recorded time range on a
candidate version, next to what was served, and report the difference.

It runs in this process (`tidegate.dlq.replay_backtest`): the range's requests are read without
touching any consumer group, the candidate runs offline, nothing is produced. The report is
printed as tables, saved as JSON (`--json PATH`) and as one self-contained HTML page
(`--html PATH`), and recorded in PostgreSQL (`--no-record` skips that), where the promotion gate
finds the candidate's latest backtest when `TIDEGATE_LIFECYCLE_REQUIRE_BACKTEST` is on.
"""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated

import typer
from confluent_kafka.schema_registry import SchemaRegistryClient
from rich.console import Console

from tidegate.cli.lifecycle_session import actor, parsed
from tidegate.core.db import make_pool
from tidegate.core.errors import TidegateError
from tidegate.core.settings import (
    KafkaSettings,
    PostgresSettings,
    SchemaRegistrySettings,
    TopicSettings,
)
from tidegate.dlq.ranges import parse_time_ms
from tidegate.dlq.replay_backtest import BacktestRun, backtest
from tidegate.dlq.replay_settings import ReplaySettings
from tidegate.dlq.replay_state import new_run_id
from tidegate.lifecycle.lifecycle_settings import LifecycleSettings
from tidegate.lifecycle.readmodels.backtests import record_backtest
from tidegate.models.model_settings import ModelSettings
from tidegate.schemas.catalog import INFERENCE_REQUEST, INFERENCE_RESULT, load_schema
from tidegate.schemas.codec import AvroDecoder

__all__ = ["backtest_command", "run_backtest"]


def backtest_command(
    model: Annotated[str, typer.Argument(help="Model name.")],
    candidate: Annotated[str, typer.Option(help="The version to re-score the range on.")],
    from_: Annotated[str, typer.Option("--from", help="Start: ISO time or -1h.")],
    to: Annotated[str, typer.Option("--to", help="End (exclusive): ISO time or now.")] = "now",
    baseline: Annotated[
        str | None,
        typer.Option(help="Compare with this version run here (default: what was served)."),
    ] = None,
    json_path: Annotated[Path | None, typer.Option("--json", help="Save the report.")] = None,
    html_path: Annotated[Path | None, typer.Option("--html", help="Save the HTML page.")] = None,
    limit: Annotated[int | None, typer.Option(min=1, help="The earliest N requests.")] = None,
    batch_size: Annotated[int | None, typer.Option(min=1, max=4096, help="Per call.")] = None,
    record: Annotated[
        bool, typer.Option("--record/--no-record", help="Record it for the promotion gate.")
    ] = True,
) -> None:
    """Re-score MODEL's requests of a time range on a candidate, next to what was served."""
    now = datetime.now(UTC)
    from_ms = parsed(lambda t: parse_time_ms(t, now), from_, "--from")
    to_ms = parsed(lambda t: parse_time_ms(t, now), to, "--to")
    if to_ms < from_ms:
        raise typer.BadParameter("--to is before --from", param_hint="--to")
    settings = ReplaySettings()
    if batch_size is not None:
        settings = settings.model_copy(update={"batch_size": batch_size})
    console = Console(stderr=True)
    try:
        run = asyncio.run(
            run_backtest(
                model,
                candidate,
                from_ms,
                to_ms,
                settings=settings,
                baseline=baseline,
                limit=limit,
                record=record,
            )
        )
    except TidegateError as exc:
        console.print(f"[red]failed:[/red] {exc}", highlight=False)
        raise typer.Exit(1) from None
    report = run.report
    Console().print(report.render_table())
    if json_path is not None:
        json_path.write_text(json.dumps(report.to_json(), indent=2, sort_keys=True) + "\n")
        console.print(f"JSON report: {json_path}")
    if html_path is not None:
        html_path.write_text(report.render_html())
        console.print(f"HTML report: {html_path}")


async def run_backtest(
    model: str,
    candidate: str,
    from_ms: int,
    to_ms: int,
    *,
    settings: ReplaySettings,
    baseline: str | None = None,
    limit: int | None = None,
    record: bool = True,
    kafka: KafkaSettings | None = None,
    topics: TopicSettings | None = None,
    registry: SchemaRegistrySettings | None = None,
    models: ModelSettings | None = None,
    postgres: PostgresSettings | None = None,
) -> BacktestRun:
    """The command's work, settings injectable (the integration tests call it directly)."""
    from tidegate.agents.inference.offline import OfflineScorer

    run_id = new_run_id().replace("replay-", "backtest-", 1)
    client = SchemaRegistryClient((registry or SchemaRegistrySettings()).client_config())
    scorer = OfflineScorer.from_settings(models or ModelSettings(), worker_id=f"backtest:{run_id}")
    try:
        run = await backtest(
            kafka=kafka or KafkaSettings(),
            topics=topics or TopicSettings(),
            requests=AvroDecoder(client, load_schema(INFERENCE_REQUEST)),
            results=AvroDecoder(client, load_schema(INFERENCE_RESULT)),
            scorer=scorer,
            model=model,
            candidate=candidate,
            from_ms=from_ms,
            to_ms=to_ms,
            run_id=run_id,
            settings=settings,
            baseline=baseline,
            limit=limit,
        )
    finally:
        await scorer.close()
    if record:
        pool = make_pool(
            postgres or PostgresSettings(), LifecycleSettings(pool_min_size=1, pool_max_size=1)
        )
        await pool.open(wait=True, timeout=30)
        try:
            window = (_at(from_ms), _at(to_ms))
            await record_backtest(pool, run.report, actor=actor(), window=window)
        finally:
            await pool.close()
    return run


def _at(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, UTC)
