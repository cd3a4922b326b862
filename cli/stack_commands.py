"""`tidegate stack ...`: health checks, topics, Kafka ACLs and the registry credentials of the
local stack (used by infra/stack.sh).

Settings come from the environment (infra/lib.sh exports them for a stack on other ports).
"""

from __future__ import annotations

import asyncio
import os
from enum import Enum
from pathlib import Path
from typing import Annotated

import typer

from tidegate.cli.acl_commands import acls
from tidegate.core import stack
from tidegate.core.db import make_pool, migrate
from tidegate.core.kafka import make_admin
from tidegate.core.kafka_acls import Component
from tidegate.core.kafka_principals import ensure_env_file, upsert_scram_users
from tidegate.core.settings import (
    KafkaSettings,
    PostgresSettings,
    RedisSettings,
    SchemaRegistrySettings,
    TopicSettings,
    read_env_file,
)
from tidegate.core.stack import KEY_CONFIGS, describe_topics, ensure_topics, topic_specs
from tidegate.lifecycle.lifecycle_settings import LifecycleSettings

__all__ = ["Server", "app"]

app = typer.Typer(no_args_is_help=True)
app.command("acls")(acls)

# librdkafka logs informational lines (e.g. BGQUEUE when an admin client closes) to stderr; these
# commands report errors themselves, so only librdkafka's warnings and errors get through.
_QUIET = {"log_level": 4}
# The variables `SchemaRegistrySettings` reads the stack's credentials from.
_REGISTRY_PREFIX = str(SchemaRegistrySettings.model_config["env_prefix"])


class Server(str, Enum):
    """The servers `check` knows."""

    kafka = "kafka"
    registry = "registry"
    postgres = "postgres"
    redis = "redis"


@app.command()
def check(
    server: Annotated[Server, typer.Argument(help="The server to check.")],
    wait: Annotated[
        float, typer.Option("--wait", min=0, help="Poll until healthy for up to SECONDS.")
    ] = 0.0,
) -> None:
    """Exit 0 if SERVER is healthy, 1 (with the reason) if not."""
    from collections.abc import Callable
    from functools import partial

    probes: dict[Server, Callable[[float], str]] = {
        Server.kafka: partial(stack.probe_kafka, KafkaSettings()),
        Server.registry: partial(stack.probe_registry, SchemaRegistrySettings()),
        Server.postgres: partial(stack.probe_postgres, PostgresSettings()),
        Server.redis: partial(stack.probe_redis, RedisSettings()),
    }
    try:
        detail = stack.wait_healthy(probes[server], wait)
    except Exception as exc:  # any failure of the probe means "not healthy", with its reason
        typer.echo(f"{server.value}: NOT healthy: {type(exc).__name__}: {exc}", err=True)
        raise typer.Exit(1) from None
    typer.echo(f"{server.value}: healthy ({detail})")


@app.command()
def topics(
    timeout: Annotated[float, typer.Option(min=1, help="Admin request timeout, seconds.")] = 30.0,
) -> None:
    """Create the stack's topics that are missing; existing topics are left alone."""

    specs = topic_specs(TopicSettings())
    result = ensure_topics(make_admin(KafkaSettings(), _QUIET), specs, timeout=timeout)
    for spec in specs:
        action = "created" if spec.name in result.created else "kept"
        wanted, actual = result.mismatched.get(spec.name, (spec.partitions, spec.partitions))
        differs = f", settings say {wanted}" if actual != wanted else ""
        typer.echo(f"{action} {spec.name} (partitions: {actual}{differs})")
    for name, (wanted, actual) in result.mismatched.items():
        # Kafka cannot shrink a topic and growing one reshuffles keys: say so, change nothing.
        typer.echo(
            f"WARNING: {name} has {actual} partitions, the settings say {wanted}; "
            "left as is (delete the topic or change TIDEGATE_TOPICS_* to reconcile)",
            err=True,
        )


@app.command()
def status(
    timeout: Annotated[float, typer.Option(min=1, help="Admin request timeout, seconds.")] = 15.0,
) -> None:
    """Show the stack's topics: partitions, replication factor and key configs (exit 1 if one is
    missing)."""
    from rich.console import Console
    from rich.table import Table

    specs = topic_specs(TopicSettings())
    admin = make_admin(KafkaSettings(), _QUIET)
    states = describe_topics(admin, [s.name for s in specs], timeout=timeout)
    table = Table("topic", "partitions", "replication", *KEY_CONFIGS, "state", title="topics")
    missing = False
    for spec in specs:
        state = states[spec.name]
        if state is None:
            missing = True
            table.add_row(spec.name, "-", "-", *("-" for _ in KEY_CONFIGS), "[red]missing[/red]")
            continue
        verdict = "ok" if state.partitions == spec.partitions else f"settings: {spec.partitions}"
        table.add_row(
            spec.name,
            str(state.partitions),
            str(state.replication_factor),
            *(state.config.get(k, "-") for k in KEY_CONFIGS),
            verdict,
        )
    # A wide console: the table must not be cut when the output goes to a pipe or a file.
    Console(width=160).print(table)
    if missing:
        raise typer.Exit(1)


@app.command("kafka-principals")
def kafka_principals(
    directory: Annotated[Path, typer.Argument(help="Where each component's env file goes.")],
    listener: Annotated[
        str, typer.Option(help="host:port the components connect to (their bootstrap servers).")
    ],
    security_protocol: Annotated[
        str, typer.Option(help="The listener's protocol: SASL_PLAINTEXT or SASL_SSL.")
    ] = "SASL_PLAINTEXT",
    ssl_ca_location: Annotated[
        str | None, typer.Option(help="SASL_SSL: the CA bundle that signed the listener's.")
    ] = None,
    user_prefix: Annotated[
        str, typer.Option("--user-prefix", help="Principals are User:<prefix><component>.")
    ] = "tidegate-",
) -> None:
    """Give each component a SCRAM-SHA-512 user of its own: a password made once and kept in
    DIRECTORY/<component>.env (mode 600, with the listener's TIDEGATE_KAFKA_* settings), set on
    the cluster through the admin connection of TIDEGATE_KAFKA_*. Nothing secret is printed.
    `tidegate stack acls --apply` then grants each what it may do (docs/security.md)."""
    if security_protocol not in ("SASL_PLAINTEXT", "SASL_SSL"):
        raise typer.BadParameter("SASL_PLAINTEXT or SASL_SSL", param_hint="--security-protocol")
    made = [
        ensure_env_file(
            directory,
            component,
            bootstrap_servers=listener,
            security_protocol=security_protocol,
            ssl_ca_location=ssl_ca_location,
            user_prefix=user_prefix,
        )
        for component in Component
    ]
    admin = make_admin(KafkaSettings(), _QUIET)
    upsert_scram_users(admin, {c.username: c.password for c in made})
    users = ", ".join(c.username for c in made)
    typer.echo(f"kafka principals: SCRAM-SHA-512 users {users} set; env files in {directory}")


@app.command("registry-credentials")
def registry_credentials(
    path: Annotated[Path, typer.Argument(help="Where the credentials go (mode 600).")],
) -> None:
    """Make the key this stack's processes present to its schema registry, unless PATH holds an
    active one (migrates PostgreSQL first).

    The registry authenticates every caller (docs/security.md). The key is the local stack's
    own, as its PostgreSQL role is: role `admin`, since `tidegate schemas register` sets each
    subject's compatibility. It is created straight in PostgreSQL, as `tidegate auth keys create
    local-registry-client --role admin` would, but without an audit entry: the audit trail is
    written through the registry this key is for. PATH (mode 600) then holds
    TIDEGATE_SCHEMA_REGISTRY_BASIC_AUTH_USER and _PASSWORD, the key's id and secret, which
    `SchemaRegistrySettings` reads for a registry on this host (or from
    TIDEGATE_SCHEMA_REGISTRY_LOCAL_CREDENTIALS) when no credentials are set. Nothing secret is
    printed."""
    pg = PostgresSettings()
    migrate(pg)
    typer.echo(f"registry credentials: {asyncio.run(_ensure_credentials(path, pg))}")


async def _ensure_credentials(path: Path, pg: PostgresSettings) -> str:
    from tidegate.gateway.auth.api_keys import KeyStore
    from tidegate.gateway.auth.identity import Grant

    pool = make_pool(pg, LifecycleSettings(pool_min_size=1, pool_max_size=1))
    await pool.open(wait=True, timeout=30)
    try:
        store = KeyStore(pool)
        current = read_env_file(path, _REGISTRY_PREFIX).get("basic_auth_user")
        if current:
            found = await store.get(current)
            if found is not None and found.state() == "active" and found.identity().is_admin:
                return f"kept (key {current})"
        issued = await store.create(
            "local-registry-client", (Grant("admin"),), created_by="local:stack"
        )
    finally:
        await pool.close()
    key_id = issued.record.id
    secret = issued.key.get_secret_value().removeprefix(f"tg_{key_id}_")
    path.parent.mkdir(parents=True, exist_ok=True)
    written = path.with_suffix(".tmp")
    fd = os.open(written, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(
            f"{_REGISTRY_PREFIX}BASIC_AUTH_USER={key_id}\n"
            f"{_REGISTRY_PREFIX}BASIC_AUTH_PASSWORD={secret}\n"
        )
    written.replace(path)
    return f"created (key {key_id})"
