"""The whole stack, as a user runs it: real workers and a real gateway, as separate processes of
the `tidegate` CLI, on topics of their own so no other test's traffic reaches them."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.support import free_port, unique
from tidegate.procs import Child, spawn, wait_http

REPO = Path(__file__).resolve().parents[2]


@dataclass
class Pipeline:
    env: dict[str, str]
    base_url: str
    run_dir: Path
    workers: list[Child] = field(default_factory=list)
    gateway: Child | None = None

    @property
    def topics(self) -> dict[str, str]:
        keys = ("REQUESTS", "RESULTS", "REPLIES", "FAILED", "POISON")
        return {k.lower(): self.env[f"TIDEGATE_TOPICS_{k}"] for k in keys}

    def start_worker(self, name: str) -> Child:
        port = free_port()
        child = spawn(
            name,
            ["worker", "--worker-id", name, "--metrics-port", str(port)],
            self.run_dir,
            self.env,
        )
        wait_http(f"http://127.0.0.1:{port}/metrics", child, 180)
        self.workers.append(child)
        return child


def _cli(env: dict[str, str], *args: str, timeout: float = 900) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "tidegate.cli", *args],
        cwd=REPO,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert done.returncode == 0, f"tidegate {' '.join(args)}:\n{done.stdout}\n{done.stderr}"


@pytest.fixture(scope="session")
def pipeline(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pipeline]:
    prefix = unique("e2e")
    port = free_port()
    env = {
        "TIDEGATE_TOPICS_REQUESTS": f"{prefix}-requests",
        "TIDEGATE_TOPICS_RESULTS": f"{prefix}-results",
        "TIDEGATE_TOPICS_REPLIES": f"{prefix}-replies",
        "TIDEGATE_TOPICS_FAILED": f"{prefix}-failed",
        "TIDEGATE_TOPICS_POISON": f"{prefix}-poison",
        "TIDEGATE_TOPICS_PARTITIONS": "8",
        "TIDEGATE_TOPICS_REPLY_PARTITIONS": "4",
        "TIDEGATE_WORKER_GROUP_ID": f"{prefix}-workers",
        "TIDEGATE_GATEWAY_PORT": str(port),
    }
    _cli(env, "models", "build")
    _cli(env, "stack", "topics")
    _cli(env, "schemas", "register")
    pipe = Pipeline(env, f"http://127.0.0.1:{port}", tmp_path_factory.mktemp("pipeline"))
    try:
        pipe.start_worker("e2e-w1")
        pipe.start_worker("e2e-w2")
        pipe.gateway = spawn("gateway", ["gateway"], pipe.run_dir, env)
        wait_http(f"{pipe.base_url}/v2/health/ready", pipe.gateway, 120)
        yield pipe
    finally:
        for child in [*pipe.workers, *([pipe.gateway] if pipe.gateway else [])]:
            child.stop()
