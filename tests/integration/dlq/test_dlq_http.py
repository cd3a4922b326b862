"""`/admin/dlq` against the real Kafka and registry, through httpx's ASGI transport: the reads
answer the same views as the CLI, a redrive runs as a job that can be polled, stopped and resumed
with nothing sent twice, and mistakes are problems (400, 404, 422), never 500s."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from tests.integration.dlq.dlq_fixtures import DlqStack, read_all
from tidegate.core.errors import InvalidInputError, ModelExecutionError
from tidegate.gateway.admin.dlq_api import DlqService, install_dlq
from tidegate.gateway.auth.authn import INSECURE, Authenticator, install_authenticator
from tidegate.gateway.problems import PROBLEM_JSON


def write(stack: DlqStack) -> None:
    now = int(time.time() * 1000)
    letters: list[tuple[dict[str, Any] | bytes, int]] = []
    for i in range(20):
        model = "fraud" if i < 12 else "minilm"
        exc = ModelExecutionError("boom") if i % 2 == 0 else InvalidInputError("bad", "features")
        envelope = stack.envelope(
            exc=exc,
            failed_at_ms=now - 20_000 + i * 1000,
            key=f"k{i}".encode(),
            value=stack.request_bytes(f"h{i:02d}", model),
            rid=f"h{i:02d}",
            model=model,
            offset=i,
        )
        letters.append((envelope, now - 20_000 + i * 1000))
    stack.produce_letters(stack.topics.failed, letters)


@pytest.fixture
async def client(dlq_stack: DlqStack) -> AsyncIterator[httpx.AsyncClient]:
    write(dlq_stack)
    app = FastAPI()
    install_dlq(app, DlqService(dlq_stack.kafka, dlq_stack.topics, dlq_stack.registry))
    # Not a test of authentication (tests/integration/gateway/test_auth.py is): an admin calls.
    install_authenticator(app, Authenticator.fixed(INSECURE))
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://dlq") as http:
        yield http
    await app.state.dlq.stop_all()


async def test_the_reads(client: httpx.AsyncClient, dlq_stack: DlqStack) -> None:
    stats = (await client.get("/admin/dlq/stats")).json()
    assert stats["count"] == 20
    assert {k: v["count"] for k, v in stats["by_model"].items()} == {"fraud": 12, "minilm": 8}
    assert {k: v["count"] for k, v in stats["by_code"].items()} == {
        "MODEL_ERROR": 10,
        "INVALID_INPUT": 10,
    }
    picked = await client.get(
        "/admin/dlq/messages",
        params=[("model", "fraud"), ("code", "MODEL_ERROR"), ("limit", "3")],
    )
    body = picked.json()
    assert (body["count"], body["truncated"]) == (3, True)
    assert {m["model"] for m in body["messages"]} == {"fraud"}
    first = body["messages"][0]
    one = await client.get(
        f"/admin/dlq/messages/{first['topic']}/{first['partition']}/{first['offset']}"
    )
    assert one.status_code == 200
    assert one.json()["request"]["request_id"] == first["request_id"]
    windowed = await client.get(
        "/admin/dlq/stats", params={"topic": "failed", "since": "-10s", "until": "now"}
    )
    assert 0 < windowed.json()["count"] < 20


@pytest.mark.parametrize(
    ("method", "url", "body", "status", "field"),
    [
        ("GET", "/admin/dlq/messages?topic=inference-results", None, 400, "topic"),
        ("GET", "/admin/dlq/stats?since=yesterday", None, 400, "since"),
        ("GET", "/admin/dlq/stats?since=now&until=-1h", None, 400, "since"),
        ("GET", "/admin/dlq/messages?limit=-1", None, 400, "query.limit"),
        ("POST", "/admin/dlq/redrive", {"rate": 0}, 400, "body.rate"),
        ("POST", "/admin/dlq/redrive", {"source": "results"}, 400, "from"),
        ("POST", "/admin/dlq/redrive", {"resume": True}, 400, "run_id"),
        ("POST", "/admin/dlq/redrive", {"run_id": "a b"}, 400, "run_id"),
        ("POST", "/admin/dlq/redrive", {"nonsense": 1}, 400, "body.nonsense"),
        ("GET", "/admin/dlq/redrive/nobody", None, 404, None),
    ],
)
async def test_mistakes_are_problems(
    client: httpx.AsyncClient,
    method: str,
    url: str,
    body: dict[str, Any] | None,
    status: int,
    field: str | None,
) -> None:
    response = await client.request(method, url, json=body)
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == PROBLEM_JSON
    assert response.json().get("field") == field


async def test_a_missing_letter_is_404(client: httpx.AsyncClient, dlq_stack: DlqStack) -> None:
    response = await client.get(f"/admin/dlq/messages/{dlq_stack.topics.failed}/0/999999")
    assert response.status_code == 404
    assert response.json()["code"] == "DEAD_LETTER_NOT_FOUND"


async def test_a_dry_run_answers_at_once_with_what_it_would_do(
    client: httpx.AsyncClient, dlq_stack: DlqStack
) -> None:
    response = await client.post(
        "/admin/dlq/redrive",
        json={"dry_run": True, "wait": True, "model": ["minilm"], "run_id": "http-dry"},
    )
    assert response.status_code == 200, response.text
    report = response.json()
    assert report["state"] == "done"
    assert report["counts"]["would_redrive"] == 8
    assert report["counts"]["skipped"] == 12
    assert len(report["outcomes"]) == 20


async def test_a_redrive_job_is_polled_stopped_and_resumed(
    client: httpx.AsyncClient, dlq_stack: DlqStack
) -> None:
    started = await client.post("/admin/dlq/redrive", json={"run_id": "http-job", "rate": 8})
    assert started.status_code == 202, started.text
    assert started.headers["location"] == "/admin/dlq/redrive/http-job"
    again = await client.post("/admin/dlq/redrive", json={"run_id": "http-job"})
    assert again.status_code == 422, "one run id runs once at a time"

    async def sent_some() -> dict[str, Any]:
        while True:
            status: dict[str, Any] = (await client.get("/admin/dlq/redrive/http-job")).json()
            if status["counts"]["redriven"] >= 3:
                return status
            await asyncio.sleep(0.1)

    running = await asyncio.wait_for(sent_some(), 30)
    assert running["state"] == "running"
    stopped = (await client.delete("/admin/dlq/redrive/http-job")).json()
    assert stopped["state"] == "stopped"
    first = stopped["counts"]["redriven"]
    assert 3 <= first < 20
    jobs = (await client.get("/admin/dlq/redrive")).json()
    assert [j["run_id"] for j in jobs] == ["http-job"]

    resumed = await client.post(
        "/admin/dlq/redrive",
        json={"run_id": "http-job", "resume": True, "rate": 1000, "wait": True},
    )
    assert resumed.status_code == 200, resumed.text
    assert resumed.json()["counts"]["redriven"] == 20 - first
    detail = (await client.get("/admin/dlq/redrive/http-job", params={"outcomes": "true"})).json()
    assert detail["state"] == "done"
    assert len(detail["outcomes"]) == 20 - first
    arrived = read_all(dlq_stack, dlq_stack.topics.requests, 20)
    ids = [dlq_stack.decode_request(m.value())["request_id"] for m in arrived]
    assert sorted(ids) == [f"h{i:02d}" for i in range(20)], "each letter once over both runs"
