"""`tidegate registry`: run the Confluent-compatible schema registry service."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from tidegate.core.settings import (
    KafkaSettings,
    PostgresSettings,
    RegistryServerSettings,
    TopicSettings,
)
from tidegate.core.telemetry import configure_logging
from tidegate.schemas.registry import SchemaRegistry
from tidegate.schemas.registry.kafka_log import KafkaLog

__all__ = ["serve"]


def serve(
    host: Annotated[
        str | None,
        typer.Option(help="Address to listen on (else $TIDEGATE_REGISTRY_HOST, or 127.0.0.1)."),
    ] = None,
    port: Annotated[
        int | None, typer.Option(help="Port to listen on (else $TIDEGATE_REGISTRY_PORT, or 8081).")
    ] = None,
    topic: Annotated[
        str | None,
        typer.Option(help="Compacted state topic (else $TIDEGATE_REGISTRY_TOPIC, or _schemas)."),
    ] = None,
) -> None:
    """Serve the schema registry until SIGTERM or Ctrl-C; its state lives in a compacted topic.
    Callers need an API key or token, as on the gateway (TIDEGATE_AUTH_*, PostgreSQL's keys)."""
    # Heavy imports stay here so that `tidegate --help` does not pay for them.
    import uvicorn

    from tidegate.gateway.admin.registry_api import create_app
    from tidegate.gateway.auth.auth_settings import AuthSettings
    from tidegate.gateway.auth.authn import Authenticator
    from tidegate.gateway.serving import check_exposure

    configure_logging()
    overrides: dict[str, Any] = {
        name: value
        for name, value in (("host", host), ("port", port), ("topic", topic))
        if value is not None
    }
    settings = RegistryServerSettings(**overrides)
    auth = AuthSettings()
    check_exposure(settings.host, auth)
    log = KafkaLog(KafkaSettings(), settings, replication_factor=TopicSettings().replication_factor)
    registry = SchemaRegistry(log, default_compatibility=settings.default_compatibility)
    authenticator = Authenticator.from_settings(auth, PostgresSettings(), basic=True)
    app = create_app(
        registry, authenticator=authenticator, startup_timeout_s=settings.startup_timeout_s
    )
    # uvicorn turns SIGTERM and SIGINT into a graceful shutdown, which runs the app's lifespan exit
    # and so stops the Kafka reader and flushes the producer.
    uvicorn.run(app, host=settings.host, port=settings.port, log_config=None, lifespan="on")
