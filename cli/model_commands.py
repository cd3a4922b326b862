"""`tidegate models ...`: the model lifecycle (register, roll out, roll back, inspect, time
travel), plus building the example models and listing the artifact store.

Every lifecycle command prints a table, or JSON with `--json`; writes record the actor
(TIDEGATE_ACTOR, else the login name). Exit codes: 0 done, 1 refused, 2 usage, 3 conflict.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from tidegate.cli.lifecycle_session import actor, emit, parsed, run
from tidegate.cli.lifecycle_tables import (
    compare_table,
    history_table,
    list_table,
    result_render,
    state_at_render,
    status_render,
)
from tidegate.core.errors import TidegateError
from tidegate.lifecycle.domain.parse import parse_at, parse_steps, parse_weights
from tidegate.lifecycle.domain.render import event_view, iso, state_view, summary_view, table_view
from tidegate.lifecycle.domain.routing import RoutingTable
from tidegate.models.model_settings import ModelSettings
from tidegate.models.store import LocalArtifactStore

if TYPE_CHECKING:
    from tidegate.lifecycle.operations.commands import CommandResult, LifecycleCommands

__all__ = ["app"]

app = typer.Typer(no_args_is_help=True)

Json = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]
Expected = Annotated[
    int | None,
    typer.Option(
        "--expected-sequence",
        help="Act only if the model is still at this sequence (from `status`); else exit 3.",
    ),
]
Name = Annotated[str, typer.Argument(help="Model name.")]
Version = Annotated[str, typer.Argument(help="Model version.")]


def _write(as_json: bool, action: Any) -> dict[str, Any]:
    result: CommandResult = run(action, write=True, as_json=as_json)
    data = result.to_dict()
    emit(data, as_json, result_render)
    return data


@app.command("register")
def register(
    path: Annotated[
        Path,
        typer.Argument(
            exists=True, file_okay=False, help="Package directory: manifest.json and its files."
        ),
    ],
    name: Annotated[str | None, typer.Option(help="Model name (default: the manifest's).")] = None,
    version: Annotated[str | None, typer.Option(help="Version (default: the manifest's).")] = None,
    expected: Expected = None,
    as_json: Json = False,
) -> None:
    """Import a package into the artifact store, register it and validate it (load + warm-up).

    A package that fails validation stays registered as failed and never takes traffic; the
    command then exits 1.
    """
    who = actor()

    async def action(c: LifecycleCommands) -> CommandResult:
        return await c.register(
            path, actor=who, name=name, version=version, expected_sequence=expected
        )

    if _write(as_json, action)["status"] == "failed":
        raise typer.Exit(1)


@app.command("list")
def list_models(as_json: Json = False) -> None:
    """Every registered model: primary, weights, shadows, canary, versions."""

    states = run(lambda c: c.models(), write=False, as_json=as_json)
    emit([summary_view(s) for s in states], as_json, list_table)


@app.command("status")
def status(model: Name, as_json: Json = False) -> None:
    """A model's versions, weights (intended and effective), shadows, canary and rules."""

    state = run(lambda c: c.status(model), write=False, as_json=as_json)
    emit(state_view(state), as_json, status_render)


@app.command("history")
def history(model: Name, as_json: Json = False) -> None:
    """Every event of the model, oldest first, with its actor and time."""

    events = run(lambda c: c.history(model), write=False, as_json=as_json)
    emit([event_view(e) for e in events], as_json, history_table)


@app.command("shadow")
def shadow(
    model: Name,
    version: Version,
    rate: Annotated[
        float, typer.Option(min=0.0, max=1.0, help="Share of live requests copied to it.")
    ] = 1.0,
    stop: Annotated[bool, typer.Option("--stop", help="Stop shadowing the version.")] = False,
    expected: Expected = None,
    as_json: Json = False,
) -> None:
    """Run a candidate on a sample of live traffic; its outputs are only compared."""
    who = actor()

    async def action(c: LifecycleCommands) -> CommandResult:
        return await c.shadow(
            model, version, actor=who, sample_rate=rate, stop=stop, expected_sequence=expected
        )

    _write(as_json, action)


@app.command("canary")
def canary(
    model: Name,
    version: Version,
    steps: Annotated[
        str | None,
        typer.Option(help="Weights in percent, e.g. 10,50,100 (100 alone: blue-green)."),
    ] = None,
    dwell: Annotated[float | None, typer.Option(help="Seconds at each step.")] = None,
    max_error_rate: Annotated[float | None, typer.Option(help="Roll back above this.")] = None,
    max_error_rate_increase: Annotated[
        float | None, typer.Option(help="Roll back when this much above the baseline's.")
    ] = None,
    max_p99_ratio: Annotated[
        float | None, typer.Option(help="Roll back when p99 exceeds baseline's times this.")
    ] = None,
    min_requests: Annotated[
        int | None, typer.Option(help="Candidate results needed before judging.")
    ] = None,
    expected: Expected = None,
    as_json: Json = False,
) -> None:
    """Shift traffic to VERSION in steps; the controller rolls back on a crossed threshold."""

    chosen = parsed(parse_steps, steps, "--steps") if steps is not None else None
    given = {
        "max_error_rate": max_error_rate,
        "max_error_rate_increase": max_error_rate_increase,
        "max_p99_ratio": max_p99_ratio,
        "min_requests": None if min_requests is None else float(min_requests),
    }
    thresholds = {k: v for k, v in given.items() if v is not None}
    who = actor()

    async def action(c: LifecycleCommands) -> CommandResult:
        return await c.canary(
            model,
            version,
            actor=who,
            steps=chosen,
            dwell_s=dwell,
            thresholds=thresholds,
            expected_sequence=expected,
        )

    _write(as_json, action)


@app.command("promote")
def promote(
    model: Name,
    version: Version,
    force: Annotated[
        bool, typer.Option("--force", help="Promote past a failed shadow gate (recorded).")
    ] = False,
    expected: Expected = None,
    as_json: Json = False,
) -> None:
    """Give VERSION all traffic, if its shadow agreement passes the gate."""
    who = actor()

    async def action(c: LifecycleCommands) -> CommandResult:
        return await c.promote(model, version, actor=who, force=force, expected_sequence=expected)

    _write(as_json, action)


@app.command("rollback")
def rollback(
    model: Name,
    version: Annotated[
        str | None, typer.Option(help="The version expected to be rolled back (a check).")
    ] = None,
    expected: Expected = None,
    as_json: Json = False,
) -> None:
    """Abort a running canary, or return from the primary to the previous one."""
    who = actor()

    async def action(c: LifecycleCommands) -> CommandResult:
        return await c.rollback(model, actor=who, version=version, expected_sequence=expected)

    _write(as_json, action)


@app.command("retire")
def retire(model: Name, version: Version, expected: Expected = None, as_json: Json = False) -> None:
    """Take a version out of service for good; workers unload it."""
    who = actor()

    async def action(c: LifecycleCommands) -> CommandResult:
        return await c.retire(model, version, actor=who, expected_sequence=expected)

    _write(as_json, action)


@app.command("pin")
def pin(
    model: Name,
    version: Version,
    tenant: Annotated[str, typer.Option(help="The tenant pinned to VERSION.")],
    rule: Annotated[str | None, typer.Option(help="Rule id (default: pin-TENANT).")] = None,
    expected: Expected = None,
    as_json: Json = False,
) -> None:
    """Route one tenant's requests to VERSION, whatever the split."""
    who = actor()

    async def action(c: LifecycleCommands) -> CommandResult:
        return await c.pin(
            model, tenant, version, actor=who, rule_id=rule, expected_sequence=expected
        )

    _write(as_json, action)


@app.command("unpin")
def unpin(
    model: Name,
    rule: Annotated[str | None, typer.Option(help="The rule id to remove.")] = None,
    tenant: Annotated[str | None, typer.Option(help="Remove the pin pin-TENANT.")] = None,
    expected: Expected = None,
    as_json: Json = False,
) -> None:
    """Remove a pin or an experiment rule."""
    if (rule is None) == (tenant is None):
        raise typer.BadParameter("give exactly one of --rule and --tenant")
    rule_id = rule or f"pin-{tenant}"
    who = actor()

    async def action(c: LifecycleCommands) -> CommandResult:
        return await c.unpin(model, rule_id, actor=who, expected_sequence=expected)

    _write(as_json, action)


@app.command("fallback")
def fallback(
    model: Name,
    to: Annotated[
        str | None, typer.Argument(help="The fallback model (its primary serves).")
    ] = None,
    clear: Annotated[bool, typer.Option("--clear", help="Remove the fallback.")] = False,
    reason: Annotated[str, typer.Option(help="Why, recorded in the event.")] = "operator",
    expected: Expected = None,
    as_json: Json = False,
) -> None:
    """Declare the model that serves MODEL's requests while MODEL's circuit breaker is open
    (or `--clear` it). Callers may refuse it per request with `parameters.fallback=false`."""
    if (to is None) != clear:
        raise typer.BadParameter("give either a fallback model or --clear")
    who = actor()

    async def action(c: LifecycleCommands) -> CommandResult:
        return await c.fallback(model, to, actor=who, reason=reason, expected_sequence=expected)

    _write(as_json, action)


@app.command("experiment")
def experiment(
    model: Name,
    weights: Annotated[str, typer.Option(help="VERSION=PERCENT pairs summing to 100: 1=50,2=50")],
    tenant: Annotated[str | None, typer.Option(help="Only this tenant (default: all).")] = None,
    rule: Annotated[str | None, typer.Option(help="Rule id (default: experiment-TENANT).")] = None,
    expected: Expected = None,
    as_json: Json = False,
) -> None:
    """Split a tenant's (or everyone's) traffic by fixed weights, ahead of the model's split."""

    split = parsed(parse_weights, weights, "--weights")
    who = actor()

    async def action(c: LifecycleCommands) -> CommandResult:
        return await c.experiment(
            model, split, actor=who, tenant=tenant, rule_id=rule, expected_sequence=expected
        )

    _write(as_json, action)


@app.command("compare")
def compare(
    model: Name,
    candidate: Annotated[str, typer.Option(help="The shadowed version.")],
    as_json: Json = False,
) -> None:
    """A shadow candidate's agreement (or cosine), differences and latency vs the primary."""

    data = run(lambda c: c.compare(model, candidate), write=False, as_json=as_json)
    emit(data, as_json, compare_table)


@app.command("state")
def state(
    model: Name,
    at: Annotated[
        str, typer.Option(help="ISO-8601 time (2026-01-01T12:00:00Z) or a time ago (-5m).")
    ] = "now",
    as_json: Json = False,
) -> None:
    """The model's routing table and state as they were at a time."""

    # "now" reads every event: the store's clock stamps them, and a client clock running behind
    # it must not hide the latest ones.
    moment = None if at.strip().lower() == "now" else parsed(parse_at, at, "--at")
    then = run(lambda c: c.state(model, moment), write=False, as_json=as_json)
    data = {
        "at": iso(moment) if moment else "now",
        "table": table_view(RoutingTable.from_state(then)),
        "state": state_view(then),
    }
    emit(data, as_json, state_at_render)


@app.command("build")
def build(
    only: Annotated[
        list[str] | None,
        typer.Option("--only", help="Only this model (repeatable): fraud, fraud-lite, minilm."),
    ] = None,
    force: Annotated[
        bool,
        typer.Option("--force", help="Rebuild even unchanged versions; replace ones that differ."),
    ] = False,
    packages_dir: Annotated[
        Path | None,
        typer.Option(
            help="Where to write each version as a package for `models register` "
            "(default: `packages` beside the store, var/packages)."
        ),
    ] = None,
) -> None:
    """Build fraud 1, 1-torch, 2, 3, fraud-lite 1 and minilm 1 into the store (offline).

    Versions already built from the same recipe are skipped, so a re-run takes seconds. Each
    version is also written to PACKAGES_DIR/<name>/<version>/ for `tidegate models register`.
    """
    import asyncio

    from rich.console import Console
    from rich.table import Table

    from tidegate.examples import build_models

    console = Console()
    store = LocalArtifactStore(ModelSettings())
    packages_dir = packages_dir or store.root.parent / "packages"
    try:
        outcomes = asyncio.run(
            build_models(
                store,
                only=only or (),
                force=force,
                progress=console.print,
                packages_dir=packages_dir,
            )
        )
    except TidegateError as exc:
        console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(1) from None
    table = Table("model", "version", "runtime", "action", "seconds", title=str(store.root))
    for outcome in outcomes:
        manifest = outcome.manifest
        table.add_row(
            manifest.name,
            manifest.version,
            manifest.runtime,
            outcome.action,
            f"{outcome.seconds:.1f}",
        )
    console.print(table)
    console.print(f"packages in {packages_dir}/<name>/<version>/")


@app.command("artifacts")
def artifacts() -> None:
    """Every model version in the artifact store, with its runtime, signature and description."""
    import asyncio

    from rich.console import Console
    from rich.table import Table

    store = LocalArtifactStore(ModelSettings())

    async def manifests() -> list[tuple[str, str, str, str, str]]:
        rows: list[tuple[str, str, str, str, str]] = []
        for name in await store.models():
            for version in await store.versions(name):
                manifest = await store.manifest(name, version)
                signature = manifest.signature
                io = ", ".join(f"{s.name} {s.datatype}{list(s.shape)}" for s in signature.inputs)
                io += " -> " + ", ".join(
                    f"{s.name} {s.datatype}{list(s.shape)}" for s in signature.outputs
                )
                rows.append((name, version, manifest.runtime, io, manifest.description))
        return rows

    table = Table("model", "version", "runtime", "signature", "description", title=str(store.root))
    for row in asyncio.run(manifests()):
        table.add_row(*row)
    Console().print(table)
