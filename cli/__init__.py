"""The `tidegate` command line. Each command group lives in its own module and imports its heavy
dependencies only when it runs, so `tidegate --help` stays fast."""

from __future__ import annotations

import typer

from tidegate.cli import audit_commands as audit
from tidegate.cli import auth_commands as auth
from tidegate.cli import backtest_commands, demo, produce, replay_commands, served
from tidegate.cli import dlq_commands as dlq
from tidegate.cli import features_commands as features
from tidegate.cli import lifecycle_session as session
from tidegate.cli import model_commands as models
from tidegate.cli import pool_commands as pools
from tidegate.cli import schema_commands as schemas
from tidegate.cli import serve_controller as controller
from tidegate.cli import serve_gateway as gateway
from tidegate.cli import serve_registry as registry
from tidegate.cli import serve_worker as worker
from tidegate.cli import stack_commands as stack

__all__ = ["app", "main"]

app = typer.Typer(
    name="tidegate",
    help="Streaming inference over Apache Kafka.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
app.callback()(session.act_as)
app.command("registry", help="Run the Confluent-compatible schema registry service.")(
    registry.serve
)
app.command("worker", help="Run a worker agent: consume, micro-batch, infer, publish.")(
    worker.worker
)
app.command("gateway", help="Serve the V2 HTTP facade and the /admin API.")(gateway.gateway)
app.command(
    "controller", help="Run the lifecycle controller: outbox relay, canary controller, indexer."
)(controller.controller)
app.command("served", help="Which version served a request, where, when and why.")(served.served)
app.command("produce", help="Publish requests from a JSON Lines file.")(produce.produce)
app.command("replay", help="Re-run recorded requests on a version into a results topic.")(
    replay_commands.replay
)
app.command("backtest", help="Re-score a time range on a candidate version, next to what served.")(
    backtest_commands.backtest_command
)
app.command("demo", help="Run the pipeline end to end on the local stack.")(demo.demo)
app.command("audit", help="Read the audit trail: who did what, when, from where.")(audit.audit)
app.command("demo-stop", help="Stop what `tidegate demo --keep` left running.")(demo.demo_stop)
app.add_typer(schemas.app, name="schemas", help="Register and inspect the Avro schemas.")
app.add_typer(stack.app, name="stack", help="Health checks and topics of the local stack.")
app.add_typer(
    models.app, name="models", help="Register, roll out, roll back and inspect model versions."
)
app.add_typer(
    pools.app, name="pools", help="Declare model pools and place models in them (docs/pools.md)."
)
app.add_typer(dlq.app, name="dlq", help="Inspect and redrive the dead-letter topics.")
app.add_typer(auth.app, name="auth", help="Issue, list and revoke the gateway's API keys.")
app.add_typer(
    features.app, name="features", help="Write and read online features (docs/features.md)."
)


def main() -> None:
    app()
