"""Who a CLI command acts as: the `tidegate --as NAME` option and the identity it names.

Kept apart from the commands so that the root command's callback imports nothing heavy."""

from __future__ import annotations

import getpass
import os
from typing import Annotated

import typer

__all__ = ["ACTOR_ENV", "act_as", "actor"]

ACTOR_ENV = "TIDEGATE_CLI_ACTOR"
_LEGACY_ACTOR_ENV = "TIDEGATE_ACTOR"


def actor() -> str:
    """Who is acting: the CLI's named local identity, `local:<name>`, recorded on every event,
    key change and audit entry. The name is `tidegate --as NAME`, else $TIDEGATE_CLI_ACTOR
    (or the older $TIDEGATE_ACTOR), else the operator's login name.

    Operator commands talk to PostgreSQL (and Kafka) directly with the credentials of the
    machine they run on, so they need no API key: whoever holds those credentials can write the
    event log anyway. The name says who acted, it does not prove it; the gateway's identities
    (keys, tokens) do, and the gateway never takes an actor from its caller."""
    for variable in (ACTOR_ENV, _LEGACY_ACTOR_ENV):
        explicit = os.environ.get(variable, "").strip()
        if explicit:
            return explicit if explicit.startswith("local:") else f"local:{explicit}"
    try:
        return f"local:{getpass.getuser()}"
    except (KeyError, OSError):
        return "local:unknown"


def act_as(
    name: Annotated[
        str | None,
        typer.Option(
            "--as",
            help="Act as this named local identity, `local:NAME`, in the event log and the "
            "audit trail (else $TIDEGATE_CLI_ACTOR, or your login name).",
        ),
    ] = None,
) -> None:
    """The `tidegate` command's own options (its callback): `--as NAME` before the command."""
    if name is not None and name.strip():
        os.environ[ACTOR_ENV] = name.strip()
