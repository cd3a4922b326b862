"""`tidegate gateway --insecure`, run as a user runs it: the one gateway started without
authentication (every other test of a whole gateway, and the e2e suite, runs it as shipped), so
that the flag itself is tested. Every caller is let in, as the admin `local:insecure`, and told
so in a header. A fake worker answers on the test's own topics."""

from __future__ import annotations

from pathlib import Path

import httpx

from tests.integration.fakes import FakeWorker
from tests.integration.gateway.gateway_fixtures import fraud_body, spawn_gateway
from tests.support import unique
from tidegate.cli.procs import wait_http
from tidegate.core.settings import TopicSettings
from tidegate.gateway.v2api.routes import INSECURE_HEADER


def test_insecure_lets_anyone_in_and_says_so(
    topics: TopicSettings, lifecycle: None, worker: FakeWorker, tmp_path: Path
) -> None:
    child, base = spawn_gateway(topics, tmp_path, "--no-admin", "--insecure")
    try:
        wait_http(f"{base}/v2/health/ready", child, 120)
        ready = httpx.get(f"{base}/v2/health/ready", timeout=10)
        assert ready.headers[INSECURE_HEADER] == "authentication is off (--insecure)"
        anyone = httpx.post(
            f"{base}/v2/models/fraud/infer", json=fraud_body(id=unique("open")), timeout=30
        )
        assert anyone.status_code == 200, anyone.text
        assert anyone.json()["outputs"][0]["data"] == [6, 3, 22, 7]
        # A route that needs `read` too: `local:insecure` holds every grant.
        assert httpx.get(f"{base}/v2/models/fraud", timeout=10).status_code == 200
        assert "AUTHENTICATION IS OFF" in child.log.read_text(errors="replace")
    finally:
        child.stop()
