"""Admission's refusals answered by the HTTP protocol (`GatewayHttpProtocol`), on a real uvicorn
server in this process: a call admission refuses is answered 503 with Retry-After and a problem
body before the app sees it (no middleware, no body read), on a connection that stays open; other
routes, and calls once there is room, reach the app."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import pytest
import uvicorn

from tests.support import wait_for
from tidegate.gateway.admission.admission_control import ADMISSION_STATE, Admission
from tidegate.gateway.admission.admission_settings import AdmissionSettings
from tidegate.gateway.slow_clients import ConnectionLimits, guarded_protocol

# Serves uvicorn on a socket.
pytestmark = pytest.mark.slow


class App:
    """Counts the calls that reach it; its lifespan hands `admission` to the server's state."""

    def __init__(self, admission: Admission) -> None:
        self.admission = admission
        self.calls: list[str] = []

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    scope["state"][ADMISSION_STATE] = self.admission
                    await send({"type": "lifespan.startup.complete"})
                else:
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        self.calls.append(scope["path"])
        more = True
        while more:
            more = (await receive()).get("more_body", False)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})


@contextmanager
def serving(app: App) -> Iterator[httpx.Client]:
    protocol = guarded_protocol(ConnectionLimits(5, 5, 100, default_wait_s=10, max_wait_s=120))
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    config = uvicorn.Config(app, http=protocol, ws="none", log_config=None, lifespan="on")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, args=([sock],), daemon=True)
    thread.start()
    try:
        wait_for(lambda: server.started, timeout=10, interval=0.01, what="the server to start")
        port = int(sock.getsockname()[1])
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10) as http:
            yield http
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()


def full_admission(limit: int) -> Admission:
    admission = Admission(4096, AdmissionSettings(probe=False, initial_limit=limit, min_limit=1))
    for i in range(limit):
        admission.admit(f"held-{i}", model="fraud", wait_s=10)
    return admission


def test_a_refused_call_is_answered_503_before_the_app_and_the_connection_stays_open() -> None:
    app = App(full_admission(2))
    body = b'{"inputs": []}' * 1000
    with serving(app) as http:
        refused = http.post("/v2/models/fraud/infer", content=body)
        assert refused.status_code == 503
        assert refused.headers["retry-after"] == "1"
        assert refused.headers["content-type"] == "application/problem+json"
        problem = refused.json()
        assert problem["code"] == "OVERLOADED"
        assert problem["status"] == 503
        assert problem["retriable"] is True
        assert problem["instance"] == "/v2/models/fraud/infer"
        assert "2 calls of fraud are in flight" in problem["detail"]
        refused_version = http.post("/v2/models/fraud/versions/1/infer?x=1", content=body)
        assert refused_version.status_code == 503
        # The same connection serves the next request, and other routes and models reach the app.
        assert http.get("/v2/models/fraud").status_code == 200
        assert http.post("/v2/models/other/infer", content=body).status_code == 200
        assert app.calls == ["/v2/models/fraud", "/v2/models/other/infer"]
        app.admission.release("held-0")
        assert http.post("/v2/models/fraud/infer", content=body).status_code == 200


def test_the_wait_budget_comes_from_request_timeout() -> None:
    clock = [1000.0]
    admission = Admission(
        4096,
        AdmissionSettings(probe=False, lag_floor=0),
        clock=lambda: clock[0],
    )
    # The workers' backlog: 400 requests at 200/s, 2 s ahead of any new call.
    admission.observe_kafka(0, 0)
    clock[0] += 1
    admission.observe_kafka(400, 200)
    app = App(admission)
    with serving(app) as http:
        short = http.post("/v2/models/fraud/infer", headers={"Request-Timeout": "1"})
        assert short.status_code == 503
        assert short.headers["retry-after"] == "2"
        assert "estimated queueing delay, 2.00s" in short.json()["detail"]
        assert http.post("/v2/models/fraud/infer", headers={"Request-Timeout": "5"}).is_success
        assert http.post("/v2/models/fraud/infer").is_success  # the default, 10 s
        # Not a number: left to the app, which answers 400.
        assert http.post("/v2/models/fraud/infer", headers={"Request-Timeout": "x"}).is_success
    assert len(app.calls) == 3


def test_the_batch_lane_is_refused_first_at_the_protocol() -> None:
    admission = Admission(
        4096, AdmissionSettings(probe=False, initial_limit=10, min_limit=1, batch_share=0.5)
    )
    for i in range(5):
        admission.admit(f"held-{i}", model="fraud", wait_s=10)
    app = App(admission)
    with serving(app) as http:
        batch = http.post("/v2/models/fraud/infer", headers={"Tidegate-Lane": "Batch"})
        assert batch.status_code == 503
        assert "batch lane" in batch.json()["detail"]
        assert http.post("/v2/models/fraud/infer").is_success
        assert http.post("/v2/models/fraud/infer", headers={"Tidegate-Lane": "realtime"}).is_success
    assert len(app.calls) == 2


def test_a_model_with_a_fallback_is_left_to_the_app_which_may_divert_it() -> None:
    admission = full_admission(2)
    admission.diverts = lambda model: model == "fraud"
    app = App(admission)
    with serving(app) as http:
        assert http.post("/v2/models/fraud/infer").status_code == 200
    assert app.calls == ["/v2/models/fraud/infer"]
