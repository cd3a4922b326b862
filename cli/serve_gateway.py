"""`tidegate gateway`: serve the V2 HTTP facade (one replica per process, `--workers` of them).

By default the command is a supervisor (`tidegate.cli.worker_pool.Supervisor`, as `tidegate
worker --processes` runs) of one child, `tidegate gateway --no-supervise` with the same options,
which serves: a child that dies (a crash inside a native library, the OOM killer) is restarted
after a growing delay, and SIGTERM or Ctrl-C stop it gracefully. The child keeps one replica id
across restarts (`<host>-gateway-<port>` unless one is configured), so a restarted gateway takes
back its own reply partition and the replies that came while it was down
(docs/gateway-hardening.md).
`--no-supervise` serves in this process, for a process manager of your own (systemd, Kubernetes).
"""

from __future__ import annotations

import os
import socket
import sys
from typing import Annotated

import typer

from tidegate.cli.worker_pool import Slot, Supervisor
from tidegate.core.telemetry import configure_logging

__all__ = ["AUTH_ENABLED_ENV", "REPLICA_ID_ENV", "gateway", "supervised_replica_id"]

AUTH_ENABLED_ENV = "TIDEGATE_AUTH_ENABLED"
REPLICA_ID_ENV = "TIDEGATE_GATEWAY_REPLICA_ID"
# The supervisor waits this much longer than the child's own graceful shutdown before killing it.
STOP_MARGIN_S = 5.0


def supervised_replica_id(port: int) -> str:
    """The replica id a supervised gateway keeps across restarts, unless one is configured:
    one gateway per port and host."""
    return os.environ.get(REPLICA_ID_ENV) or f"{socket.gethostname()}-gateway-{port}"


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
    supervise: Annotated[
        bool,
        typer.Option(
            "--supervise/--no-supervise",
            help="Serve from a child process that is restarted if it dies (default); "
            "--no-supervise serves in this process, for a process manager of your own.",
        ),
    ] = True,
) -> None:
    """Serve the Open Inference Protocol (V2) over Kafka until SIGTERM or Ctrl-C. Every call is
    authenticated (API keys from `tidegate auth keys create`, or JWTs; docs/security.md) unless
    `--insecure`."""
    # Heavy imports stay here so that `tidegate --help` does not pay for them.
    from tidegate.gateway.auth.auth_settings import AuthSettings
    from tidegate.gateway.gateway_settings import GatewaySettings
    from tidegate.gateway.serving import check_exposure, serve

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
    given: dict[str, object] = {"host": host, "port": port, "workers": workers, "admin": admin}
    overrides = {name: value for name, value in given.items() if value is not None}
    # Refused here too, before a supervisor would restart a child that refuses it each time.
    check_exposure(str(GatewaySettings.model_validate(overrides).host), AuthSettings())
    if not supervise:
        serve(overrides)
        return
    raise typer.Exit(_supervise(overrides))


def _supervise(overrides: dict[str, object]) -> int:
    from tidegate.gateway.gateway_settings import GatewaySettings

    configure_logging()
    settings = GatewaySettings.model_validate(overrides)
    argv = [sys.executable, "-m", "tidegate.cli", "gateway", "--no-supervise"]
    for name, value in overrides.items():
        flag = name.replace("_", "-")
        if isinstance(value, bool):
            argv.append(f"--{flag}" if value else f"--no-{flag}")
        else:
            argv += [f"--{flag}", str(value)]
    env = {REPLICA_ID_ENV: supervised_replica_id(settings.port)}
    slot = Slot(f"gateway on port {settings.port}", argv, env)
    return Supervisor([slot], stop_timeout_s=settings.shutdown_timeout_s + STOP_MARGIN_S).run()
