"""The HTTP load generator as the demo uses it: a call shed with 503 and `Retry-After` is sent
again after it, counted as shed, and ends OK; without `retry_shed` the 503 is the answer."""

from __future__ import annotations

from typing import Any

import pytest
from aiohttp import web

from tidegate.clients.loadgen import http_load

# Serves HTTP on a socket.
pytestmark = pytest.mark.slow


async def serve(refusals: int) -> tuple[web.AppRunner, str, list[int]]:
    """A server refusing each body's first `refusals` calls with 503, Retry-After: 0."""
    seen: dict[int, int] = {}
    calls: list[int] = []

    async def infer(request: web.Request) -> web.Response:
        i = int((await request.json())["id"])
        calls.append(i)
        seen[i] = seen.get(i, 0) + 1
        if seen[i] <= refusals:
            detail = f"{seen[i] + 40} calls of x are in flight, the most its latency allows"
            return web.json_response(
                {"code": "OVERLOADED", "detail": detail}, status=503, headers={"Retry-After": "0"}
            )
        return web.json_response({"outputs": []})

    app = web.Application()
    app.router.add_post("/infer", infer)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, f"http://127.0.0.1:{port}/infer", calls


def body(i: int) -> dict[str, Any]:
    return {"id": str(i)}


async def test_a_shed_call_is_retried_after_retry_after_and_counted() -> None:
    runner, url, calls = await serve(refusals=1)
    try:
        result = await http_load("HTTP x", url, body, rate=200, count=5, retry_shed=3)
    finally:
        await runner.cleanup()
    assert (result.sent, result.ok, result.errors, result.shed) == (5, 5, 0, 5)
    assert sorted(calls) == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4]
    # which check refused, its numbers masked so that one check counts once
    assert result.shed_reasons == {"N calls of x are in flight, the most its latency allows": 5}


async def test_retries_are_bounded_and_off_by_default() -> None:
    runner, url, _ = await serve(refusals=10)
    try:
        bounded = await http_load("HTTP x", url, body, rate=200, count=2, retry_shed=2)
        plain = await http_load("HTTP x", url, body, rate=200, count=2)
    finally:
        await runner.cleanup()
    assert (bounded.ok, bounded.errors, bounded.shed) == (0, 2, 4)
    assert bounded.statuses == {"HTTP 503": 2}
    assert (plain.ok, plain.errors, plain.shed) == (0, 2, 0)
