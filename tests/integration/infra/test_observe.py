"""`make observe`'s Prometheus: infra/stack.sh starts it on its own, it scrapes the targets it
is given, loads the alert rules of deploy/prometheus, and `down` stops it."""

from __future__ import annotations

import json
import os
import subprocess
import urllib.request
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Counter, start_http_server

from tests.support import free_port, wait_for

REPO = Path(__file__).resolve().parents[3]
STACK = ["bash", str(REPO / "infra" / "stack.sh")]


def api(port: int, path: str) -> Any:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/{path}", timeout=5) as reply:
        return json.loads(reply.read())["data"]


def test_observe_scrapes_the_targets_and_loads_the_alert_rules(tmp_path: Path) -> None:
    registry = CollectorRegistry()
    Counter("tidegate_probe", "A metric for the scrape to find.", registry=registry).inc()
    target = free_port()
    server, thread = start_http_server(target, addr="127.0.0.1", registry=registry)
    port = free_port()
    env = {
        **os.environ,
        "TIDEGATE_STACK_VAR": str(tmp_path / "var"),
        "TIDEGATE_STACK_SERVICES": "prometheus",
        "TIDEGATE_STACK_PROMETHEUS_PORT": str(port),
        "TIDEGATE_STACK_PROMETHEUS_TARGETS": f"127.0.0.1:{target}",
        "TIDEGATE_STACK_PROMETHEUS_SCRAPE": "1s",
        "TIDEGATE_STACK_STOP_TIMEOUT": "20",
    }
    try:
        up = subprocess.run(
            [*STACK, "up"], env=env, capture_output=True, text=True, timeout=120, check=False
        )
        assert up.returncode == 0, up.stdout + up.stderr
        wait_for(
            lambda: [t["health"] for t in api(port, "targets")["activeTargets"]] == ["up"],
            timeout=30,
            what="the target scraped",
        )
        found = api(port, "query?query=tidegate_probe_total")["result"]
        assert [float(r["value"][1]) for r in found] == [1.0]
        alerts = {r["name"] for g in api(port, "rules")["groups"] for r in g["rules"]}
        assert "TidegateDeadLettersGrowing" in alerts, "the alert rules were not loaded"
    finally:
        down = subprocess.run(
            [*STACK, "down"], env=env, capture_output=True, text=True, timeout=60, check=False
        )
        server.shutdown()
        thread.join(5)
    assert down.returncode == 0, down.stdout + down.stderr
    assert "prometheus: stopped" in down.stdout
    assert not (tmp_path / "var" / "run" / "prometheus.pid").exists()
