"""A stack of a test's own beside the main one: its own data directory and free ports, for
`infra/stack.sh` (and so `make up` and `make demo`) to start from empty; stopped and removed
afterwards, whatever the test did."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tests.support import free_ports

__all__ = ["STACK", "OwnStack", "own_stack"]

REPO = Path(__file__).resolve().parents[1]
STACK = ["bash", str(REPO / "infra" / "stack.sh")]
SERVERS = ("kafka", "controller", "postgres", "redis", "registry")


@dataclass(frozen=True)
class OwnStack:
    var: Path
    ports: dict[str, int]
    env: dict[str, str]
    """The environment `infra/stack.sh` starts this stack with (`TIDEGATE_STACK_*`)."""

    def clients_env(self) -> dict[str, str]:
        """`env`, plus what tidegate's own commands connect with to reach this stack (what
        infra/lib.sh exports to the stack's own processes)."""
        ports = self.ports
        return {
            **self.env,
            "TIDEGATE_KAFKA_BOOTSTRAP_SERVERS": f"127.0.0.1:{ports['kafka']}",
            "TIDEGATE_SCHEMA_REGISTRY_URL": f"http://127.0.0.1:{ports['registry']}",
            "TIDEGATE_SCHEMA_REGISTRY_LOCAL_CREDENTIALS": str(self.var / "registry" / "client.env"),
            "TIDEGATE_POSTGRES_PORT": str(ports["postgres"]),
            "TIDEGATE_REDIS_URL": f"redis://127.0.0.1:{ports['redis']}/0",
        }


@contextmanager
def own_stack(prefix: str, extra: Mapping[str, str] | None = None) -> Iterator[OwnStack]:
    """A stack not started yet, on ports of its own; `extra` adds to its environment."""
    # Not pytest's tmp_path: its parents are private to root, and postgres runs as its own user.
    var = Path(tempfile.mkdtemp(prefix=prefix))
    var.chmod(0o755)
    ports = dict(zip(SERVERS, free_ports(len(SERVERS)), strict=True))
    env = {
        **os.environ,
        "TIDEGATE_STACK_VAR": str(var),
        "TIDEGATE_STACK_KAFKA_PORT": str(ports["kafka"]),
        "TIDEGATE_STACK_CONTROLLER_PORT": str(ports["controller"]),
        "TIDEGATE_STACK_PG_PORT": str(ports["postgres"]),
        "TIDEGATE_STACK_REDIS_PORT": str(ports["redis"]),
        "TIDEGATE_STACK_REGISTRY_PORT": str(ports["registry"]),
        **(extra or {}),
    }
    try:
        yield OwnStack(var, ports, env)
    finally:
        # Whatever the test did, leave nothing running.
        subprocess.run([*STACK, "down"], env=env, capture_output=True, timeout=150, check=False)
        shutil.rmtree(var, ignore_errors=True)
