"""`tidegate worker`: run one inference worker until SIGTERM or SIGINT.

Any number of workers share one consumer group. Each reads the `model-lifecycle` topic to its end
and loads and warms up every version its routing tables want before it consumes, then follows the
topic: it loads new versions before they take traffic and reports them (VersionLoaded) through the
event store, which is why workers need TIDEGATE_POSTGRES_* too. Settings come from the environment
(TIDEGATE_WORKER_*, TIDEGATE_TOPICS_*, ...); the options below override the worker's own.
"""

from __future__ import annotations

from typing import Annotated

import typer

from tidegate.core.telemetry import configure_logging

__all__ = ["worker"]


def worker(
    group_id: Annotated[
        str | None, typer.Option(help="Consumer group shared by the workers.")
    ] = None,
    worker_id: Annotated[
        str | None, typer.Option(help="This worker's name (default: host-pid).")
    ] = None,
    metrics_port: Annotated[
        int | None, typer.Option(help="Port of the Prometheus /metrics endpoint (0: none).")
    ] = None,
    max_batch_size: Annotated[int | None, typer.Option(help="Most requests in one batch.")] = None,
    max_batch_delay_ms: Annotated[
        float | None, typer.Option(help="Longest wait for a batch to fill, in milliseconds.")
    ] = None,
) -> None:
    """Consume inference requests, micro-batch them per partition, publish results."""
    from pydantic import ValidationError

    from tidegate.agents.faust_app import WorkerConfig, run_worker
    from tidegate.agents.worker_settings import WorkerSettings

    overrides = {
        "group_id": group_id,
        "worker_id": worker_id,
        "metrics_port": metrics_port,
        "max_batch_size": max_batch_size,
        "max_batch_delay_ms": max_batch_delay_ms,
    }
    try:
        settings = WorkerSettings.model_validate(
            {k: v for k, v in overrides.items() if v is not None}
        )
    except ValidationError as exc:
        raise typer.BadParameter(str(exc)) from None
    configure_logging()
    run_worker(WorkerConfig(worker=settings))
