"""`tidegate worker`: run inference workers until SIGTERM or SIGINT.

Any number of workers share one consumer group. Each reads the `model-lifecycle` topic to its end
and loads and warms up every version its routing tables want before it consumes, then follows the
topic: it loads new versions before they take traffic and reports them (VersionLoaded) through the
event store, which is why workers need TIDEGATE_POSTGRES_* too. Settings come from the environment
(TIDEGATE_WORKER_*, TIDEGATE_TOPICS_*, ...); the options below override the worker's own.

A worker's consumer, event loop and model threads share one GIL, so one process uses about one
core: `--processes N` (default: one per core this process may run on) runs N workers, supervised
by `tidegate.cli.worker_pool`; with 1 the worker runs in this process, with no supervisor.
"""

from __future__ import annotations

import os
from typing import Annotated

import typer

from tidegate.cli.worker_pool import Supervisor, worker_slots
from tidegate.core.telemetry import configure_logging

__all__ = ["worker"]

# A stopping child drains within the worker's drain timeout, then commits and flushes, which the
# worker itself bounds at 30 s more (as deploy/k8s's 90 s grace period assumes): only then is it
# stuck, and the supervisor kills it.
STOP_MARGIN_S = 30.0


def default_processes() -> int:
    """One per core this process may run on (its CPU affinity, which taskset and cpusets set)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def worker(
    group_id: Annotated[
        str | None, typer.Option(help="Consumer group shared by the workers.")
    ] = None,
    worker_id: Annotated[
        str | None,
        typer.Option(
            help="This worker's name (default: host-pid); with --processes N, the base of the "
            "children's names <worker-id>-1 ... <worker-id>-N."
        ),
    ] = None,
    metrics_port: Annotated[
        int | None,
        typer.Option(
            help="Port of the Prometheus /metrics endpoint (0: none); with --processes N, child k "
            "serves on this port + k - 1."
        ),
    ] = None,
    max_batch_size: Annotated[int | None, typer.Option(help="Most requests in one batch.")] = None,
    max_batch_delay_ms: Annotated[
        float | None,
        typer.Option(
            help="How long an idle model waits for a fuller batch, in milliseconds (0: at once; "
            "a busy model's next batch collects while it runs anyway)."
        ),
    ] = None,
    pool: Annotated[
        str | None,
        typer.Option(
            help="The model pool to serve (docs/pools.md): its topics, its group "
            "`<group-id>.<pool>`, its models. Default: $TIDEGATE_WORKER_POOL, else the default "
            "pool."
        ),
    ] = None,
    processes: Annotated[
        int | None,
        typer.Option(
            min=1,
            help="Worker processes on this host, all in the one group (default: "
            "$TIDEGATE_WORKER_PROCESSES, else one per core). "
            "With more than 1, a supervisor runs them, forwards SIGTERM and SIGINT to them and "
            "restarts one that exits (after 1 s, doubling to 30 s).",
        ),
    ] = None,
) -> None:
    """Consume inference requests, micro-batch them, publish results."""
    from pydantic import ValidationError

    from tidegate.agents.faust_app import WorkerConfig, run_worker
    from tidegate.agents.worker_settings import WorkerSettings

    overrides = {
        "group_id": group_id,
        "worker_id": worker_id,
        "metrics_port": metrics_port,
        "max_batch_size": max_batch_size,
        "max_batch_delay_ms": max_batch_delay_ms,
        "pool": pool,
    }
    try:
        settings = WorkerSettings.model_validate(
            {k: v for k, v in overrides.items() if v is not None}
        )
    except ValidationError as exc:
        raise typer.BadParameter(str(exc)) from None
    count = processes or settings.processes or default_processes()
    if settings.metrics_port and settings.metrics_port + count - 1 > 65535:
        raise typer.BadParameter(f"{count} metrics ports from {settings.metrics_port} pass 65535")
    configure_logging()
    if count == 1:
        run_worker(WorkerConfig(worker=settings))
        return
    # The children read the same environment; only what the command line set is passed on.
    options = [
        arg
        for name, value in overrides.items()
        if value is not None and name not in ("worker_id", "metrics_port")
        for arg in (f"--{name.replace('_', '-')}", str(value))
    ]
    slots = worker_slots(
        count,
        base_id=settings.worker_id,
        metrics_port=settings.metrics_port,
        options=options,
        transactional_id=settings.transactional_id,
    )
    stop_timeout_s = settings.drain_timeout_s + STOP_MARGIN_S
    raise typer.Exit(Supervisor(slots, stop_timeout_s=stop_timeout_s).run())
