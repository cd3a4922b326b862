"""Serving the gateway with uvicorn (`serve`): in this process, or in `GatewaySettings.workers`
processes on one port, each a replica of its own built by `served_app` from the environment.
Every process serves HTTP with `GatewayHttpProtocol`, with TLS when it is configured.
The processes: docs/decisions/009-gateway-hot-path.md ("Decision"); the protocol and TLS:
docs/gateway-hardening.md ("Slow clients are cut off", "TLS on the gateway").
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import uvicorn
from fastapi import FastAPI
from pydantic import SecretStr

from tidegate.core.errors import ConfigurationError
from tidegate.core.heap import settle
from tidegate.core.settings import TopicSettings, is_loopback
from tidegate.core.telemetry import configure_logging
from tidegate.gateway.admin.lifecycle_api import lifecycle_admin
from tidegate.gateway.app import create_app
from tidegate.gateway.auth.auth_settings import AuthSettings
from tidegate.gateway.gateway_services import GatewayConfig
from tidegate.gateway.gateway_settings import GatewaySettings
from tidegate.gateway.slow_clients import GatewayHttpProtocol

__all__ = ["APP_FACTORY", "serve", "served_app", "uvicorn_options", "worker_settings"]

APP_FACTORY = "tidegate.gateway.serving:served_app"
_ENV_PREFIX = "TIDEGATE_GATEWAY_"


def worker_settings(settings: GatewaySettings, pid: int) -> GatewaySettings:
    """The settings of one worker process: a replica id given for the whole gateway gets the
    process id appended, so that no two workers claim reply partitions under one name."""
    if settings.workers > 1 and "replica_id" in settings.model_fields_set:
        return settings.model_copy(update={"replica_id": f"{settings.replica_id}-{pid}"})
    return settings


def served_app() -> FastAPI:
    """The app of one gateway process, from the settings in the environment (uvicorn's factory)."""
    # A spawned worker starts with logging unconfigured.
    configure_logging()
    settings = worker_settings(GatewaySettings(), os.getpid())
    admin = lifecycle_admin if settings.admin else None
    app = create_app(GatewayConfig(gateway=settings), admin=admin)
    # What was imported and built so far lives as long as the process.
    settle()
    return app


def uvicorn_options(settings: GatewaySettings) -> dict[str, Any]:
    """uvicorn's options for these settings (what `serve` runs it with)."""
    options: dict[str, Any] = {
        "host": settings.host,
        "port": settings.port,
        "workers": settings.workers,
        # A line per request costs more CPU than the rest of a call's bookkeeping together.
        "access_log": settings.access_log,
        "log_config": None,
        "lifespan": "on",
        "timeout_graceful_shutdown": settings.shutdown_timeout_s,
        # A class, pickled by name into spawned workers, which read its limits from the
        # environment as they read the app's settings.
        "http": GatewayHttpProtocol,
        "proxy_headers": True,
        "forwarded_allow_ips": settings.forwarded_allow_ips,
    }
    if settings.tls_certfile is not None and settings.tls_keyfile is not None:
        password = settings.tls_keyfile_password
        options.update(
            ssl_certfile=str(settings.tls_certfile),
            ssl_keyfile=str(settings.tls_keyfile),
            ssl_keyfile_password=password.get_secret_value() if password else None,
        )
    return options


def check_exposure(host: str, auth: AuthSettings) -> None:
    """Refuse to serve with authentication off (`--insecure`, `TIDEGATE_AUTH_ENABLED=false`) on
    any address but a loopback one: every caller would be an admin."""
    if auth.enabled or is_loopback(host):
        return
    raise ConfigurationError(
        f"authentication is off, and {host!r} is not a loopback address: anyone who reaches it "
        "would be an admin. Serve on 127.0.0.1 (or ::1), or turn authentication on"
    )


def serve(overrides: Mapping[str, Any] | None = None) -> None:
    """Serve until SIGTERM or Ctrl-C, with `overrides` of the `GatewaySettings` fields."""
    # Workers read their settings from the environment they inherit, overrides included.
    for name, value in (overrides or {}).items():
        plain = value.get_secret_value() if isinstance(value, SecretStr) else value
        os.environ[f"{_ENV_PREFIX}{name.upper()}"] = str(plain)
    configure_logging()
    settings = GatewaySettings()
    check_exposure(settings.host, AuthSettings())
    topics = TopicSettings()
    if settings.workers > topics.reply_partitions:
        raise ConfigurationError(
            f"{settings.workers} workers need as many partitions of {topics.replies!r}, which "
            f"has {topics.reply_partitions}: the others could never be ready"
        )
    # uvicorn turns SIGTERM and SIGINT into a graceful shutdown: the lifespan exit releases the
    # reply lease, stops the reply consumer and flushes the producer.
    uvicorn.run(APP_FACTORY, factory=True, **uvicorn_options(settings))
