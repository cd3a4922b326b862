"""`tidegate gateway --insecure`, the one gateway of the e2e suite without authentication (the
pipeline's own gateway runs as shipped): every caller is let in, and told so."""

from __future__ import annotations

import httpx

from tests.e2e.conftest import Pipeline
from tests.support import free_port
from tidegate.cli.procs import spawn, wait_http
from tidegate.gateway.routes import INSECURE_HEADER

BODY = {"inputs": [{"name": "features", "datatype": "FP32", "shape": [1, 64],
                    "data": [0.25] * 64}]}  # fmt: skip


def test_insecure_is_the_only_gateway_that_lets_anyone_in(pipeline: Pipeline) -> None:
    shipped = httpx.post(f"{pipeline.base_url}/v2/models/fraud/infer", json=BODY, timeout=30)
    assert shipped.status_code == 401, shipped.text
    assert shipped.headers["WWW-Authenticate"].startswith("Bearer")

    port = free_port()
    env = {**pipeline.env, "TIDEGATE_GATEWAY_PORT": str(port)}
    child = spawn("gateway-insecure", ["gateway", "--insecure"], pipeline.run_dir, env)
    try:
        base = f"http://127.0.0.1:{port}"
        wait_http(f"{base}/v2/models/fraud/ready", child, 120)
        ready = httpx.get(f"{base}/v2/health/ready", timeout=10)
        assert INSECURE_HEADER in ready.headers
        anyone = httpx.post(f"{base}/v2/models/fraud/infer", json=BODY, timeout=30)
        assert anyone.status_code == 200, anyone.text
        assert anyone.json()["model_name"] == "fraud"
    finally:
        child.stop()
