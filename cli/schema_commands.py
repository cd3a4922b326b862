"""`tidegate schemas ...`: register the project's Avro schemas with the configured registry."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from confluent_kafka import KafkaException

from tidegate.core.errors import IncompatibleSchemaError, TidegateError
from tidegate.core.kafka import make_admin
from tidegate.core.pools import declared_pools
from tidegate.core.settings import KafkaSettings, SchemaRegistrySettings, TopicSettings
from tidegate.schemas.catalog import SCHEMA_DIR, pool_subjects, topic_subjects
from tidegate.schemas.registration import RegistryHttp, register_all

__all__ = ["app"]

app = typer.Typer(no_args_is_help=True)


@app.command("register")
def register(
    schema_dir: Annotated[
        Path | None, typer.Option(help="Folder of .avsc files (default: the packaged schemas).")
    ] = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Check compatibility only; register nothing.")
    ] = False,
) -> None:
    """Register every project schema under its `{topic}-value` subject, and each lifecycle event
    type under its own full name (compatibility BACKWARD).

    An incompatible change is refused, naming the fields at fault, and nothing after it is
    registered.
    """
    from rich.console import Console
    from rich.table import Table

    console = Console()
    settings = SchemaRegistrySettings()
    table = Table("subject", "schema", "id", "version", "action", "compatibility")
    try:
        with RegistryHttp(settings) as registry:
            for outcome in register_all(
                registry,
                _subjects(),
                directory=schema_dir or SCHEMA_DIR,
                dry_run=dry_run,
            ):
                table.add_row(
                    outcome.subject,
                    outcome.fullname,
                    str(outcome.schema_id),
                    str(outcome.version),
                    outcome.action if not dry_run else "compatible",
                    outcome.compatibility or "global",
                )
    except IncompatibleSchemaError as exc:
        console.print(table)
        console.print(f"[red]refused:[/red] {exc}")
        for message in exc.messages:
            console.print(f"  - {message}")
        raise typer.Exit(1) from None
    except TidegateError as exc:
        console.print(f"[red]error:[/red] {exc} ({settings.url})")
        raise typer.Exit(1) from None
    console.print(table)


def _subjects() -> dict[str, str]:
    """Every topic's subject: the stack's, and those of each declared pool (whose topics Kafka
    has: `tidegate pools declare`), so that an evolved schema reaches the pools' subjects too."""
    topics = TopicSettings()
    subjects = topic_subjects(topics)
    try:
        listed = make_admin(KafkaSettings(), {"log_level": 4}).list_topics(timeout=10.0).topics
        pools = declared_pools(listed, topics)
    except KafkaException as exc:
        typer.echo(
            f"WARNING: Kafka did not list its topics ({exc}): pools' subjects skipped", err=True
        )
        return subjects
    for pool in pools:
        subjects.update(pool_subjects(topics, pool))
    return subjects
