"""`tidegate pools`: declare model pools, place models in them, list them (docs/pools.md)."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from tidegate.cli.lifecycle_session import actor, emit, run
from tidegate.cli.lifecycle_tables import result_render
from tidegate.core.errors import TidegateError
from tidegate.core.kafka import make_admin
from tidegate.core.pool_names import DEFAULT_POOL, check_pool
from tidegate.core.pools import declared_pools, missing_topics, pool_topic_names, pool_topics
from tidegate.core.settings import KafkaSettings, SchemaRegistrySettings, TopicSettings
from tidegate.core.stack import ensure_topics, topic_specs
from tidegate.lifecycle.domain.placement import Plan, plan
from tidegate.schemas.catalog import pool_subjects
from tidegate.schemas.registration import RegistryHttp, register_all

if TYPE_CHECKING:
    from tidegate.lifecycle.operations.commands import CommandResult, LifecycleCommands

__all__ = ["app"]

app = typer.Typer(no_args_is_help=True)

_QUIET = {"log_level": 4}
Json = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]
Timeout = Annotated[float, typer.Option(min=1, help="Kafka admin timeout, seconds.")]


@app.command("declare")
def declare(
    pool: Annotated[str, typer.Argument(help="The pool's name: lowercase letters, digits, -.")],
    partitions: Annotated[
        int | None,
        typer.Option(
            min=1,
            help="Partitions of its requests topics (default: TIDEGATE_TOPICS_PARTITIONS); at "
            "least the most workers the pool will run.",
        ),
    ] = None,
    timeout: Timeout = 30.0,
) -> None:
    """Create the pool's topics (its requests topic per lane, its retry topics) and register
    their schema subjects. Existing ones are kept: declaring again changes nothing."""
    try:
        check_pool(pool)
    except TidegateError as exc:
        raise typer.BadParameter(str(exc)) from None
    for line in _declare(pool, partitions, timeout):
        typer.echo(line)


def _declare(pool: str, partitions: int | None, timeout: float) -> list[str]:
    """Create the pool's missing topics and register their subjects; what was done, a line each."""
    topics = TopicSettings()
    layout = pool_topics(topics, pool)
    if partitions is not None:
        layout = layout.model_copy(update={"partitions": partitions})
    own = set(pool_topic_names(topics, pool))
    specs = [spec for spec in topic_specs(layout) if spec.name in own]
    result = ensure_topics(make_admin(KafkaSettings(), _QUIET), specs, timeout=timeout)
    subjects = pool_subjects(topics, pool)
    with RegistryHttp(SchemaRegistrySettings()) as registry:
        registered = list(register_all(registry, subjects, events=False))
    lines = []
    for spec in specs:
        action = "created" if spec.name in result.created else "kept"
        lines.append(f"{action} {spec.name} (partitions: {spec.partitions})")
    lines += [f"{o.action} {o.subject} (schema id {o.schema_id})" for o in registered]
    return lines


@app.command("place")
def place(
    model: Annotated[str, typer.Argument(help="Model name.")],
    pool: Annotated[
        str | None, typer.Argument(help="The pool (declared first); none with --default.")
    ] = None,
    default: Annotated[
        bool, typer.Option("--default", help="Place the model back in the default pool.")
    ] = False,
    reason: Annotated[str, typer.Option(help="Why, recorded in the event.")] = "operator",
    timeout: Timeout = 15.0,
    as_json: Json = False,
) -> None:
    """Place MODEL in POOL: its requests go to the pool's topics from then on, and the pool's
    workers load it. A pool whose topics do not exist is refused."""
    if (pool is None) != default:
        raise typer.BadParameter("give either a pool or --default")
    if pool is not None:
        try:
            missing = missing_topics(
                make_admin(KafkaSettings(), _QUIET), TopicSettings(), pool, timeout
            )
        except TidegateError as exc:
            raise typer.BadParameter(str(exc)) from None
        if missing:
            raise typer.BadParameter(
                f"pool {pool!r} is not declared (missing {', '.join(missing)}): "
                f"run `tidegate pools declare {pool}` first"
            )
    who = actor()

    async def action(c: LifecycleCommands) -> CommandResult:
        return await c.place(model, pool, actor=who, reason=reason)

    result: CommandResult = run(action, write=True, as_json=as_json)
    emit(result.to_dict(), as_json, result_render)


@app.command("list")
def list_pools(timeout: Timeout = 15.0, as_json: Json = False) -> None:
    """Every pool: the default one and each declared one, with its topics and its models."""
    topics = TopicSettings()
    admin = make_admin(KafkaSettings(), _QUIET)
    present = admin.list_topics(timeout=timeout).topics
    declared = declared_pools(present, topics)
    states = run(lambda c: c.models(), write=False, as_json=as_json)
    rows: list[dict[str, Any]] = []
    for pool in [None, *declared]:
        layout = pool_topics(topics, pool)
        rows.append(
            {
                "pool": pool or DEFAULT_POOL,
                "requests_topic": layout.requests,
                "partitions": len(present[layout.requests].partitions)
                if layout.requests in present
                else None,
                "models": sorted(s.model for s in states if s.pool == pool),
            }
        )
    placed_nowhere = sorted(
        s.model for s in states if s.pool is not None and s.pool not in declared
    )
    for model in placed_nowhere:
        typer.echo(f"WARNING: {model} is placed in a pool whose topics are gone", err=True)
    emit(rows, as_json, _pools_table)


def _pools_table(rows: list[dict[str, Any]]) -> Any:
    from rich.table import Table

    table = Table("pool", "requests topic", "partitions", "models", title="pools")
    for row in rows:
        partitions = "-" if row["partitions"] is None else str(row["partitions"])
        table.add_row(row["pool"], row["requests_topic"], partitions, ", ".join(row["models"]))
    return table


@app.command("plan")
def plan_pools(
    worker_memory_mib: Annotated[
        int,
        typer.Option(
            min=1,
            help="One worker's memory budget for models, MiB (as its "
            "TIDEGATE_WORKER_MEMORY_BUDGET_MIB): every worker of a pool holds all its models.",
        ),
    ],
    worker_rate: Annotated[
        float,
        typer.Option(min=0.001, help="Requests a second one worker serves (from `make bench`)."),
    ],
    family: Annotated[
        list[str] | None,
        typer.Option(help="NAME=MODEL,MODEL: models kept in one pool; repeat for more families."),
    ] = None,
    window_s: Annotated[
        float, typer.Option(min=1, help="The window the request rates are counted over, seconds.")
    ] = 3600.0,
    prefix: Annotated[str, typer.Option(help="Pools are named PREFIX-1, PREFIX-2, ...")] = "pool",
    as_json: Json = False,
) -> None:
    """Propose pools: models packed, largest first, into the fewest pools whose models fit one
    worker's budget, sized by each version's measured memory; each pool's workers from its
    request rate. Prints the plan; `pools apply` records it."""
    families = {}
    for item in family or []:
        name, _, members = item.partition("=")
        if not name or not members:
            raise typer.BadParameter(f"{item!r}: give NAME=MODEL,MODEL", param_hint="--family")
        families[name] = [m.strip() for m in members.split(",") if m.strip()]
    try:
        check_pool(f"{prefix}-1")
    except TidegateError as exc:
        raise typer.BadParameter(str(exc), param_hint="--prefix") from None
    window = timedelta(seconds=window_s)
    demands = run(lambda c: c.demands(window), write=False, as_json=as_json)
    made = plan(
        demands,
        budget_bytes=worker_memory_mib * 2**20,
        worker_rate_per_s=worker_rate,
        families=families,
        prefix=prefix,
    )
    estimated = sorted(f"{d.model}:{v}" for d in demands for v in d.estimated)
    emit(plan_view(made, estimated), as_json, _plan_table)
    if made.unplaced:
        raise typer.Exit(1)


@app.command("apply")
def apply_plan(
    plan_file: Annotated[
        Path, typer.Argument(exists=True, dir_okay=False, help="What `pools plan --json` printed.")
    ],
    partitions: Annotated[
        int | None, typer.Option(min=1, help="Partitions of new pools' requests topics.")
    ] = None,
    timeout: Timeout = 30.0,
    as_json: Json = False,
) -> None:
    """Record a plan: declare its pools (their topics), then place each model whose pool
    differs. A model already where the plan puts it is left alone."""
    try:
        placement: dict[str, str] = dict(json.loads(plan_file.read_text())["placement"])
    except (ValueError, KeyError, TypeError) as exc:
        raise typer.BadParameter(f"not a plan: {exc}", param_hint="PLAN_FILE") from None
    for pool in sorted(set(placement.values())):
        for line in _declare(check_pool(pool), partitions, timeout):
            typer.echo(line, err=as_json)
    who = actor()

    async def action(c: LifecycleCommands) -> list[dict[str, Any]]:
        moved = []
        for state in await c.models():
            target = placement.get(state.model)
            if target is not None and state.pool != target:
                result = await c.place(state.model, target, actor=who, reason="pools apply")
                moved.append(
                    {
                        "model": state.model,
                        "from": state.pool,
                        "to": target,
                        "sequence": result.to_dict().get("sequence"),
                    }
                )
        return moved

    moved = run(action, write=True, as_json=as_json)
    emit(moved, as_json, _moves_table)


def plan_view(made: Plan, estimated: list[str]) -> dict[str, Any]:
    return {
        "budget_bytes": made.budget_bytes,
        "worker_rate_per_s": made.worker_rate_per_s,
        "pools": [
            {
                "name": p.name,
                "models": list(p.models),
                "bytes": p.bytes,
                "rate_per_s": round(p.rate_per_s, 3),
                "workers": p.workers,
            }
            for p in made.pools
        ],
        "unplaced": list(made.unplaced),
        "placement": dict(made.placement),
        "estimated": estimated,
    }


def _plan_table(view: dict[str, Any]) -> Any:
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    budget = view["budget_bytes"]
    table = Table("pool", "models", "memory", "of budget", "req/s", "workers", title="plan")
    for p in view["pools"]:
        table.add_row(
            p["name"],
            str(len(p["models"])),
            f"{p['bytes'] / 2**20:.0f} MiB",
            f"{100 * p['bytes'] / budget:.0f}%",
            f"{p['rate_per_s']:g}",
            str(p["workers"]),
        )
    notes = []
    if view["unplaced"]:
        notes.append(Text(f"larger than one worker's budget: {', '.join(view['unplaced'])}"))
    if view["estimated"]:
        notes.append(
            Text(f"never measured, sized as the average: {len(view['estimated'])} versions")
        )
    return Group(table, *notes)


def _moves_table(moved: list[dict[str, Any]]) -> Any:
    from rich.table import Table

    table = Table("model", "from", "to", title="placed")
    for m in moved:
        table.add_row(m["model"], m["from"] or DEFAULT_POOL, m["to"])
    return table
