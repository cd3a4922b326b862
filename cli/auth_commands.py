"""`tidegate auth keys create|list|expire|revoke`: the gateway's API keys (docs/security.md).

The commands write the `api_keys` table in PostgreSQL directly (TIDEGATE_POSTGRES_*), as the
CLI's local identity `local:<name>` (`tidegate --as NAME`, $TIDEGATE_CLI_ACTOR, or the login
name): whoever holds the database credentials needs no key to manage keys. A new key is printed
once and never stored; only its argon2 hash is. Every create, expire and revoke is written to
the audit trail (`audit-log`) first-hand: if the trail cannot be started the change is not made,
so no key changes unaudited. A revoked or expired key is refused by every gateway replica within
TIDEGATE_AUTH_REVOCATION_S (2 s by default) plus one database read.

Exit codes: 0 done; 1 refused or failed (no such key, the database or the audit trail
unreachable); 2 usage.
"""

from __future__ import annotations

import asyncio
import json
import re
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Annotated, TypeVar

import typer

from tidegate.cli.lifecycle_session import actor
from tidegate.clients.audit import FAILURE, SUCCESS, KafkaAuditTrail, local_source
from tidegate.core.db import make_pool
from tidegate.core.errors import TidegateError
from tidegate.core.settings import PostgresSettings
from tidegate.gateway.auth.api_keys import IssuedKey, KeyRecord, KeyStore
from tidegate.gateway.auth.identity import ROLE_PERMISSIONS, Grant

__all__ = ["app", "issue", "parse_expiry", "parse_grant"]

T = TypeVar("T")
app = typer.Typer(no_args_is_help=True)
keys = typer.Typer(no_args_is_help=True)
app.add_typer(keys, name="keys", help="Create, list, expire and revoke API keys.")

_DURATION = re.compile(r"^(\d+)([smhd])$")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}


def parse_grant(value: str) -> Grant:
    """`ROLE` (every model) or `ROLE:MODEL[,MODEL...]` (those models only)."""
    role, scoped, models = value.partition(":")
    if role not in ROLE_PERMISSIONS:
        raise typer.BadParameter(f"unknown role {role!r}; roles: {', '.join(ROLE_PERMISSIONS)}")
    names = frozenset(m.strip() for m in models.split(",") if m.strip()) if scoped else None
    if scoped and not names:
        raise typer.BadParameter(f"{value!r} names no model after ':'")
    return Grant(role, names)


def parse_expiry(value: str, now: datetime) -> datetime:
    """`30d`, `12h`, `90m`, `45s` from now, or an ISO-8601 time (UTC unless it says)."""
    match = _DURATION.match(value.strip())
    if match:
        return now + timedelta(**{_UNITS[match.group(2)]: int(match.group(1))})
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise typer.BadParameter(f"{value!r} is neither a duration (30d) nor ISO-8601") from None
    moment = moment if moment.tzinfo else moment.replace(tzinfo=UTC)
    if moment <= now:
        raise typer.BadParameter(f"{value} is not in the future")
    return moment


@dataclass(frozen=True)
class _Pool:
    pool_min_size: int = 1
    pool_max_size: int = 1


@asynccontextmanager
async def _store() -> AsyncIterator[KeyStore]:
    pool = make_pool(PostgresSettings(), _Pool())
    await pool.open(wait=True, timeout=15)
    try:
        yield KeyStore(pool)
    finally:
        await pool.close()


def _run(action: Callable[[KeyStore], Awaitable[T]]) -> T:
    async def go() -> T:
        async with _store() as store:
            return await action(store)

    try:
        return asyncio.run(go())
    except TidegateError as exc:
        typer.echo(f"failed: {exc}", err=True)
        raise typer.Exit(1) from None


def _audited(action: str, target: str | None, change: Callable[[KeyStore], Awaitable[T]]) -> T:
    """Run `change` with the audit trail started first, and record its outcome."""
    trail = KafkaAuditTrail(service="cli")
    try:
        trail.start()
    except Exception as exc:  # the registry or Kafka: no change without its audit entry
        typer.echo(f"failed: the audit trail cannot be written ({exc}); nothing changed", err=True)
        raise typer.Exit(1) from None
    who = actor()
    try:
        result = _run(change)
    except typer.Exit:
        trail.record(action, actor=who, outcome=FAILURE, source=local_source(), target=target)
        raise
    else:
        subject = f"key:{result.record.id}" if isinstance(result, IssuedKey) else target
        trail.record(action, actor=who, outcome=SUCCESS, source=local_source(), target=subject)
        return result
    finally:
        if trail.close():
            typer.echo("warning: the audit entry of this change was not delivered", err=True)


def issue(
    name: str,
    grants: tuple[Grant, ...],
    *,
    expires_at: datetime | None = None,
    rate_per_s: float | None = None,
    tenant: str | None = None,
    routing_key: str | None = None,
) -> IssuedKey:
    """Create a key as the CLI's local identity, audited: what `keys create` (and the demo)
    runs. Exits 1 if the audit trail or the database cannot be reached."""
    return _audited(
        "keys.create",
        None,
        lambda store: store.create(
            name,
            grants,
            created_by=actor(),
            expires_at=expires_at,
            rate_per_s=rate_per_s,
            tenant=tenant,
            routing_key=routing_key,
        ),
    )


def _row(record: KeyRecord, now: datetime) -> list[str]:
    grants = ", ".join(
        g.role + (":" + ",".join(sorted(g.models)) if g.models else "") for g in record.grants
    )
    expires = f"{record.expires_at:%Y-%m-%d %H:%M}" if record.expires_at else "-"
    rate = f"{record.rate_per_s:g}" if record.rate_per_s is not None else "-"
    created = f"{record.created_at:%Y-%m-%d %H:%M}"
    tenant = record.tenant or "-"
    return [record.id, record.name, record.state(now), grants, tenant, rate, created, expires]


def _print_keys(records: list[KeyRecord], now: datetime) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table()
    # The id is what `revoke` and `expire` take: never shortened.
    table.add_column("id", no_wrap=True, min_width=16)
    for name in ("name", "state", "grants", "tenant", "rate/s", "created", "expires"):
        table.add_column(name, overflow="fold")
    for record in records:
        table.add_row(*_row(record, now))
    Console().print(table)


@keys.command("create")
def create(
    name: Annotated[str, typer.Argument(help="What the key is for (shown in lists).")],
    role: Annotated[
        list[str],
        typer.Option(
            "--role",
            help="ROLE or ROLE:MODEL[,MODEL...]; repeat for more. Roles: infer, deploy, admin.",
        ),
    ],
    expires: Annotated[
        str | None, typer.Option(help="30d, 12h, 90m from now, or an ISO-8601 time.")
    ] = None,
    rate: Annotated[
        float | None, typer.Option(min=0.001, help="Calls per second for this key (override).")
    ] = None,
    tenant: Annotated[
        str | None,
        typer.Option(
            help="The tenant the key acts for: its calls are that tenant's, and naming another "
            "is refused (default: none, the caller's `tenant` parameter stands)."
        ),
    ] = None,
    routing_key: Annotated[
        str | None,
        typer.Option(
            help="The routing key of every call the key makes (sticky routing, per-key order): "
            "another `routing_key` parameter is refused (default: none, the caller's stands)."
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Issue a key. It is printed once: store it now, it cannot be shown again."""
    now = datetime.now(UTC)
    grants = tuple(parse_grant(r) for r in role)
    expires_at = parse_expiry(expires, now) if expires else None
    issued = issue(
        name,
        grants,
        expires_at=expires_at,
        rate_per_s=rate,
        tenant=tenant or None,
        routing_key=routing_key or None,
    )
    secret = issued.key.get_secret_value()
    if as_json:
        sys.stdout.write(json.dumps({"key": secret, **issued.record.view(now)}) + "\n")
        return
    _print_keys([issued.record], now)
    typer.echo(f"\nkey (shown once, store it now): {secret}")
    typer.echo(f'use: curl -H "Authorization: Bearer {secret}" http://127.0.0.1:8080/v2')


@keys.command("list")
def list_keys(
    active: Annotated[bool, typer.Option("--active", help="Only keys that still work.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Every key (never its secret, which is not kept), newest first."""
    now = datetime.now(UTC)
    records = _run(lambda store: store.list(include_inactive=not active))
    if as_json:
        sys.stdout.write(json.dumps([r.view(now) for r in records], indent=2) + "\n")
        return
    _print_keys(records, now)


@keys.command("expire")
def expire(
    key_id: Annotated[str, typer.Argument(help="The key's id (from list).")],
    at: Annotated[
        str, typer.Option("--at", help="now, 30d, 12h, 90m from now, or an ISO-8601 time.")
    ] = "now",
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Set when a key expires (`--at now`: at once); gateways refuse it from then on."""
    # "now" and durations are the database's now() (plus the duration), never this machine's
    # clock, which the gateways do not share: only an ISO-8601 time is written as given.
    value = at.strip()
    moment: datetime | timedelta | None
    if value.lower() == "now":
        moment = None
    elif match := _DURATION.match(value):
        moment = timedelta(**{_UNITS[match.group(2)]: int(match.group(1))})
    else:
        moment = parse_expiry(value, datetime.now(UTC))
    key_id = _key_id(key_id)

    async def change(store: KeyStore) -> KeyRecord:
        record = await store.expire(key_id, moment)
        if record is None:
            raise TidegateError(f"no key {key_id!r}")
        return record

    record = _audited("keys.expire", f"key:{key_id}", change)
    if as_json:
        sys.stdout.write(json.dumps(record.view()) + "\n")
        return
    _print_keys([record], datetime.now(UTC))


def _key_id(value: str) -> str:
    """A key id, also from a whole `tg_<id>_<secret>` pasted by mistake."""
    return value.removeprefix("tg_").split("_", 1)[0]


@keys.command("revoke")
def revoke(
    key_id: Annotated[str, typer.Argument(help="The key's id (`tg_<id>_...`, or from list).")],
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Revoke a key: every gateway replica refuses it within seconds."""
    now = datetime.now(UTC)
    key_id = _key_id(key_id)

    async def change(store: KeyStore) -> KeyRecord:
        record = await store.revoke(key_id, revoked_by=actor())
        if record is None:
            raise TidegateError(f"no key {key_id!r}")
        return record

    record = _audited("keys.revoke", f"key:{key_id}", change)
    if as_json:
        sys.stdout.write(json.dumps(record.view(now)) + "\n")
        return
    _print_keys([record], now)
