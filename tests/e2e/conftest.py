"""The whole stack, as a user runs it: a lifecycle controller, real workers and a real gateway, as
separate processes of the `tidegate` CLI, on topics and a PostgreSQL schema of their own so no other
test's traffic or events reach them. The example models are registered and promoted through the
CLI, as an operator would."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.support import free_port, unique
from tidegate.cli.lifecycle_session import EXIT_REFUSED
from tidegate.cli.procs import Child, spawn, wait_http
from tidegate.core.db import migrate
from tidegate.core.settings import PostgresSettings

# Every served example model, registered from the packages `tidegate models build` exports and
# promoted before the workers start.
SERVED = (("fraud", "1"), ("fraud-lite", "1"), ("minilm", "1"))

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
# The `pipeline` fixture's whole set-up (building the models, the CLI's steps, the processes'
# starts) has this budget; each step waits at most what is left of it. pytest-timeout counts the
# set-up in the first test's time, so every e2e test's own limit is the budget and 10 minutes
# more: a slow set-up fails with the step's own message.
SETUP_S = 1200.0
E2E_TIMEOUT_S = SETUP_S + 600


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # Every item of the session passes through this hook: mark only this folder's.
    for item in items:
        if HERE in item.path.parents:
            item.add_marker(pytest.mark.e2e)
            item.add_marker(pytest.mark.timeout(E2E_TIMEOUT_S))


class Budget:
    """What is left of a deadline, for each step to wait at most that (or its own cap)."""

    def __init__(self, seconds: float) -> None:
        self._deadline = time.monotonic() + seconds

    def left(self, cap: float) -> float:
        remaining = self._deadline - time.monotonic()
        assert remaining > 0, f"the pipeline's set-up ran past its {SETUP_S:.0f} s"
        return min(cap, remaining)


@dataclass
class Pipeline:
    env: dict[str, str]
    base_url: str
    run_dir: Path
    workers: list[Child] = field(default_factory=list)
    gateway: Child | None = None
    controller: Child | None = None
    metrics_ports: dict[str, int] = field(default_factory=dict)
    key: str = ""

    @property
    def headers(self) -> dict[str, str]:
        """An `infer` key's credentials, issued by `tidegate auth keys create` as a user would."""
        return {"Authorization": f"Bearer {self.key}"}

    @property
    def topics(self) -> dict[str, str]:
        keys = ("REQUESTS", "RESULTS", "REPLIES", "FAILED", "POISON", "LIFECYCLE", "SHADOW")
        return {k.lower(): self.env[f"TIDEGATE_TOPICS_{k}"] for k in keys}

    def cli(self, *args: str) -> object:
        """Run `tidegate ARGS... --json` and return what it printed, parsed."""
        return json.loads(_cli(self.env, *args, "--json"))

    def lookup(self, *args: str) -> object | None:
        """`cli` for a lookup whose answer may not exist yet (`tidegate served`): None when the
        command refuses with NOT_FOUND; any other failure fails the test."""
        done = _run(self.env, *args, "--json")
        if done.returncode == EXIT_REFUSED and json.loads(done.stdout)["code"] == "NOT_FOUND":
            return None
        found: object = json.loads(_checked(done, args))
        return found

    def register(self, package: str, name: str, version: str, timeout: float = 900) -> None:
        _cli(self.env, "models", "register", f"var/packages/{package}", "--name", name,
             "--version", version, timeout=timeout)  # fmt: skip

    def children(self) -> list[Child]:
        extra = [c for c in (self.gateway, self.controller) if c is not None]
        return [*self.workers, *extra]

    def start_worker(self, name: str, timeout: float = 180) -> Child:
        port = free_port()
        child = spawn(
            name,
            ["worker", "--processes", "1", "--worker-id", name, "--metrics-port", str(port)],
            self.run_dir,
            self.env,
        )
        wait_http(f"http://127.0.0.1:{port}/metrics", child, timeout)
        self.workers.append(child)
        self.metrics_ports[name] = port
        return child


def _run(env: dict[str, str], *args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tidegate.cli", *args],
        cwd=REPO,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def _checked(done: subprocess.CompletedProcess[str], args: tuple[str, ...]) -> str:
    assert done.returncode == 0, f"tidegate {' '.join(args)}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def _cli(env: dict[str, str], *args: str, timeout: float = 900) -> str:
    return _checked(_run(env, *args, timeout=timeout), args)


@pytest.fixture(scope="session")
def pipeline(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pipeline]:
    prefix = unique("e2e")
    port = free_port()
    schema = prefix.replace("-", "_")
    env = {
        "TIDEGATE_TOPICS_REQUESTS": f"{prefix}-requests",
        "TIDEGATE_TOPICS_RESULTS": f"{prefix}-results",
        "TIDEGATE_TOPICS_REPLIES": f"{prefix}-replies",
        "TIDEGATE_TOPICS_FAILED": f"{prefix}-failed",
        "TIDEGATE_TOPICS_POISON": f"{prefix}-poison",
        "TIDEGATE_TOPICS_LIFECYCLE": f"{prefix}-lifecycle",
        "TIDEGATE_TOPICS_SHADOW": f"{prefix}-shadow",
        "TIDEGATE_TOPICS_RETRY_PREFIX": f"{prefix}-retry",
        "TIDEGATE_POSTGRES_DB_SCHEMA": schema,
        "TIDEGATE_LIFECYCLE_CONTROLLER_TICK_S": "0.2",
        # Every sampled request is compared, so shadow stats can be checked against a direct run.
        "TIDEGATE_WORKER_SHADOW_MAX_IN_FLIGHT": "256",
        "TIDEGATE_TOPICS_PARTITIONS": "8",
        "TIDEGATE_TOPICS_REPLY_PARTITIONS": "4",
        "TIDEGATE_WORKER_GROUP_ID": f"{prefix}-workers",
        "TIDEGATE_GATEWAY_PORT": str(port),
    }
    budget = Budget(SETUP_S)
    _cli(env, "models", "build", timeout=budget.left(900))
    _cli(env, "stack", "topics", timeout=budget.left(300))
    _cli(env, "schemas", "register", timeout=budget.left(300))
    migrate(PostgresSettings(db_schema=schema))
    pipe = Pipeline(env, f"http://127.0.0.1:{port}", tmp_path_factory.mktemp("pipeline"))
    issued = json.loads(
        _cli(env, "auth", "keys", "create", "e2e", "--role", "infer", "--json",
             timeout=budget.left(300))
    )  # fmt: skip
    pipe.key = str(issued["key"])
    try:
        for name, version in SERVED:
            pipe.register(f"{name}/{version}", name, version, timeout=budget.left(900))
            _cli(env, "models", "promote", name, version, timeout=budget.left(300))
        pipe.controller = spawn(
            "controller", ["controller", "--group-id", f"{prefix}-indexer"], pipe.run_dir, env
        )
        pipe.start_worker("e2e-w1", timeout=budget.left(180))
        pipe.start_worker("e2e-w2", timeout=budget.left(180))
        # As shipped: authentication on, the default admission objective.
        pipe.gateway = spawn("gateway", ["gateway"], pipe.run_dir, env)
        wait_http(f"{pipe.base_url}/v2/health/ready", pipe.gateway, budget.left(120))
        # Ready for a model means a worker reported it loaded and warm, not that time passed.
        for name, _ in SERVED:
            ready = f"{pipe.base_url}/v2/models/{name}/ready"
            wait_http(ready, pipe.gateway, budget.left(180), pipe.headers)
        yield pipe
    finally:
        for child in pipe.children():
            child.stop()
        _drop_schema(schema)


def _drop_schema(schema: str) -> None:
    import psycopg
    from psycopg import sql

    with psycopg.connect(PostgresSettings().conninfo(), autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))
