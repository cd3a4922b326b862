"""`tidegate replay`: run requests from `inference-requests` (or the DLQ) again, in this process, on
the version that served them or on a chosen one, into a results topic of the operator's choice.

What to replay: `--from/--to` (a time range), `--offsets` (offset ranges), `--request-id` /
`--ids-file` (within the range, or the whole topic), `--dlq` (the dead letters' requests), and
`--model` to keep one model's. Where: `--to-topic` (default `inference-results-replay`, created
when missing); the live results topic only with `--live`. The live workers' group offsets never
move (the reader assigns and never commits). Ctrl-C stops after the batch in hand, checkpointed:
`--resume RUN_ID` carries on. Exit codes: 0 done, 1 failed, 2 usage, 130 interrupted.
"""

from __future__ import annotations

import asyncio
import json
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer
from confluent_kafka.schema_registry import SchemaRegistryClient
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from tidegate.cli.lifecycle_session import parsed
from tidegate.core.db import make_pool
from tidegate.core.errors import TidegateError
from tidegate.core.kafka import make_admin, make_consumer
from tidegate.core.settings import (
    KafkaSettings,
    PostgresSettings,
    SchemaRegistrySettings,
    TopicSettings,
)
from tidegate.core.stack import TopicSpec, ensure_topics
from tidegate.dlq.ranges import (
    ReadPlan,
    parse_offsets,
    parse_time_ms,
    resolve_offsets,
    resolve_times,
)
from tidegate.dlq.replay_run import ReplayRunner, check_target
from tidegate.dlq.replay_served import PostgresServed
from tidegate.dlq.replay_settings import ReplaySettings
from tidegate.dlq.replay_state import ReplayCheckpoint, Source, checkpoint_path, new_run_id
from tidegate.lifecycle.lifecycle_settings import LifecycleSettings
from tidegate.models.model_settings import ModelSettings
from tidegate.schemas.catalog import (
    DEAD_LETTER_ENVELOPE,
    INFERENCE_REQUEST,
    INFERENCE_RESULT,
    load_schema,
)
from tidegate.schemas.codec import AvroDecoder
from tidegate.schemas.registration import RegistryHttp, register_all

__all__ = ["Selection", "replay", "select"]

EXIT_FAILED = 1
EXIT_INTERRUPTED = 130


@dataclass(frozen=True)
class Selection:
    """The checked options of a new run (what `--resume` reads back from the checkpoint)."""

    source: Source
    from_ms: int | None
    to_ms: int | None
    offsets: str | None
    request_ids: tuple[str, ...]
    model: str | None
    version: str | None
    target: str


def select(
    *,
    from_: str | None,
    to: str | None,
    offsets: str | None,
    request_ids: list[str],
    ids_file: Path | None,
    dlq: bool,
    model: str | None,
    version: str | None,
    to_topic: str | None,
    live: bool,
    topics: TopicSettings,
    settings: ReplaySettings,
) -> Selection:
    """Check the options of a new run; a usage error exits 2 naming the option."""
    if offsets and (from_ or to):
        raise typer.BadParameter("give --offsets or --from/--to, not both", param_hint="--offsets")
    ids = [*request_ids]
    if ids_file is not None:
        ids += [line.strip() for line in ids_file.read_text().splitlines() if line.strip()]
    if not (from_ or to or offsets or ids or dlq):
        raise typer.BadParameter(
            "say what to replay: --from/--to, --offsets, --request-id/--ids-file or --dlq",
            param_hint="--from",
        )
    if version is not None and model is None:
        raise typer.BadParameter("a version is a model's: give --model too", param_hint="--version")
    from_ms = parsed(parse_time_ms, from_, "--from") if from_ else None
    to_ms = parsed(parse_time_ms, to, "--to") if to else None
    if from_ms is not None and to_ms is not None and to_ms < from_ms:
        raise typer.BadParameter("--to is before --from", param_hint="--to")
    if offsets:
        parsed(parse_offsets, offsets, "--offsets")
    target = to_topic or settings.results_topic
    try:
        check_target(target, topics, live=live)
    except TidegateError as exc:
        raise typer.BadParameter(str(exc), param_hint="--to-topic") from None
    return Selection(
        "dlq" if dlq else "requests",
        from_ms,
        to_ms,
        offsets,
        tuple(dict.fromkeys(ids)),
        model,
        version,
        target,
    )


def replay(
    from_: Annotated[str | None, typer.Option("--from", help="Start: ISO time or -1h.")] = None,
    to: Annotated[str | None, typer.Option("--to", help="End (exclusive): ISO time, now.")] = None,
    offsets: Annotated[
        str | None, typer.Option(help="Offset ranges, 0:100-200,3:50- or 100-200 (all).")
    ] = None,
    request_ids: Annotated[
        list[str] | None, typer.Option("--request-id", help="Replay this request (repeatable).")
    ] = None,
    ids_file: Annotated[
        Path | None, typer.Option(exists=True, dir_okay=False, help="Request ids, one a line.")
    ] = None,
    dlq: Annotated[bool, typer.Option("--dlq", help="Replay dead letters' requests.")] = False,
    dlq_topic: Annotated[
        str | None, typer.Option(help="The DLQ to read (default: failed requests).")
    ] = None,
    model: Annotated[str | None, typer.Option(help="Only this model's requests.")] = None,
    version: Annotated[
        str | None, typer.Option(help="Run on this version (default: the one that served).")
    ] = None,
    to_topic: Annotated[str | None, typer.Option(help="Results topic to write.")] = None,
    live: Annotated[bool, typer.Option("--live", help="Allow the live results topic.")] = False,
    rate: Annotated[float | None, typer.Option(min=0.1, help="At most this many/s.")] = None,
    batch_size: Annotated[int | None, typer.Option(min=1, max=4096, help="Per model call.")] = None,
    resume: Annotated[str | None, typer.Option(help="Continue an interrupted run.")] = None,
    state_dir: Annotated[Path | None, typer.Option(help="Where checkpoints live.")] = None,
    no_progress: Annotated[bool, typer.Option("--no-progress", help="No progress bar.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the summary as JSON.")] = False,
) -> None:
    """Re-run recorded requests on a version, into a results topic; never moves live offsets."""
    settings = ReplaySettings()
    if state_dir is not None:
        settings = settings.model_copy(update={"state_dir": state_dir})
    if batch_size is not None:
        settings = settings.model_copy(update={"batch_size": batch_size})
    kafka, topics = KafkaSettings(), TopicSettings()
    console = Console(stderr=True)
    if resume is not None:
        try:
            path = checkpoint_path(settings.state_dir, resume)
            checkpoint = ReplayCheckpoint.load(path)
        except TidegateError as exc:
            console.print(f"[red]refused:[/red] {exc}", highlight=False)
            raise typer.Exit(EXIT_FAILED) from None
        if checkpoint.status == "done":
            _print_summary(checkpoint, as_json)
            return
    else:
        chosen = select(
            from_=from_,
            to=to,
            offsets=offsets,
            request_ids=request_ids or [],
            ids_file=ids_file,
            dlq=dlq,
            model=model,
            version=version,
            to_topic=to_topic,
            live=live,
            topics=topics,
            settings=settings,
        )
        try:
            checkpoint = _new_run(chosen, kafka, topics, dlq_topic, settings)
            path = checkpoint_path(settings.state_dir, checkpoint.run_id)
            checkpoint.save(path)
            prepare_target(checkpoint.target_topic, topics, kafka, SchemaRegistrySettings())
        except TidegateError as exc:
            console.print(f"[red]refused:[/red] {exc}", highlight=False)
            raise typer.Exit(EXIT_FAILED) from None
    console.print(f"replay {checkpoint.run_id} (resume with --resume {checkpoint.run_id})")
    try:
        asyncio.run(_run(checkpoint, path, kafka, settings, rate, not no_progress))
    except TidegateError as exc:
        console.print(f"[red]failed:[/red] {exc}", highlight=False)
        _print_summary(checkpoint, as_json)
        raise typer.Exit(EXIT_FAILED) from None
    _print_summary(checkpoint, as_json)
    if checkpoint.status == "interrupted":
        raise typer.Exit(EXIT_INTERRUPTED)
    if checkpoint.status == "failed":
        raise typer.Exit(EXIT_FAILED)


def _new_run(
    chosen: Selection,
    kafka: KafkaSettings,
    topics: TopicSettings,
    dlq_topic: str | None,
    settings: ReplaySettings,
) -> ReplayCheckpoint:
    run_id = new_run_id()
    source = (dlq_topic or topics.failed) if chosen.source == "dlq" else topics.requests
    consumer = make_consumer(kafka, f"{settings.group_prefix}-{run_id}")
    try:
        plan: ReadPlan
        if chosen.offsets:
            plan = resolve_offsets(consumer, source, parse_offsets(chosen.offsets))
        else:
            plan = resolve_times(consumer, source, chosen.from_ms, chosen.to_ms)
    finally:
        consumer.close()
    return ReplayCheckpoint(
        run_id=run_id,
        plan=plan,
        target_topic=chosen.target,
        source=chosen.source,
        model=chosen.model,
        version=chosen.version,
        request_ids=chosen.request_ids,
        batch_size=settings.batch_size,
    )


def prepare_target(
    target: str, topics: TopicSettings, kafka: KafkaSettings, registry: SchemaRegistrySettings
) -> None:
    """Create the target topic like the results topic, and register InferenceResult under
    `<target>-value`, when either is missing."""
    config = {"cleanup.policy": "delete", "retention.ms": str(topics.retention_ms)}
    spec = TopicSpec(target, topics.partitions, topics.replication_factor, config)
    ensure_topics(make_admin(kafka), [spec])
    with RegistryHttp(registry) as http:
        list(register_all(http, {f"{target}-value": INFERENCE_RESULT}, events=False))


async def _run(
    checkpoint: ReplayCheckpoint,
    path: Path,
    kafka: KafkaSettings,
    settings: ReplaySettings,
    rate: float | None,
    show_progress: bool,
) -> None:
    from tidegate.agents.inference.offline import OfflineScorer

    registry = SchemaRegistryClient(SchemaRegistrySettings().client_config())
    scorer = OfflineScorer.from_settings(ModelSettings(), worker_id=f"replay:{checkpoint.run_id}")
    pool = None
    served = None
    if checkpoint.version is None:
        pool = make_pool(PostgresSettings(), LifecycleSettings(pool_min_size=1, pool_max_size=2))
        await pool.open(wait=True, timeout=30)
        served = PostgresServed(pool)
    with Progress(
        TextColumn("replay"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeRemainingColumn(),
        disable=not show_progress,
        console=Console(stderr=True),
    ) as bar:
        task = bar.add_task("replay", total=checkpoint.plan.total)
        runner = ReplayRunner(
            checkpoint,
            path,
            kafka=kafka,
            registry=registry,
            requests=AvroDecoder(registry, load_schema(INFERENCE_REQUEST)),
            envelopes=(
                AvroDecoder(registry, load_schema(DEAD_LETTER_ENVELOPE))
                if checkpoint.source == "dlq"
                else None
            ),
            scorer=scorer,
            settings=settings,
            served=served,
            rate=rate,
            progress=lambda done, total: bar.update(task, completed=done, total=total),
        )
        loop = asyncio.get_running_loop()

        def interrupt() -> None:
            Console(stderr=True).print("stopping after the batch in hand (Ctrl-C again: abort)")
            runner.stop()
            loop.remove_signal_handler(signal.SIGINT)

        # POSIX only, as every tidegate process (the worker supervisor relies on signals too).
        loop.add_signal_handler(signal.SIGINT, interrupt)
        try:
            await runner.run()
        finally:
            loop.remove_signal_handler(signal.SIGINT)
            await scorer.close()
            if pool is not None:
                await pool.close()


def summary_view(checkpoint: ReplayCheckpoint) -> dict[str, Any]:
    """The final summary: counts, errors by code, skips, and per partition what was read."""
    return {
        "run_id": checkpoint.run_id,
        "status": checkpoint.status,
        "source_topic": checkpoint.plan.topic,
        "results_topic": checkpoint.target_topic,
        "version": checkpoint.version or "served",
        **checkpoint.summary.to_json(),
        "partitions": [
            {
                "partition": r.partition,
                "start": r.start,
                "end": r.end,
                "next": checkpoint.position(r.partition),
            }
            for r in checkpoint.plan.ranges
        ],
    }


def _print_summary(checkpoint: ReplayCheckpoint, as_json: bool) -> None:
    view = summary_view(checkpoint)
    if as_json:
        typer.echo(json.dumps(view, indent=2, sort_keys=True))
        return
    table = Table(title=f"replay {view['run_id']}", show_header=False)
    for key in ("status", "source_topic", "results_topic", "version", "read", "filtered"):
        table.add_row(key, str(view[key]))
    table.add_row("replayed", f"{view['replayed']} ({view['ok']} OK)")
    for label in ("errors", "skipped"):
        table.add_row(label, ", ".join(f"{k}: {n}" for k, n in view[label].items()) or "none")
    ranges = Table("partition", "planned", "next", title="partitions")
    for p in view["partitions"]:
        ranges.add_row(str(p["partition"]), f"{p['start']}-{p['end']}", str(p["next"]))
    console = Console()
    console.print(table)
    console.print(ranges)
