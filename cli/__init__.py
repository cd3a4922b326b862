"""The `tidegate` command line. Each command or command group lives in its own module, which is
imported only when that command runs (cli/lazy_group.py), so a worker's start and
`tidegate --help` stay cheap."""

from __future__ import annotations

from typing import ClassVar

import typer

from tidegate.cli.actor import act_as
from tidegate.cli.lazy_group import LazyCommand, LazyGroup, lazy_commands

__all__ = ["app", "main"]

# Each command: its name, then the module (under tidegate.cli) and attribute that hold it, then
# its help on the next line; `tidegate --help` lists them in this order.
_COMMANDS = """
registry serve_registry:serve
    Run the Confluent-compatible schema registry service.
worker serve_worker:worker
    Run a worker agent: consume, micro-batch, infer, publish.
gateway serve_gateway:gateway
    Serve the V2 HTTP facade and the /admin API.
controller serve_controller:controller
    Run the lifecycle controller: outbox relay, canary controller, indexer.
served served:served
    Which version served a request, where, when and why.
produce produce:produce
    Publish requests from a JSON Lines file.
replay replay_commands:replay
    Re-run recorded requests on a version into a results topic.
backtest backtest_commands:backtest_command
    Re-score a time range on a candidate version, next to what served.
demo demo:demo
    Run the pipeline end to end on the local stack.
audit audit_commands:audit
    Read the audit trail: who did what, when, from where.
demo-stop demo:demo_stop
    Stop what `tidegate demo --keep` left running.
schemas schema_commands:app
    Register and inspect the Avro schemas.
stack stack_commands:app
    Health checks and topics of the local stack.
models model_commands:app
    Register, roll out, roll back and inspect model versions.
pools pool_commands:app
    Declare model pools and place models in them (docs/pools.md).
dlq dlq_commands:app
    Inspect and redrive the dead-letter topics.
auth auth_commands:app
    Issue, list and revoke the gateway's API keys.
features features_commands:app
    Write and read online features (docs/features.md).
"""


class TidegateCommands(LazyGroup):
    """The root's subcommands."""

    LAZY: ClassVar[dict[str, LazyCommand]] = lazy_commands(_COMMANDS, "tidegate.cli")


app = typer.Typer(
    name="tidegate",
    help="Streaming inference over Apache Kafka.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    cls=TidegateCommands,
)
app.callback()(act_as)


def main() -> None:
    app()
