"""Slow clients against `tidegate gateway` as a user runs it (a process of the CLI on the real
stack, a fake worker answering): a thousand connections trickling their headers, and a few
trickling their bodies, are all cut off within the configured timeouts while a normal client's
calls keep their latency; and the gateway serves HTTPS from `--workers 2` processes with an
encrypted key, each of them applying the limits.

Before the header and body timeouts, 1,000 connections trickling their headers stayed open
for 30 s and more."""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import resource
import socket
import ssl
import statistics
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import httpx
import pytest

from tests.integration.fakes import FakeWorker
from tests.integration.gateway.gateway_fixtures import fraud_body, topic_env
from tests.support import free_port, wait_for
from tests.tls_support import self_signed, wait_https
from tidegate.cli.procs import Child, spawn, wait_http
from tidegate.core.settings import TopicSettings

SLOW = 1_000
SLOW_BODIES = 50
TIMEOUT_S = 2.0
# A cut-off must come after the timeout (it is the timeout's doing) and soon after it.
MARGIN_S = 3.0
# Generous for two shared cores (a p99 of 10-35 ms is usual here), yet a loop stalled by the
# cut-offs would show.
P99_BOUND_S = 0.15


def gateway_env(topics: TopicSettings, port: int, **limits: str) -> dict[str, str]:
    return {
        **topic_env(topics),
        "TIDEGATE_GATEWAY_PORT": str(port),
        "TIDEGATE_AUTH_ENABLED": "false",
        "TIDEGATE_RATE_LIMIT_ENABLED": "false",
        **{f"TIDEGATE_GATEWAY_{name.upper()}": value for name, value in limits.items()},
    }


def enough_files(needed: int) -> None:
    """The test and the gateway (which inherits the limit) each hold a socket per connection."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < needed:
        if hard != resource.RLIM_INFINITY and hard < needed:
            pytest.fail(f"RLIMIT_NOFILE's hard limit {hard} is below the {needed} needed")
        resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))


async def trickle(port: int, start: bytes, byte: bytes) -> tuple[float, bytes]:
    """Open a connection, send `start`, then `byte` every 0.5 s until the server closes it:
    how long it stayed open, and what the server sent."""
    # Timed from before the connect: the server's deadline cannot start earlier than that.
    opened = time.monotonic()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(start)
    received = b""
    deadline = opened + TIMEOUT_S + 3 * MARGIN_S
    try:
        while time.monotonic() < deadline:
            try:
                data = await asyncio.wait_for(reader.read(65536), 0.5)
            except TimeoutError:
                writer.write(byte)
                continue
            if not data:
                return time.monotonic() - opened, received
            received += data
    except (ConnectionResetError, BrokenPipeError):
        return time.monotonic() - opened, received
    finally:
        writer.close()
    return float("inf"), received


async def attack(port: int) -> list[tuple[float, bytes]]:
    header = b"GET /v2/health/ready HTTP/1.1\r\nHost: gw\r\nX-Slow: "
    body = (
        b"POST /v2/models/fraud/infer HTTP/1.1\r\nHost: gw\r\n"
        b"Content-Type: application/json\r\nContent-Length: 100000\r\n\r\n{"
    )
    slow = [trickle(port, header, b"a") for _ in range(SLOW)]
    slow += [trickle(port, body, b" ") for _ in range(SLOW_BODIES)]
    return await asyncio.gather(*slow)


def run_attack(port: int) -> list[tuple[float, bytes]]:
    return asyncio.run(attack(port))


class Caller(threading.Thread):
    """A normal client calling readiness on a kept-alive connection until stopped."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.latencies: list[float] = []
        self.statuses: set[int] = set()
        self.stopping = threading.Event()

    def run(self) -> None:
        with httpx.Client(timeout=10) as client:
            while not self.stopping.wait(0.02):
                started = time.perf_counter()
                self.statuses.add(client.get(f"{self.url}/v2/health/ready").status_code)
                self.latencies.append(time.perf_counter() - started)


def p99(latencies: list[float]) -> float:
    return statistics.quantiles(latencies, n=100)[98]


def test_slow_clients_are_cut_off_while_calls_keep_their_latency(
    topics: TopicSettings, lifecycle: None, worker: FakeWorker, tmp_path: Path
) -> None:
    enough_files(4 * (SLOW + SLOW_BODIES) + 1024)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = gateway_env(
        topics,
        port,
        header_timeout_s=str(TIMEOUT_S),
        body_timeout_s=str(TIMEOUT_S),
        max_connections_per_client=str(4 * SLOW),
    )
    child = spawn("gateway", ["gateway", "--no-admin"], tmp_path, env)
    caller = Caller(url)
    try:
        wait_http(f"{url}/v2/health/ready", child, 120)
        caller.start()
        wait_for(lambda: len(caller.latencies) >= 50, timeout=30, what="a baseline of calls")
        baseline = list(caller.latencies)

        # The attack runs in a process of its own, so that its bursts do not hold the GIL the
        # caller's thread needs: what the caller measures is the gateway.
        with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
            cut = pool.submit(run_attack, port).result(timeout=60)
        during = caller.latencies[len(baseline) :]

        open_for = sorted(took for took, _ in cut)
        # Shown on failure (or with -s): what the attack did to the normal client.
        print(
            f"cut after {open_for[0]:.2f}-{open_for[-1]:.2f}s; p99 {p99(baseline) * 1000:.1f} ms "
            f"before, {p99(during) * 1000:.1f} ms during ({len(during)} calls)"
        )
        assert open_for[-1] < TIMEOUT_S + MARGIN_S, f"slowest cut-off after {open_for[-1]:.1f}s"
        assert open_for[0] >= 0.9 * TIMEOUT_S, f"one was cut after {open_for[0]:.2f}s"
        answers = {got.split(b"\r\n", 1)[0] for _, got in cut}
        assert answers <= {b"HTTP/1.1 408 Request Timeout", b""}, answers
        assert b"HTTP/1.1 408 Request Timeout" in answers
        assert any(b"body did not arrive" in got for _, got in cut[SLOW:])

        assert caller.statuses == {200}
        assert len(during) >= 20, "the normal client kept calling through the attack"
        assert p99(during) < P99_BOUND_S, (
            f"p99 {p99(during) * 1000:.0f} ms under attack, {p99(baseline) * 1000:.0f} ms before"
        )
        # The gateway still does its work once they are gone.
        resp = httpx.post(f"{url}/v2/models/fraud/infer", json=fraud_body(), timeout=30)
        assert resp.status_code == 200, resp.text
    finally:
        caller.stopping.set()
        caller.join(15)
        child.stop()


def serve_tls(
    topics: TopicSettings, tmp_path: Path, password: str, workers: int
) -> tuple[Child, str, ssl.SSLContext]:
    """`tidegate gateway --workers N` serving HTTPS; the child, its URL, and a context that
    trusts its certificate."""
    certfile, keyfile = self_signed(tmp_path, password.encode())
    port = free_port()
    env = gateway_env(
        topics,
        port,
        header_timeout_s=str(TIMEOUT_S),
        tls_certfile=str(certfile),
        tls_keyfile=str(keyfile),
        tls_keyfile_password=password,
    )
    args = ["gateway", "--no-admin", "--workers", str(workers)]
    child = spawn("gateway-tls", args, tmp_path, env)
    return child, f"https://127.0.0.1:{port}", ssl.create_default_context(cafile=certfile)


def quiet_for(port: int, trust: ssl.SSLContext) -> float:
    """How long a TLS connection that sends nothing after its handshake stays open."""
    with (
        socket.create_connection(("127.0.0.1", port), 5) as raw,
        trust.wrap_socket(raw, server_hostname="127.0.0.1") as quiet,
    ):
        quiet.settimeout(TIMEOUT_S + 2 * MARGIN_S)
        opened = time.monotonic()
        # Closed without a close_notify is closed all the same.
        with contextlib.suppress(ssl.SSLEOFError, ConnectionResetError):
            assert quiet.recv(1) == b""
        return time.monotonic() - opened


def test_https_from_several_workers_with_the_limits_in_each(
    topics: TopicSettings, lifecycle: None, worker: FakeWorker, tmp_path: Path
) -> None:
    child, url, trust = serve_tls(topics, tmp_path, "tls-key-pass-7Q2", workers=2)
    try:
        wait_https(f"{url}/v2/health/ready", child, trust)
        resp = httpx.post(
            f"{url}/v2/models/fraud/infer", json=fraud_body(), verify=trust, timeout=30
        )
        assert resp.status_code == 200, resp.text
        assert resp.json()["outputs"][0]["data"] == [6, 3, 22, 7]
        # The client verified the certificate: without trusting it, the call fails.
        with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
            httpx.get(f"{url}/v2/health/live", timeout=5)
        with pytest.raises(httpx.HTTPError):
            httpx.get(url.replace("https", "http") + "/v2/health/live", timeout=5)

        # A TLS client that says nothing after its handshake is cut off: the worker that took
        # it is a spawned process, which read the limits from the environment it inherited.
        port = int(url.rsplit(":", 1)[1])
        for _ in range(2):
            took = quiet_for(port, trust)
            assert 0.9 * TIMEOUT_S <= took < TIMEOUT_S + MARGIN_S, f"closed after {took:.2f}s"
        assert "tls-key-pass-7Q2" not in child.log.read_text(errors="replace")
    finally:
        child.stop()
