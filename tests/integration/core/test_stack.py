"""The local stack scripts, for real: the main stack (`make up`) and a second one on other ports.

The second stack lives in a temp folder on free ports and is torn down by the test; the main
stack's processes must survive all of it.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import httpx
import psycopg
import pytest
import redis
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AdminClient,
    ConfigResource,
    ResourceType,
)

from tests.stack_support import STACK, own_stack
from tests.support import alive, free_ports, wait_for
from tidegate.core.settings import (
    PostgresSettings,
    RedisSettings,
    SchemaRegistrySettings,
    TopicSettings,
)

REPO = Path(__file__).resolve().parents[3]
MAIN_VAR = Path(os.environ.get("TIDEGATE_STACK_VAR", REPO / "var"))
ALL_SERVERS = ("kafka", "registry", "postgres", "redis")
JVM_MARK = "-Dtidegate.stack.test=second"


def services(env: dict[str, str] | os._Environ[str]) -> list[str]:
    listed = env.get("TIDEGATE_STACK_SERVICES", ",".join(ALL_SERVERS))
    return [s for s in ALL_SERVERS if s in listed.split(",")]


def stack(
    command: str, env: dict[str, str] | None = None, timeout: float = 150
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*STACK, command], env=env, capture_output=True, text=True, timeout=timeout, check=False
    )


def pids(var: Path) -> dict[str, int]:
    return {p.stem: int(p.read_text().split()[0]) for p in (var / "run").glob("*.pid")}


def port_open(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(1)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def port_closed(port: int) -> bool:
    return not port_open(port)


# ---- the main stack ------------------------------------------------------------------------------


def test_up_again_is_idempotent() -> None:
    before = pids(MAIN_VAR)
    assert set(services(os.environ)) <= set(before), f"PID files: {sorted(before)}"
    result = stack("up")
    assert result.returncode == 0, result.stderr
    for server in services(os.environ):
        assert f"{server}: already running (pid {before[server]})" in result.stdout
    assert "created" not in result.stdout  # every topic kept
    assert pids(MAIN_VAR) == before


def test_status_lists_every_server_and_topic() -> None:
    result = stack("status")
    assert result.returncode == 0, result.stdout + result.stderr
    for server in services(os.environ):
        assert re.search(rf"^{server}\s+up\s+\d+", result.stdout, re.M), result.stdout
    topics = TopicSettings()
    for name in (topics.requests, topics.results, topics.failed, topics.poison, topics.lifecycle):
        assert name in result.stdout
    row = next(line for line in result.stdout.splitlines() if f" {topics.requests} " in line)
    assert re.search(rf"\b{topics.partitions}\b", row), row


def test_brokers_are_listed(admin: AdminClient) -> None:
    assert admin.list_topics(timeout=10).brokers


def test_postgres_has_the_tidegate_database_and_migrations() -> None:
    with psycopg.connect(PostgresSettings().conninfo(), connect_timeout=5) as conn:
        owner = conn.execute(
            "SELECT pg_get_userbyid(datdba) FROM pg_database WHERE datname = 'tidegate'"
        ).fetchone()
        assert owner == ("tidegate",)
        tables = conn.execute(
            "SELECT to_regclass('_yoyo_migration') IS NOT NULL,"
            " to_regclass('tidegate_meta') IS NOT NULL"
        ).fetchone()
        assert tables == (True, True)
        version = conn.execute(
            "SELECT value FROM tidegate_meta WHERE key = 'schema_version'"
        ).fetchone()
        assert version is not None
        assert int(version[0]) >= 1


def command_line(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")


def test_redis_pings() -> None:
    client = redis.Redis.from_url(RedisSettings().url, socket_timeout=5)
    try:
        assert client.ping() is True
    finally:
        client.close()


def test_model_lifecycle_keeps_full_history(admin: AdminClient) -> None:
    resource = ConfigResource(ResourceType.TOPIC, TopicSettings().lifecycle)
    configs = admin.describe_configs([resource])[resource].result(timeout=15)
    assert configs["cleanup.policy"].value == "delete"
    assert configs["retention.ms"].value == "-1"
    assert configs["retention.bytes"].value == "-1"


def test_check_fails_clearly_when_a_server_is_down() -> None:
    (closed,) = free_ports(1)
    env = {**os.environ, "TIDEGATE_REDIS_URL": f"redis://127.0.0.1:{closed}/0"}
    tidegate = Path(os.environ.get("TIDEGATE_STACK_VENV", REPO / ".venv")) / "bin" / "tidegate"
    result = subprocess.run(
        [str(tidegate), "stack", "check", "redis"],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 1
    assert "redis: NOT healthy" in result.stderr


# ---- a second, separate stack --------------------------------------------------------------------


@pytest.fixture
def second_stack() -> Iterator[tuple[dict[str, str], Path, dict[str, int]]]:
    # Every server of the main stack, the registry included: a stack without it is not the one
    # `make up` runs, and a registry that cannot start must fail this test, not leave it out.
    servers = ["kafka", "postgres", "redis", "registry"]
    extra = {
        "TIDEGATE_STACK_SERVICES": ",".join(servers),
        "TIDEGATE_STACK_KAFKA_HEAP": "512m",
        "TIDEGATE_STACK_KAFKA_JVM_OPTS": f"{JVM_MARK} -XX:TieredStopAtLevel=1",
        "TIDEGATE_TOPICS_PARTITIONS": "4",
    }
    with own_stack("tidegate-stack-", extra) as own:
        yield own.env, own.var, own.ports


# Three `stack.sh` runs of up to 150 s each: more than the default.
@pytest.mark.timeout(600)
def test_a_second_stack_runs_beside_the_main_one(
    second_stack: tuple[dict[str, str], Path, dict[str, int]],
) -> None:
    env, var, ports = second_stack
    main_pids = pids(MAIN_VAR)
    assert main_pids, "the main stack is not running: run `make up` first"
    assert all(alive(p) for p in main_pids.values())

    first = stack("up", env)
    assert first.returncode == 0, first.stdout + first.stderr
    started = pids(var)
    assert set(started) == set(services(env)), first.stdout
    # Every extra JVM option reaches the broker, after the defaults, so an option given twice
    # is the caller's (HotSpot takes the last).
    broker = command_line(started["kafka"])
    assert broker.index(JVM_MARK) > broker.index("-XX:+UseG1GC")
    assert broker.index("-XX:TieredStopAtLevel=1") > broker.index("-XX:+UseG1GC")
    assert not set(started.values()) & set(main_pids.values())

    again = stack("up", env)
    assert again.returncode == 0, again.stdout + again.stderr
    for server, pid in started.items():
        assert f"{server}: already running (pid {pid})" in again.stdout
    assert pids(var) == started

    status = stack("status", env)
    assert status.returncode == 0, status.stdout + status.stderr
    row = next(line for line in status.stdout.splitlines() if " inference-requests " in line)
    assert re.search(r"\b4\b", row), row  # TIDEGATE_TOPICS_PARTITIONS reached the topics step
    assert f"127.0.0.1:{ports['kafka']}" in status.stdout
    # This stack's own registry answers on its own port, to the key this stack made for it.
    url = f"http://127.0.0.1:{ports['registry']}"
    assert httpx.get(f"{url}/subjects", timeout=10).status_code == 401
    own = SchemaRegistrySettings(url=url, local_credentials=var / "registry" / "client.env")
    assert own.basic_auth_user is not None
    assert own.basic_auth_password is not None
    auth = (own.basic_auth_user, own.basic_auth_password.get_secret_value())
    subjects = httpx.get(f"{url}/subjects", timeout=10, auth=auth)
    assert subjects.status_code == 200, subjects.text

    down = stack("down", env)
    assert down.returncode == 0, down.stdout + down.stderr
    for server, pid in started.items():
        assert not alive(pid), f"{server} (pid {pid}) survived down"
    for name, port in ports.items():
        wait_for(partial(port_closed, port), timeout=10, what=f"{name} port {port} closed")
    assert not list((var / "run").glob("*.pid"))
    assert all(alive(p) for p in main_pids.values()), "the main stack lost a process"
    assert pids(MAIN_VAR) == main_pids
