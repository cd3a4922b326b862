"""The worker as a Faust application: Faust owns the app, the service graph and the lifecycle.

Faust's own event path (aiokafka, one event at a time) measured at under 1% of a confluent-kafka
batch relay on this hardware (docs/decisions/002-worker-hot-path.md), so the app boots without
Faust's Kafka consumer, producer and web server. Its one agent, `InferenceAgent`, is a Faust (mode)
service that runs the confluent-kafka hot path in `tidegate.agents.worker`. The Faust `Worker`
starts it, installs the SIGTERM/SIGINT handlers and stops it gracefully: stop consuming, drain,
commit, exit. A failure of the hot path crashes the app, and the process exits non-zero. What the
agent starts, and in which order, is `tidegate.agents.assembly.running_worker`.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Iterable
from contextlib import AsyncExitStack
from typing import Any

import faust
from faust.app.base import BootStrategy
from mode import Service, ServiceT
from prometheus_client import REGISTRY

from tidegate.agents.assembly import RunningWorker, WorkerConfig, running_worker
from tidegate.agents.gpu_metrics import nvml_collector
from tidegate.core.aio import LoopWatchdog
from tidegate.core.event_loops import new_event_loop
from tidegate.core.heap import settle
from tidegate.core.telemetry import get_logger

__all__ = ["STALL_EXIT", "InferenceAgent", "WorkerConfig", "create_app", "run_worker"]

log = get_logger(__name__)
STALL_EXIT = 70
"""The exit status of a worker process whose event loop stalled (EX_SOFTWARE)."""


class _HotPathBoot(BootStrategy):
    # The confluent-kafka hot path has its own clients and /metrics server.
    enable_kafka = False
    enable_web = False


class _WorkerApp(faust.App):
    BootStrategy = _HotPathBoot

    def __init__(self, *args: Any, agent: Service, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.inference_agent = agent

    def on_init_dependencies(self) -> Iterable[ServiceT]:
        return [*super().on_init_dependencies(), self.inference_agent]

    async def on_first_start(self) -> None:
        """No tables, so no data directory to create."""


class InferenceAgent(Service):
    """Catches up the lifecycle, loads and warms up every wanted version, then consumes; drains,
    commits and reports its unloads on stop (`tidegate.agents.assembly.running_worker`)."""

    def __init__(self, config: WorkerConfig, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.config = config
        self.running: RunningWorker | None = None
        self._stack = AsyncExitStack()

    async def on_start(self) -> None:
        try:
            if self.config.worker.metrics_port:
                from prometheus_client import start_http_server

                server, thread = start_http_server(self.config.worker.metrics_port)
                self._stack.callback(thread.join, 5)
                self._stack.callback(server.shutdown)
                gpus = nvml_collector()
                if gpus is not None:  # a CUDA host: its GPUs' utilisation and memory too
                    REGISTRY.register(gpus)
                    self._stack.callback(gpus.close)
                    self._stack.callback(REGISTRY.unregister, gpus)
            self.running = await self._stack.enter_async_context(running_worker(self.config))
            limit = self.config.worker.stall_exit_s
            if limit:
                watchdog = LoopWatchdog(limit, _exit_stalled)
                watchdog.start()
                self._stack.push_async_callback(watchdog.stop)
            # Models are loaded and warm: start-up is over (why: `tidegate.core.heap`).
            settle()
        except BaseException:
            await self._stack.aclose()
            raise

    @Service.task
    async def _watch(self) -> None:
        if self.running is None:
            return
        try:
            await self.running.worker.wait()
        except Exception as exc:
            await self.crash(exc)

    async def on_stop(self) -> None:
        await self._stack.aclose()


def _exit_stalled(stalled_s: float) -> None:
    # Nothing on the loop can run any more, a clean stop included: end the process now.
    log.critical(
        "the event loop has not run for %.0f s (a model call hung on it); exiting", stalled_s
    )
    logging.shutdown()
    os._exit(STALL_EXIT)


def create_app(config: WorkerConfig) -> faust.App:
    servers = config.kafka.bootstrap_servers.split(",")
    return _WorkerApp(
        f"tidegate-worker-{config.worker.group_id}",
        broker=[f"kafka://{s}" for s in servers],
        web_enabled=False,
        agent=InferenceAgent(config),
    )


def run_worker(config: WorkerConfig) -> None:
    """Run until SIGTERM or SIGINT; exits the process (non-zero when the worker failed)."""
    from faust.worker import Worker

    app = create_app(config)
    loop = new_event_loop(config.worker.event_loop)
    asyncio.set_event_loop(loop)  # faust's services look the loop up, as well as take it
    worker = Worker(app, quiet=True, override_logging=False, redirect_stdouts=False, loop=loop)
    worker.execute_from_commandline()
