"""What authentication costs the gateway's inference path: the same V2 call through the real app
(its routes, dependencies, problem handling and data plane) with the pipeline's Kafka side
replaced by the in-memory fake of tests/unit/gateway_harness.py and no HTTP client in between
(each call goes straight into the ASGI app, so the client's own cost is not measured), with
authentication off (`--insecure`), with an API key and with a JWT. Keys and tokens are verified
once and then remembered, as in production, so this is the per-call cost: the dependency, one
SHA-256 and one dictionary lookup. `python -m tests.bench auth`; modes alternate over rounds and
the best round counts. Bar: auth on costs at most 5 % of the calls per second."""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tests.unit.auth_fixtures import AUDIENCE, ISSUER, Issuer, MemoryKeyStore, bearer
from tests.unit.gateway_harness import Harness, features
from tidegate.gateway.admission.rate_limit_settings import RateLimitSettings
from tidegate.gateway.app import create_app
from tidegate.gateway.auth.auth_settings import AuthSettings
from tidegate.gateway.auth.authn import Authenticator
from tidegate.gateway.auth.identity import Grant
from tidegate.gateway.auth.jwt_verify import JwtVerifier
from tidegate.gateway.auth.key_verifier import KeyVerifier

__all__ = ["run"]

CALLS = 2000
ROUNDS = 5
MODES = ("off", "api key", "key + limit", "jwt")
BAR = 0.05


def _scope(headers: dict[str, str], body: bytes) -> dict[str, Any]:
    raw = [(k.lower().encode(), v.encode()) for k, v in headers.items()]
    raw += [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/v2/models/fraud/infer",
        "raw_path": b"/v2/models/fraud/infer",
        "query_string": b"",
        "root_path": "",
        "headers": raw,
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 8080),
    }


async def _call(app: Any, scope: dict[str, Any], body: bytes) -> int:
    """One call straight into the ASGI app: no HTTP client in the measurement."""
    status = 0
    sent = False

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if sent:
            await asyncio.sleep(3600)  # the app never waits for a disconnect on this path
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]

    await app(dict(scope, state={}), receive, send)
    return status


async def _best_calls_per_s(mode: str, issuer: Issuer) -> float:
    harness = Harness(Path(tempfile.mkdtemp(prefix="auth-cost-")))
    headers: dict[str, str] = {}
    config = harness.config
    if mode == "key + limit":
        # A per-client and a per-model limit far above the rate: checked on every call, never
        # hit; slots come from the real Redis in lots (docs/rate-limits.md).
        limits = RateLimitSettings(client_rate_per_s=1_000_000, model_rates={"fraud": 1_000_000})
        config = dataclasses.replace(config, rate_limits=limits)
    if mode in ("api key", "key + limit"):
        store = MemoryKeyStore()
        issued = await store.create("bench", (Grant("infer"),), created_by="local:bench")
        harness.authenticator = Authenticator(AuthSettings(), keys=KeyVerifier(store))
        headers = bearer(issued.key)
    elif mode == "jwt":
        settings = AuthSettings(
            api_keys=False, jwt_issuer=ISSUER, jwt_audience=AUDIENCE, jwt_jwks_url=issuer.jwks_url
        )
        harness.authenticator = Authenticator(settings, tokens=JwtVerifier(settings))
        headers = bearer(issuer.token(expires_in=3600))
    app = create_app(config, lambda _c: harness.services, authenticator=harness.authenticator)
    body = json.dumps(features(1)).encode()
    scope = _scope(headers, body)
    async with app.router.lifespan_context(app):
        for _ in range(50):  # warm: the key or token is verified and remembered here
            assert await _call(app, scope, body) == 200
        gc.collect()  # what the previous mode left is not collected on this one's time
        started = time.perf_counter()
        for _ in range(CALLS):
            assert await _call(app, scope, body) == 200
        return CALLS / (time.perf_counter() - started)


async def _run() -> None:
    issuer = Issuer()
    try:
        best = dict.fromkeys(MODES, 0.0)
        for _ in range(ROUNDS):
            for mode in MODES:
                best[mode] = max(best[mode], await _best_calls_per_s(mode, issuer))
    finally:
        issuer.close()
    base = best["off"]
    print(f"gateway inference in process, {CALLS} calls, best of {ROUNDS} rounds:")
    for mode in MODES:
        cost = 1 - best[mode] / base
        extra_us = (1 / best[mode] - 1 / base) * 1e6
        print(
            f"  auth {mode:11s} {best[mode]:8.0f} calls/s  {cost:+6.1%} throughput cost  "
            f"{extra_us:+6.1f} us/call  (bar {BAR:.0%})"
        )


def run() -> None:
    asyncio.run(_run())


if __name__ == "__main__":
    run()
    sys.exit(0)
