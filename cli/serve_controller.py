"""`tidegate controller`: the lifecycle's background process, until SIGTERM or SIGINT.

It publishes the event store's outbox to the lifecycle topic, indexes results and shadow
comparisons into PostgreSQL (`tidegate served`, `models compare`), drives canaries and deletes
lineage rows past their retention (TIDEGATE_LIFECYCLE_LINEAGE_RETENTION_DAYS). Run as many as you
like for availability: one per database schema acts, the others wait to take over.
Settings come from the environment (TIDEGATE_POSTGRES_*, TIDEGATE_LIFECYCLE_*, TIDEGATE_KAFKA_*,
TIDEGATE_TOPICS_*, TIDEGATE_SCHEMA_REGISTRY_*).
"""

from __future__ import annotations

import asyncio
import signal
from typing import Annotated

import typer

from tidegate.core.db import migrate as apply_migrations
from tidegate.core.event_loops import new_event_loop
from tidegate.core.heap import settle
from tidegate.core.telemetry import configure_logging

__all__ = ["controller"]


def controller(
    group_id: Annotated[
        str | None, typer.Option(help="Consumer group of the lineage indexer.")
    ] = None,
    metrics_port: Annotated[
        int, typer.Option(help="Port of the Prometheus /metrics endpoint (0: none).")
    ] = 0,
    migrate: Annotated[
        bool, typer.Option(help="Apply pending database migrations before starting.")
    ] = False,
) -> None:
    """Run the outbox relay, the lineage indexer and the canary controller."""
    from tidegate.lifecycle.control.indexer import DEFAULT_GROUP_ID
    from tidegate.lifecycle.control.process import ControllerConfig, ControllerService

    configure_logging()
    config = ControllerConfig(group_id=group_id or DEFAULT_GROUP_ID)
    if migrate:
        apply_migrations(config.postgres)
    server = None
    if metrics_port:
        from prometheus_client import start_http_server

        server, _thread = start_http_server(metrics_port)

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await ControllerService(config).run(stop)

    # Imported and configured: start-up is over (why: `tidegate.core.heap`).
    settle()
    try:
        kind = config.lifecycle.controller_event_loop
        with asyncio.Runner(loop_factory=lambda: new_event_loop(kind)) as runner:
            runner.run(main())
    finally:
        if server is not None:
            server.shutdown()
