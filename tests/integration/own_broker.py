"""A single KRaft broker of a test's own (infra/stack.sh in a temporary folder, on ports below the
ephemeral range), for tests that kill and restart Kafka: the shared broker is never touched."""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support import alive, wait_for
from tidegate.core.settings import KafkaSettings

__all__ = ["Broker", "broker", "fixed_ports", "own_broker"]

REPO = Path(__file__).resolve().parents[2]
STACK = ["bash", str(REPO / "infra" / "stack.sh")]


@dataclass
class Broker:
    """A single KRaft broker of this test's own, run by infra/stack.sh."""

    env: dict[str, str]
    var: Path
    port: int

    @property
    def settings(self) -> KafkaSettings:
        return KafkaSettings(bootstrap_servers=f"127.0.0.1:{self.port}", client_id="edge-faults")

    def stack(self, command: str) -> None:
        done = subprocess.run(
            [*STACK, command], env=self.env, capture_output=True, text=True, timeout=180
        )
        assert done.returncode == 0, f"stack.sh {command}: {done.stdout}\n{done.stderr}"

    def pid(self) -> int:
        return int((self.var / "run" / "kafka.pid").read_text().split()[0])

    def kill(self) -> None:
        pid = self.pid()
        os.kill(pid, signal.SIGKILL)
        wait_for(lambda: not alive(pid), timeout=10, what="the broker to die")


def fixed_ports(count: int) -> list[int]:
    """Free ports below the kernel's ephemeral range (32768-60999 here). The broker is killed
    and started again on the same ports, and meanwhile every client's refused connect takes an
    ephemeral local port: one that landed on the broker's port would make it fail to bind."""
    out: list[int] = []
    while len(out) < count:
        candidate = random.randint(20000, 32000)  # a port, not a secret
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", candidate))
            except OSError:
                continue
        if candidate not in out:
            out.append(candidate)
    return out


@pytest.fixture
def broker() -> Iterator[Broker]:
    with own_broker() as built:
        yield built


@contextlib.contextmanager
def own_broker() -> Iterator[Broker]:
    """The broker, up, for a test or a benchmark; stopped and its folder removed afterwards."""
    var = Path(tempfile.mkdtemp(prefix="tidegate-edge-"))
    port, controller = fixed_ports(2)
    env = {
        **os.environ,
        "KAFKA_NODES": "1",
        "KAFKA_SECURITY": "none",
        "TIDEGATE_STACK_VAR": str(var),
        "TIDEGATE_STACK_SERVICES": "kafka",
        "TIDEGATE_STACK_KAFKA_PORT": str(port),
        "TIDEGATE_STACK_CONTROLLER_PORT": str(controller),
        # 256m ran out on a restart ("Terminating due to java.lang.OutOfMemoryError: Java heap
        # space" in stdout.log) while its clients reconnected: the death during startup that
        # the Kafka-down test's restarts met too.
        "TIDEGATE_STACK_KAFKA_HEAP": "768m",
        # C1 only: the JVM boots in about half the time and CPU, and this broker takes no load.
        "JAVA_TOOL_OPTIONS": f"{os.environ.get('JAVA_TOOL_OPTIONS', '')} -XX:TieredStopAtLevel=1",
        "TIDEGATE_STACK_STOP_TIMEOUT": "20",
        "TIDEGATE_STACK_KAFKA_CONFIG": "offsets.topic.num.partitions=1",
        "TIDEGATE_TOPICS_PARTITIONS": "1",
        "TIDEGATE_TOPICS_REPLY_PARTITIONS": "1",
        "TIDEGATE_TOPICS_DLQ_PARTITIONS": "1",
    }
    built = Broker(env, var, port)
    try:
        built.stack("up")
        yield built
    finally:
        pid = None
        with contextlib.suppress(OSError, ValueError):
            pid = built.pid()
        subprocess.run([*STACK, "down"], env=env, capture_output=True, timeout=60, check=False)
        if pid is not None and alive(pid):
            os.kill(pid, signal.SIGKILL)
        shutil.rmtree(var, ignore_errors=True)
