"""The worker as a Faust application: Faust owns the app, the service graph and the lifecycle.

Faust's own event path (aiokafka, one event at a time) measured at under 1% of a confluent-kafka
batch relay on this hardware (docs/decisions/002-worker-hot-path.md), so the app boots without
Faust's Kafka consumer, producer and web server. Its one agent, `InferenceAgent`, is a Faust
(mode) service that runs the confluent-kafka hot path in `agents.worker`. The Faust `Worker`
starts it, installs the SIGTERM/SIGINT handlers and stops it gracefully: stop consuming, drain,
commit, exit. A failure of the hot path crashes the app, and the process exits non-zero.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import faust
from faust.app.base import BootStrategy
from mode import Service, ServiceT

from agents.loaded import ModelCache, store_loader
from agents.service import InferenceService
from agents.serving import ServingResolver, load_serving_table
from agents.worker import InferenceWorker
from tidegate.settings import (
    KafkaSettings,
    ModelSettings,
    SchemaRegistrySettings,
    TopicSettings,
    WorkerSettings,
)
from tidegate.telemetry import get_logger

__all__ = ["InferenceAgent", "WorkerConfig", "create_app", "run_worker"]

log = get_logger(__name__)


@dataclass(frozen=True)
class WorkerConfig:
    worker: WorkerSettings = field(default_factory=WorkerSettings)
    kafka: KafkaSettings = field(default_factory=KafkaSettings)
    topics: TopicSettings = field(default_factory=TopicSettings)
    models: ModelSettings = field(default_factory=ModelSettings)
    registry: SchemaRegistrySettings = field(default_factory=SchemaRegistrySettings)


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
    """Loads and warms up every serving version, then consumes; drains and commits on stop."""

    def __init__(self, config: WorkerConfig, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.config = config
        self.service: InferenceService | None = None
        self.worker: InferenceWorker | None = None
        self._metrics: Any = None

    async def on_start(self) -> None:
        cfg = self.config
        models = ModelCache(store_loader(cfg.models))
        from agents.store import LocalArtifactStore

        resolver = ServingResolver(
            load_serving_table(cfg.models.serving_config), LocalArtifactStore(cfg.models)
        )
        self.service = InferenceService(resolver, models, worker_id=cfg.worker.worker_id)
        failures = await self.service.start()
        for (name, version), why in failures.items():
            log.error("%s version %s cannot serve: %s", name, version, why)
        if cfg.worker.metrics_port:
            from prometheus_client import start_http_server

            self._metrics = start_http_server(cfg.worker.metrics_port)
        self.worker = InferenceWorker(
            self.service,
            settings=cfg.worker,
            kafka=cfg.kafka,
            topics=cfg.topics,
            registry=cfg.registry,
        )
        await self.worker.start()
        log.info(
            "worker %s consuming %s in group %s (models: %s)",
            cfg.worker.worker_id,
            cfg.topics.requests,
            cfg.worker.group_id,
            ", ".join(f"{n}:{v}" for n, v in models.loaded()) or "none",
        )

    @Service.task
    async def _watch(self) -> None:
        if self.worker is None:
            return
        try:
            await self.worker.wait()
        except Exception as exc:
            await self.crash(exc)

    async def on_stop(self) -> None:
        if self.worker is not None:
            await self.worker.stop()
        if self.service is not None:
            await self.service.stop()
        if self._metrics is not None:
            server, thread = self._metrics
            server.shutdown()
            thread.join(timeout=5)


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
    worker = Worker(app, quiet=True, override_logging=False, redirect_stdouts=False)
    worker.execute_from_commandline()
