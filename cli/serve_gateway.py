"""`tidegate gateway`: serve the V2 HTTP facade (one replica per process, `--workers` of them)."""

from __future__ import annotations

import os
from typing import Annotated

import typer

__all__ = ["AUTH_ENABLED_ENV", "gateway"]

AUTH_ENABLED_ENV = "TIDEGATE_AUTH_ENABLED"


def gateway(
    host: Annotated[
        str | None,
        typer.Option(help="Address to listen on (else $TIDEGATE_GATEWAY_HOST, or 127.0.0.1)."),
    ] = None,
    port: Annotated[
        int | None, typer.Option(help="Port to listen on (else $TIDEGATE_GATEWAY_PORT, or 8080).")
    ] = None,
    workers: Annotated[
        int | None,
        typer.Option(
            min=1,
            help="Gateway processes on the port, each leasing its own reply partition (else "
            "$TIDEGATE_GATEWAY_WORKERS, or 1).",
        ),
    ] = None,
    admin: Annotated[
        bool | None,
        typer.Option(
            "--admin/--no-admin",
            help="Serve the lifecycle operations under /admin, which needs PostgreSQL (else "
            "$TIDEGATE_GATEWAY_ADMIN, or on).",
        ),
    ] = None,
    insecure: Annotated[
        bool,
        typer.Option(
            "--insecure",
            help="Turn authentication OFF: every caller acts as the admin 'local:insecure'. For "
            "local experiments only; never on a reachable address (docs/security.md).",
        ),
    ] = False,
) -> None:
    """Serve the Open Inference Protocol (V2) over Kafka until SIGTERM or Ctrl-C. Every call is
    authenticated (API keys from `tidegate auth keys create`, or JWTs; docs/security.md) unless
    `--insecure`."""
    # Heavy imports stay here so that `tidegate --help` does not pay for them.
    from tidegate.gateway.serving import serve

    if insecure:
        # Through the environment, which the spawned worker processes inherit; each logs the
        # warning again as it starts, and /v2/health/ready says so in a header.
        os.environ[AUTH_ENABLED_ENV] = "false"
        typer.secho(
            "WARNING: --insecure: authentication is OFF, anyone who reaches this gateway is "
            "an admin.",
            err=True,
            fg=typer.colors.RED,
            bold=True,
        )
    given = {"host": host, "port": port, "workers": workers, "admin": admin}
    serve({name: value for name, value in given.items() if value is not None})
