"""What one refusal costs the gateway (`python -m tests.bench refusal_cost`): the HTTP protocol's
canned 503 (`GatewayHttpProtocol` with an `Admission` that has no room), served by uvicorn in a
process of its own, under open-loop V2 calls from aiohttp. The server's CPU per refusal comes from
/proc, so the generator's share of these cores does not count; the latencies it prints do include
the generator's.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from typing import Any

from tests.bench.overload_load import http_overload
from tests.bench.proc_cpu import cpu_seconds
from tests.support import free_port
from tidegate.cli.demo import fraud_body

__all__ = ["run", "serve"]

RATES = (250, 500, 1000)
SECONDS = 6.0


def serve(port: int) -> None:
    """A server whose every inference call is refused: fraud's limit is held by 16 calls."""
    import uvicorn

    from tidegate.gateway.admission.admission_control import ADMISSION_STATE, Admission
    from tidegate.gateway.admission.admission_settings import AdmissionSettings
    from tidegate.gateway.slow_clients import ConnectionLimits, guarded_protocol

    admission = Admission(4096, AdmissionSettings(probe=False, initial_limit=16, min_limit=16))
    for i in range(16):
        admission.admit(f"held-{i}", model="fraud", wait_s=10)

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                scope["state"][ADMISSION_STATE] = admission
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    protocol = guarded_protocol(ConnectionLimits(10, 30, 4096))
    uvicorn.run(
        app,
        host="127.0.0.1",
        port=port,
        http=protocol,
        ws="none",
        log_config=None,
        access_log=False,
        lifespan="on",
    )


def run() -> None:
    import httpx

    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "tests.bench.refusal_cost", str(port)])
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                httpx.get(f"http://127.0.0.1:{port}/", timeout=1)
                break
            except httpx.HTTPError:
                time.sleep(0.1)
        url = f"http://127.0.0.1:{port}/v2/models/fraud/infer"
        print("\nrefusal cost: the protocol's canned 503, server CPU from /proc")
        for rate in RATES:
            before = cpu_seconds([server.pid])
            answers = asyncio.run(
                http_overload(
                    url, fraud_body, rate=rate, seconds=SECONDS, headers={"Request-Timeout": "1"}
                )
            )
            cpu = cpu_seconds([server.pid]) - before
            print(
                f"  {rate:>5}/s  {answers.count('503'):,} refused of {answers.sent:,}: "
                f"{cpu / answers.sent * 1000:.3f} ms CPU each ({cpu / SECONDS:.2f} cores); "
                f"p50 {answers.p('503', 0.5):.1f} ms p99 {answers.p('503', 0.99):.1f} ms "
                "as the generator saw them"
            )
    finally:
        server.terminate()
        server.wait(10)


if __name__ == "__main__":
    serve(int(sys.argv[1]))
