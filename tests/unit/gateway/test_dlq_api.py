"""`/admin/dlq` without Kafka: it is mounted with /admin, it takes the replica's settings, and a
caller's mistakes are answered as problems before anything is read (the reads and redrives
themselves are in tests/integration/dlq/test_dlq_http.py)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from tidegate.core.settings import KafkaSettings, SchemaRegistrySettings, TopicSettings
from tidegate.dlq.inspect import DeadLetterUnavailableError
from tidegate.dlq.redrive import Redrive
from tidegate.dlq.redrive_report import RedriveOptions
from tidegate.gateway.admin.dlq_api import DlqService, RedriveJob, _service, install_dlq
from tidegate.gateway.admin.lifecycle_api import install_admin
from tidegate.gateway.auth.authn import INSECURE, Authenticator, install_authenticator
from tidegate.gateway.problems import PROBLEM_JSON

# Nothing listens here: a test that reached Kafka would fail on a timeout, not pass.
NOWHERE = KafkaSettings(bootstrap_servers="127.0.0.1:1")
TOPICS = TopicSettings(failed="t-failed", poison="t-poison")


@pytest.fixture
def client() -> TestClient:
    app = FastAPI()
    install_dlq(app, DlqService(NOWHERE, TOPICS, SchemaRegistrySettings()))
    # Not a test of authentication (tests/unit/gateway/test_permissions.py is): an admin calls.
    install_authenticator(app, Authenticator.fixed(INSECURE))
    return TestClient(app)


def test_admin_mounts_the_dlq_routes() -> None:
    app = FastAPI()
    install_admin(app)
    paths = {getattr(route, "path", "") for route in app.routes}
    assert {
        "/admin/dlq/messages",
        "/admin/dlq/messages/{topic}/{partition}/{offset}",
        "/admin/dlq/stats",
        "/admin/dlq/redrive",
        "/admin/dlq/redrive/{run_id}",
    } <= paths


def test_the_routes_use_the_replica_settings() -> None:
    class Runtime:
        class config:  # noqa: N801 - stands in for GatewayConfig's attributes
            kafka = NOWHERE
            topics = TOPICS
            registry = SchemaRegistrySettings()

    app = FastAPI()
    app.state.gateway = Runtime()

    class Request:
        pass

    request: Any = Request()
    request.app = app
    service = _service(request)
    assert (service.kafka, service.topics) == (NOWHERE, TOPICS)
    assert _service(request) is service, "one service (and its jobs) per app"


@pytest.mark.parametrize(
    ("method", "url", "body", "field"),
    [
        ("GET", "/admin/dlq/messages?topic=inference-requests", None, "topic"),
        ("GET", "/admin/dlq/stats?until=tomorrow", None, "until"),
        ("GET", "/admin/dlq/stats?since=-1m&until=-2h", None, "since"),
        ("GET", "/admin/dlq/messages/other-topic/0/1", None, "topic"),
        ("GET", "/admin/dlq/messages/t-failed/-1/1", None, "path.partition"),
        ("POST", "/admin/dlq/redrive", {"source": "inference-retry-1"}, "from"),
        ("POST", "/admin/dlq/redrive", {"rate": 1e9}, "body.rate"),
        ("POST", "/admin/dlq/redrive", {"limit": 0}, "body.limit"),
        ("POST", "/admin/dlq/redrive", {"resume": True}, "run_id"),
        ("POST", "/admin/dlq/redrive", {"run_id": "../x"}, "run_id"),
        ("POST", "/admin/dlq/redrive", {"code": "MODEL_ERROR"}, "body.code"),
    ],
)
def test_mistakes_are_400_problems_naming_the_field(
    client: TestClient, method: str, url: str, body: dict[str, Any] | None, field: str
) -> None:
    response = client.request(method, url, json=body)
    assert response.status_code == 400, response.text
    assert response.headers["content-type"] == PROBLEM_JSON
    problem = response.json()
    assert problem["field"] == field
    assert problem["status"] == 400


def test_an_unknown_job_is_404(client: TestClient) -> None:
    response = client.get("/admin/dlq/redrive/never-ran")
    assert response.status_code == 404
    assert response.json()["code"] == "DEAD_LETTER_NOT_FOUND"
    assert client.delete("/admin/dlq/redrive/never-ran").status_code == 404
    assert client.get("/admin/dlq/redrive").json() == []


def test_a_job_that_failed_says_why() -> None:
    async def go() -> dict[str, Any]:
        run = Redrive(NOWHERE, TOPICS, SchemaRegistrySettings(), RedriveOptions("t-failed"))

        async def broken() -> Any:
            raise DeadLetterUnavailableError("kafka is down")

        job = RedriveJob(run, asyncio.create_task(broken()))
        await asyncio.wait([job.task])
        return job.view()

    view = asyncio.run(go())
    assert view["state"] == "failed"
    assert view["error"] == {"message": "kafka is down", "code": "DLQ_UNAVAILABLE"}
