"""`tidegate stack acls`: the Kafka ACLs of each component's principal, shown or applied.

The names come from the same settings the components read (topics, the workers' group, the
registry's topic), so the table matches the deployment it runs in. `make up` applies it to the
local broker; a deployment runs it once with an admin's credentials (docs/security.md).
"""

from __future__ import annotations

import json
from typing import Annotated

import typer

from tidegate.agents.worker_settings import WorkerSettings
from tidegate.core.kafka import make_admin
from tidegate.core.kafka_acls import (
    AclNames,
    Component,
    apply_acls,
    bindings,
    default_principals,
    grants,
    prune_acls,
)
from tidegate.core.settings import KafkaSettings, RegistryServerSettings, TopicSettings
from tidegate.dlq.replay_settings import ReplaySettings
from tidegate.lifecycle.control.indexer import DEFAULT_GROUP_ID

__all__ = ["acls", "names_from_settings"]


def names_from_settings() -> AclNames:
    """The names the components use, from their settings in this environment."""
    return AclNames(
        topics=TopicSettings(),
        schemas_topic=RegistryServerSettings().topic,
        worker_group=WorkerSettings().group_id,
        controller_group=DEFAULT_GROUP_ID,
        replay_topic=(replay := ReplaySettings()).results_topic,
        replay_group_prefix=replay.group_prefix,
    )


def _principals(overrides: list[str], user_prefix: str) -> dict[Component, str]:
    principals = default_principals(user_prefix)
    for item in overrides:
        component, sep, principal = item.partition("=")
        if not sep or component not in {c.value for c in Component}:
            known = ", ".join(c.value for c in Component)
            raise typer.BadParameter(f"{item!r}: expected COMPONENT=User:NAME, with one of {known}")
        principals[Component(component)] = principal
    return principals


def acls(
    apply: Annotated[
        bool, typer.Option("--apply", help="Create the ACLs on the cluster (an admin's task).")
    ] = False,
    principal: Annotated[
        list[str] | None,
        typer.Option(
            "--principal",
            help="COMPONENT=User:NAME, for a principal not named User:<prefix><component>.",
        ),
    ] = None,
    user_prefix: Annotated[
        str, typer.Option("--user-prefix", help="Principals are User:<prefix><component>.")
    ] = "tidegate-",
    prune: Annotated[
        bool,
        typer.Option(
            "--prune",
            help="With --apply, also delete these principals' ACLs the table does not hold "
            "(grants an older table had).",
        ),
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the grants as JSON.")] = False,
    timeout: Annotated[float, typer.Option(min=1, help="Admin request timeout, seconds.")] = 30.0,
) -> None:
    """Show each component's Kafka ACLs (what is not listed is refused); --apply creates them,
    and --prune deletes the principals' others."""
    principals = _principals(principal or [], user_prefix)
    table = grants(names_from_settings())
    if as_json:
        rows = [
            {
                "principal": principals[g.component],
                "component": g.component.value,
                "resource": g.resource,
                "name": g.name,
                "pattern": "prefixed" if g.prefixed else "literal",
                "operations": list(g.operations),
            }
            for g in table
        ]
        typer.echo(json.dumps(rows, indent=2))
    else:
        for g in table:
            pattern = "*" if g.prefixed else ""
            ops = ",".join(g.operations)
            typer.echo(f"{principals[g.component]:<28} {g.resource:<16} {g.name}{pattern:<2} {ops}")
    if apply:
        # librdkafka's informational lines would go to stderr; errors raise here.
        admin = make_admin(KafkaSettings(), {"log_level": 4})
        wanted = bindings(table, principals)
        count = apply_acls(admin, wanted, timeout=timeout)
        pruned = ""
        if prune:
            gone = prune_acls(admin, wanted, set(principals.values()), timeout=timeout)
            pruned = f", deleted {gone} the table no longer has"
        typer.echo(f"applied {count} ACLs for {len(principals)} principals{pruned}", err=as_json)
