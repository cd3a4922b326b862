"""The connection limits of `tidegate.gateway.slow_clients`, on a real uvicorn server in this
process with a small app: clients slow to send their headers or body are cut off with a 408, one
that never sends a byte is closed, a connection past the per-client cap is refused, and none of it
touches a prompt client, a kept-alive connection or an app that takes its time to answer."""

from __future__ import annotations

import asyncio
import json
import select
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
import uvicorn

from tests.support import wait_for
from tidegate.gateway.slow_clients import ConnectionLimits, GatewayHttpProtocol, guarded_protocol

# Serves uvicorn on a socket.
pytestmark = pytest.mark.slow

TIMEOUT_S = 0.5
# How late a cut-off may come on a loaded machine, and how early: it must be the timeout's doing.
LATE_S = 2.0
EARLY_S = 0.8 * TIMEOUT_S


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """Reads the whole body, waits `?sleep=` seconds, answers the body's length."""
    assert scope["type"] == "http"
    size, more = 0, True
    while more:
        message = await receive()
        if message["type"] == "http.disconnect":
            return
        size += len(message.get("body", b""))
        more = message.get("more_body", False)
    query = scope["query_string"].decode()
    if query.startswith("sleep="):
        await asyncio.sleep(float(query.removeprefix("sleep=")))
    body = str(size).encode()
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": body})


@dataclass
class Served:
    port: int
    protocol: type[GatewayHttpProtocol]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def connect(self, source: str = "127.0.0.1") -> socket.socket:
        return socket.create_connection(("127.0.0.1", self.port), 5, (source, 0))

    def open_from(self, source: str) -> int:
        return self.protocol.open_per_client.get(source, 0)


@contextmanager
def serving(
    header_s: float = TIMEOUT_S, body_s: float = TIMEOUT_S, cap: int = 100
) -> Iterator[Served]:
    protocol = guarded_protocol(ConnectionLimits(header_s, body_s, cap))
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    config = uvicorn.Config(app, http=protocol, ws="none", log_config=None, lifespan="off")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, args=([sock],), daemon=True)
    thread.start()
    try:
        wait_for(lambda: server.started, timeout=10, interval=0.01, what="the server to start")
        yield Served(int(sock.getsockname()[1]), protocol)
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()


def until_closed(sock: socket.socket, trickle: bytes = b"", within_s: float = 10.0) -> bytes:
    """Everything the server sends until it closes the connection, sending a byte of `trickle`
    every 50 ms meanwhile; fails if the connection is still open after `within_s`."""
    received = bytearray()
    deadline = time.monotonic() + within_s
    sock.settimeout(0.05)
    try:
        for i in range(10**6):
            assert time.monotonic() < deadline, f"still open after {within_s}s: {received!r}"
            try:
                if i < len(trickle):
                    sock.sendall(trickle[i : i + 1])
                data = sock.recv(65536)
            except TimeoutError:
                continue
            except (ConnectionResetError, BrokenPipeError):
                break
            if not data:
                break
            received += data
    finally:
        sock.close()
    return bytes(received)


def problem_of(response: bytes) -> tuple[int, dict[str, Any]]:
    head, _, body = response.partition(b"\r\n\r\n")
    assert b"content-type: application/problem+json" in head.lower()
    assert b"connection: close" in head.lower()
    return int(head.split()[1]), json.loads(body)


def timed(action: Any) -> tuple[Any, float]:
    started = time.monotonic()
    return action(), time.monotonic() - started


def test_a_connection_that_never_sends_a_byte_is_closed() -> None:
    with serving() as served:
        sock = served.connect()
        got, took = timed(lambda: until_closed(sock))
    assert got == b"", "nothing began, so nothing is answered"
    assert EARLY_S <= took < TIMEOUT_S + LATE_S


def test_headers_trickled_a_byte_at_a_time_are_cut_off_with_408() -> None:
    with serving(header_s=TIMEOUT_S, body_s=30) as served:
        sock = served.connect()
        sock.sendall(b"GET /?sleep=0 HTTP/1.1\r\nHost: gw\r\n")
        got, took = timed(lambda: until_closed(sock, b"X-Slow: " + b"a" * 10_000))
        assert EARLY_S <= took < TIMEOUT_S + LATE_S
        status, body = problem_of(got)
        assert (status, body["code"]) == (408, "REQUEST_TIMEOUT")
        assert "headers" in body["detail"]
        wait_for(lambda: served.open_from("127.0.0.1") == 0, timeout=5, what="the count to drop")


def test_a_body_trickled_a_byte_at_a_time_is_cut_off_with_408() -> None:
    with serving(header_s=30, body_s=TIMEOUT_S) as served:
        sock = served.connect()
        sock.sendall(b"POST / HTTP/1.1\r\nHost: gw\r\nContent-Length: 10000\r\n\r\n")
        got, took = timed(lambda: until_closed(sock, b"x" * 10_000))
    assert EARLY_S <= took < TIMEOUT_S + LATE_S
    status, body = problem_of(got)
    assert status == 408
    assert "body" in body["detail"]


def test_headers_past_the_size_limit_are_refused_with_431() -> None:
    with serving(header_s=30, body_s=30) as served:
        sock = served.connect()
        sock.sendall(b"GET / HTTP/1.1\r\nHost: gw\r\n")
        for _ in range(80):  # 80 KiB of headers, past the default 64 KiB
            sock.sendall(b"X-Big: " + b"b" * 1024 + b"\r\n")
        got, took = timed(lambda: until_closed(sock))
        assert took < LATE_S
        status, body = problem_of(got)
        assert (status, body["code"]) == (431, "HEADERS_TOO_LARGE")
        # Headers within the limit are served.
        big = {f"X-Big-{i}": "b" * 1024 for i in range(16)}
        assert httpx.get(f"{served.url}/?sleep=0", headers=big, timeout=5).status_code == 200


def test_one_header_too_large_is_refused_while_it_still_arrives() -> None:
    """httptools calls on_header only once a header is whole: the limit must hold before that,
    or one endless header value would be kept in memory for as long as the client sends it."""
    cap = ConnectionLimits(30, 30, 100).max_header_bytes
    planned = 4 * cap
    with serving(header_s=30, body_s=30) as served:
        sock = served.connect()
        sock.sendall(b"GET / HTTP/1.1\r\nHost: gw\r\nX-Huge: ")
        sent, chunk = 0, b"h" * 4096
        try:
            while sent < planned:
                # Past the cap, the client waits a little for an answer before each chunk.
                if sent > cap and select.select([sock], [], [], 0.2)[0]:
                    break
                sock.sendall(chunk)
                sent += len(chunk)
        except (ConnectionResetError, BrokenPipeError):
            pass  # refused already
        assert sent < planned, "not answered before the client was done"
        assert sent <= cap + 64 * 1024, sent
        # The header is never completed: only the byte count can have stopped it.
        got, took = timed(lambda: until_closed(sock, within_s=5))
        assert took < LATE_S
        status, body = problem_of(got)
        assert (status, body["code"]) == (431, "HEADERS_TOO_LARGE")
        wait_for(lambda: served.open_from("127.0.0.1") == 0, timeout=5, what="the count to drop")


def test_the_limit_holds_per_request_and_not_for_bodies() -> None:
    """Pipelined and kept-alive requests each get the whole limit, bodies are not counted."""
    head = b"".join(b"X-Big-%d: %s\r\n" % (i, b"b" * 1024) for i in range(40))  # 40 KiB
    body = b"y" * 200_000
    requests = (
        b"POST / HTTP/1.1\r\nHost: gw\r\nContent-Length: %d\r\n%s\r\n%s" % (len(body), head, body)
        + b"GET / HTTP/1.1\r\nHost: gw\r\n%s\r\n" % head
        + b"GET / HTTP/1.1\r\nHost: gw\r\nConnection: close\r\n%s\r\n" % head
    )
    with serving(header_s=30, body_s=30) as served:
        sock = served.connect()
        sock.sendall(requests)
        got = until_closed(sock)
    answers = got.split(b"HTTP/1.1 ")[1:]
    assert [a.split()[0] for a in answers] == [b"200"] * 3, got
    # The app sets no length: each answer is chunked, its one chunk the body's length read.
    assert [a.split(b"\r\n\r\n", 1)[1].split(b"\r\n")[1] for a in answers] == [
        b"200000",
        b"0",
        b"0",
    ]


def test_prompt_calls_kept_alive_connections_and_slow_answers_are_left_alone() -> None:
    with serving() as served, httpx.Client(base_url=served.url, timeout=10) as client:
        # The app takes three times either timeout to answer: only the client is timed.
        slow = client.post("/?sleep=1.5", content=b"y" * 1_000_000)
        assert (slow.status_code, slow.text) == (200, "1000000")
        # The same connection, idle then reused, serves the next request.
        assert served.open_from("127.0.0.1") == 1
        again = client.get("/?sleep=0")
        assert (again.status_code, again.text) == (200, "0")
        assert served.open_from("127.0.0.1") == 1


def test_the_connection_past_the_per_client_cap_is_refused() -> None:
    with serving(header_s=30, body_s=30, cap=3) as served:
        held = [served.connect("127.0.0.2") for _ in range(3)]
        wait_for(lambda: served.open_from("127.0.0.2") == 3, timeout=5, what="3 connections")
        extra = served.connect("127.0.0.2")
        got, took = timed(lambda: until_closed(extra, within_s=5))
        assert took < LATE_S, "refused at once, not at the header timeout"
        if got:  # the 429 may be lost to the reset if the request crossed it
            assert problem_of(got)[0] == 429
        # Another client address is not affected.
        assert httpx.get(f"{served.url}/?sleep=0", timeout=5).status_code == 200
        # A closed connection frees its place.
        held.pop().close()
        wait_for(lambda: served.open_from("127.0.0.2") == 2, timeout=5, what="the count to drop")
        with httpx.Client(transport=httpx.HTTPTransport(local_address="127.0.0.2")) as client:
            assert client.get(f"{served.url}/?sleep=0", timeout=5).status_code == 200
        for sock in held:
            sock.close()


@pytest.mark.parametrize("part", ["headers", "body"])
def test_without_the_limits_uvicorn_keeps_a_slow_client(part: str) -> None:
    """What the limits are for: uvicorn's own protocol leaves the trickling connection open."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    config = uvicorn.Config(app, http="httptools", ws="none", log_config=None, lifespan="off")
    config.timeout_keep_alive = 1
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, args=([sock],), daemon=True)
    thread.start()
    try:
        wait_for(lambda: server.started, timeout=10, interval=0.01, what="the server to start")
        conn = socket.create_connection(sock.getsockname(), 5)
        start = b"GET / HTTP/1.1\r\nHost: gw\r\n"
        if part == "body":
            start = b"POST / HTTP/1.1\r\nHost: gw\r\nContent-Length: 10000\r\n\r\n"
        conn.sendall(start)
        with pytest.raises(AssertionError, match="still open"):
            until_closed(conn, b"a" * 10_000, within_s=TIMEOUT_S + LATE_S)
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()
