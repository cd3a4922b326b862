"""The `tidegate` command line. Each command group lives in its own module and imports its heavy
dependencies only when it runs, so `tidegate --help` stays fast."""

from __future__ import annotations

import typer

from tidegate.cli import demo, registry, schemas, stack

__all__ = ["app", "main"]

app = typer.Typer(
    name="tidegate",
    help="Streaming inference over Apache Kafka.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
app.command("registry", help="Run the Confluent-compatible schema registry service.")(
    registry.serve
)
app.add_typer(schemas.app, name="schemas", help="Register and inspect the Avro schemas.")
app.command("demo", help="Round-trip requests through Kafka and the registry.")(demo.demo)
app.add_typer(stack.app, name="stack", help="Health checks and topics of the local stack.")


def main() -> None:
    app()
