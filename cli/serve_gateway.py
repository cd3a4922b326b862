"""`tidegate gateway`: serve the V2 HTTP facade (one replica per process, `--workers` of them)."""

from __future__ import annotations

from typing import Annotated

import typer

__all__ = ["gateway"]


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
) -> None:
    """Serve the Open Inference Protocol (V2) over Kafka until SIGTERM or Ctrl-C."""
    # Heavy imports stay here so that `tidegate --help` does not pay for them.
    from tidegate.gateway.serving import serve

    given = {"host": host, "port": port, "workers": workers, "admin": admin}
    serve({name: value for name, value in given.items() if value is not None})
