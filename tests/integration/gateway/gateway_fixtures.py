"""The gateway integration tests' shared set-up: topics of each test's own (4 partitions, 4 reply
partitions) with their subjects, and the models the fake worker serves, appended as lifecycle events
through `LifecycleLog` (into the test's own database schema) so the gateway reads them from the
lifecycle topic. A test module takes the fixtures by name: `topics = gateway_fixtures.topics`.
`GatewayServer` runs one replica with uvicorn in a thread, on a free port."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import uvicorn

from tests.integration.fakes import register_subjects
from tests.support import free_port, wait_for
from tests.unit.gateway_harness import ECHO, FRAUD
from tidegate.cli.procs import Child, spawn
from tidegate.core.settings import (
    KafkaSettings,
    PostgresSettings,
    SchemaRegistrySettings,
    TopicSettings,
)
from tidegate.gateway.admin.lifecycle_api import AdminFactory
from tidegate.gateway.app import create_app
from tidegate.gateway.gateway_services import GatewayConfig, ServicesFactory, kafka_services
from tidegate.gateway.slow_clients import ConnectionLimits, guarded_protocol
from tidegate.gateway.v2api.gateway_runtime import GatewayRuntime
from tidegate.lifecycle.domain import events as ev
from tidegate.lifecycle.domain.events import NewEvent
from tidegate.lifecycle.eventstore.lifecycle_log import LifecycleLog
from tidegate.lifecycle.lifecycle_settings import LifecycleSettings
from tidegate.schemas.catalog import MODEL_LIFECYCLE_EVENT
from tidegate.schemas.registration import RegistryHttp, register_all
from tidegate.schemas.signature import Signature

__all__ = [
    "GatewayServer",
    "ProtocolGateway",
    "append_lifecycle",
    "fraud_body",
    "gateway_topics",
    "lifecycle",
    "served",
    "spawn_gateway",
    "topic_env",
    "topics",
]


@pytest.fixture
def topics(
    new_topic: Callable[..., str], registry_settings: SchemaRegistrySettings
) -> TopicSettings:
    return gateway_topics(new_topic, registry_settings)


def gateway_topics(
    new_topic: Callable[..., str], registry_settings: SchemaRegistrySettings
) -> TopicSettings:
    """The `topics` fixture's topics, for a module whose own `topics` adds to them."""
    settings = TopicSettings(
        requests=new_topic("it-gw-requests", 4),
        results=new_topic("it-gw-results", 4),
        replies=new_topic("it-gw-replies", 4),
        lifecycle=new_topic("it-gw-lifecycle", 1),
        reply_partitions=4,
    )
    register_subjects(registry_settings, settings)
    with RegistryHttp(registry_settings) as http:
        list(register_all(http, {f"{settings.lifecycle}-value": MODEL_LIFECYCLE_EVENT}))
    return settings


def spawn_gateway(topics: TopicSettings, run_dir: Path, *args: str) -> tuple[Child, str]:
    """`tidegate gateway ARGS...` on these topics and a free port; the child and its base URL."""
    port = free_port()
    env = {**topic_env(topics), "TIDEGATE_GATEWAY_PORT": str(port)}
    return spawn("gateway", ["gateway", *args], run_dir, env), f"http://127.0.0.1:{port}"


def topic_env(topics: TopicSettings) -> dict[str, str]:
    """The environment that points a `tidegate` process at these topics."""
    return {
        "TIDEGATE_TOPICS_REQUESTS": topics.requests,
        "TIDEGATE_TOPICS_RESULTS": topics.results,
        "TIDEGATE_TOPICS_REPLIES": topics.replies,
        "TIDEGATE_TOPICS_LIFECYCLE": topics.lifecycle,
        "TIDEGATE_TOPICS_REPLY_PARTITIONS": str(topics.reply_partitions),
    }


def served(
    *versions: str, primary: str, signature: Signature, runtime: str = "onnx"
) -> list[ev.Payload]:
    """Each version registered, validated and warm on the fake worker; `primary` promoted."""
    out: list[ev.Payload] = []
    for version in versions:
        out += [
            ev.ModelRegistered(
                version,
                runtime,
                f"store://{version}",
                {},
                signature_json=signature.model_dump_json(),
            ),
            ev.ArtifactValidated(version),
            ev.VersionLoaded(version, "fake-worker"),
        ]
    return [*out, ev.Promoted(primary)]


@pytest.fixture
def lifecycle(
    kafka_settings: KafkaSettings,
    topics: TopicSettings,
    registry_settings: SchemaRegistrySettings,
    pg_settings: PostgresSettings,
) -> None:
    """fraud 1 (primary) and 2, echo 1 (primary): what the fake worker serves."""
    append_lifecycle(kafka_settings, topics, registry_settings, pg_settings)


def append_lifecycle(
    kafka: KafkaSettings,
    topics: TopicSettings,
    registry: SchemaRegistrySettings,
    pg: PostgresSettings,
) -> None:
    """The `lifecycle` fixture's events, for a benchmark that sets up its own."""

    async def append() -> None:
        log = LifecycleLog.from_settings(
            pg, LifecycleSettings(), kafka, topics, registry, publish=True
        )
        async with log:
            for model, payloads in (
                ("fraud", served("1", "2", primary="1", signature=FRAUD)),
                ("echo", served("1", primary="1", signature=ECHO)),
            ):
                events = [NewEvent(p, actor="it") for p in payloads]
                await log.append(model, events, expected_version=0)

    asyncio.run(append())


def fraud_body(rows: int = 2, **extra: Any) -> dict[str, Any]:
    data = np.arange(rows * 4, dtype=np.float32).reshape(rows, 4).tolist()
    return {
        "inputs": [{"name": "features", "datatype": "FP32", "shape": [rows, 4], "data": data}],
        **extra,
    }


class GatewayServer:
    """One gateway replica served by uvicorn in a thread, on a free port."""

    def __init__(
        self,
        config: GatewayConfig,
        services: ServicesFactory = kafka_services,
        admin: AdminFactory | None = None,
    ) -> None:
        """`admin`: serve /admin with these commands (`lifecycle_admin`: the real ones)."""
        self.app = create_app(config, services, admin=admin)
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self.port = int(self._sock.getsockname()[1])
        self.url = f"http://127.0.0.1:{self.port}"
        self._server = uvicorn.Server(
            uvicorn.Config(self.app, log_config=None, lifespan="on", timeout_graceful_shutdown=5)
        )
        self._thread = threading.Thread(target=self._server.run, args=([self._sock],), daemon=True)
        self.http = httpx.Client(base_url=self.url, timeout=30)

    @property
    def runtime(self) -> GatewayRuntime:
        runtime: GatewayRuntime = self.app.state.gateway
        return runtime

    def start(self, ready_timeout_s: float = 30.0) -> GatewayServer:
        self._thread.start()
        wait_for(
            lambda: self.http.get("/v2/health/ready").status_code == 200,
            timeout=ready_timeout_s,
            what=f"gateway on {self.url} to be ready",
            retry_on=(httpx.TransportError,),  # until uvicorn listens
        )
        return self

    def stop(self) -> None:
        self.http.close()
        self._server.should_exit = True
        self._thread.join(timeout=20)
        self._sock.close()


class ProtocolGateway(GatewayServer):
    """A replica served with the gateway's own HTTP protocol (admission refuses there), as
    `tidegate gateway` serves it."""

    def __init__(self, config: GatewayConfig) -> None:
        super().__init__(config)
        protocol = guarded_protocol(ConnectionLimits.of(config.gateway))
        self._server = uvicorn.Server(
            uvicorn.Config(
                self.app,
                http=protocol,
                log_config=None,
                lifespan="on",
                timeout_graceful_shutdown=5,
            )
        )
        self._thread = threading.Thread(target=self._server.run, args=([self._sock],), daemon=True)
