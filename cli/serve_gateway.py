"""`tidegate gateway`: serve the V2 HTTP facade (one replica per process)."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from tidegate.core.telemetry import configure_logging

__all__ = ["gateway"]


def gateway(
    host: Annotated[
        str | None,
        typer.Option(help="Address to listen on (else $TIDEGATE_GATEWAY_HOST, or 127.0.0.1)."),
    ] = None,
    port: Annotated[
        int | None, typer.Option(help="Port to listen on (else $TIDEGATE_GATEWAY_PORT, or 8080).")
    ] = None,
    admin: Annotated[
        bool,
        typer.Option(
            "--admin/--no-admin",
            help="Serve the lifecycle operations under /admin (needs PostgreSQL).",
        ),
    ] = True,
) -> None:
    """Serve the Open Inference Protocol (V2) over Kafka until SIGTERM or Ctrl-C."""
    # Heavy imports stay here so that `tidegate --help` does not pay for them.
    import uvicorn

    from tidegate.gateway.admin import lifecycle_admin
    from tidegate.gateway.app import create_app
    from tidegate.gateway.backends import GatewayConfig
    from tidegate.gateway.gateway_settings import GatewaySettings

    configure_logging()
    overrides: dict[str, Any] = {
        name: value for name, value in (("host", host), ("port", port)) if value is not None
    }
    config = GatewayConfig(gateway=GatewaySettings(**overrides))
    # uvicorn turns SIGTERM and SIGINT into a graceful shutdown: the lifespan exit releases the
    # reply lease, stops the reply consumer and flushes the producer.
    uvicorn.run(
        create_app(config, admin=lifecycle_admin if admin else None),
        host=config.gateway.host,
        port=config.gateway.port,
        log_config=None,
        lifespan="on",
    )
